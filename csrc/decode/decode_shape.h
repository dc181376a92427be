// The inputs of fattn::decode: validated once, for CUDA and CPU alike.
#pragma once

#include <optional>
#include <utility>

#include "common/tensor_checks.h"

namespace fattn {

constexpr int64_t kMaxDecodeSplits = 256;
// Query tokens per sequence up to which the narrow (decoding) row tile is used; longer query
// chunks (chunked prefill) take the wide one. Both read the same cache the same way.
constexpr int64_t kDecodeQueriesPerNarrowTile = 16;

struct DecodeShape {
  int64_t batch, seqlen_q, heads, kv_heads, head_dim;
  int64_t capacity;     // keys a sequence can hold: cache seqlen, or pages_per_seq * page_size
  int64_t seqlen_new;   // tokens appended by this call (0 without k/v)
  bool paged;
  int64_t page_size;    // paged: tokens per page; contiguous: capacity
  int64_t num_pages;    // paged: pages in the cache; contiguous: the cache's rows (k_cache.size(0))
  int64_t pages_per_seq;
  bool batch_idx;       // cache_batch_idx given: sequence b uses cache row cache_batch_idx[b]
  bool leftpad;         // cache_leftpad given: keys before cache_leftpad[b] are not attended to
  // The caches' FP8 format as the kernels' KV_FP8 flag (fp8_flag: 0 for a cache in q's dtype, 1
  // e4m3fn, 2 e5m2). An FP8 cache value stands for x_fp8 * descale[b, kv_head] (k_descale,
  // v_descale: float32 [batch, kv_heads], 1 where not given), the new tokens being quantized.
  int64_t kv_fp8;
  // Rotary embedding (rotary_cos/sin [seqlen_ro, rotary_dim / 2]); rotary_dim 0 means none.
  int64_t rotary_dim, seqlen_ro;
  bool rotary_interleaved;
  // Query t of sequence b is rotated at position cache_seqlens[b] + t when the mask is causal or
  // local, else at cache_seqlens[b] for every t (flash-attn's rule); new key i at cache_seqlens[b] + i.
  bool rotary_per_token;
  // The effective window (flash-attn's convention: causal is (left, 0)); -1 is unbounded.
  int64_t window_left, window_right;
  int64_t group() const { return heads / kv_heads; }
  // Where key j of sequence b lives: (page, slot) through the block table, or (cache row, j)
  // with the row cache_batch_idx[b] (b without it).
  std::pair<int64_t, int64_t> key_location(const int32_t* table, const int32_t* batch_idx, int64_t b,
                                           int64_t j) const {
    if (!paged) return {batch_idx != nullptr ? batch_idx[b] : b, j};
    return {table[b * pages_per_seq + j / page_size], j % page_size};
  }
  // The rotary position of query t of a sequence whose cache held `cached` keys before the append.
  int64_t query_position(int64_t cached, int64_t t) const { return cached + (rotary_per_token ? t : 0); }
};

// fattn::decode's arguments as its entry (decode/decode_op.cpp) receives them, in the schema's
// order, for the checks and both implementations to share.
struct DecodeInputs {
  Tensor q, k_cache, v_cache;
  std::optional<Tensor> k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table;
  std::optional<double> softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap;
  bool rotary_interleaved;
  std::optional<Tensor> alibi_slopes;
  int64_t num_splits;
  std::optional<Tensor> sinks, k_descale, v_descale;
};

// Checks everything that can be checked from shapes, dtypes and devices (no device
// values): throws std::runtime_error naming the argument and the expectation.
DecodeShape check_decode_inputs(const char* op, const DecodeInputs& in);

// The device values, as contiguous int32 data on the host (any may be null when not given).
struct DecodeIndices {
  const int32_t* seqlens;    // [batch]
  const int32_t* batch_idx;  // [batch]
  const int32_t* leftpad;    // [batch]
  const int32_t* table;      // [batch, pages_per_seq]
};

// The CPU-only checks of device values (CUDA leaves them unchecked: reading them would be a
// host sync, done only with FATTN_DEBUG_CHECKS=1): cache_seqlens in [0, capacity - seqlen_new]
// (paged: capacity is block_table's columns x page_size); block_table entries of the pages each
// sequence uses in [0, num_pages), and, when appending, no page a sequence appends into used by
// another sequence; cache_batch_idx in [0, k_cache.size(0)) and distinct when appending;
// cache_leftpad in [0, capacity]; rotary positions inside rotary_cos.
void check_decode_values(const char* op, const DecodeShape& s, const DecodeIndices& ix);

// cache_seqlens, cache_batch_idx, cache_leftpad and block_table as check_decode_values and the
// CPU implementation read them: contiguous, on the host (copied there from a GPU: a host sync).
struct HostDecodeIndices {
  Tensor held[4];  // the host tensors `indices` points into
  DecodeIndices indices;
};
HostDecodeIndices host_decode_indices(const DecodeInputs& in);

}  // namespace fattn
