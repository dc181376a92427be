// The inputs of fattn::decode: validated once, for CUDA and CPU alike.
#pragma once

#include <optional>
#include <utility>

#include "common/tensor_checks.h"

namespace fattn {

constexpr int64_t kMaxDecodeQueries = 16;  // query tokens per sequence (speculative decoding)
constexpr int64_t kMaxDecodeSplits = 256;

struct DecodeShape {
  int64_t batch, seqlen_q, heads, kv_heads, head_dim;
  int64_t capacity;     // keys a sequence can hold: cache seqlen, or pages_per_seq * page_size
  int64_t seqlen_new;   // tokens appended by this call (0 without k/v)
  bool paged;
  int64_t page_size;    // paged: tokens per page; contiguous: capacity
  int64_t num_pages;    // paged: pages in the cache; contiguous: batch
  int64_t pages_per_seq;
  // The effective window (flash-attn's convention: causal is (left, 0)); -1 is unbounded.
  int64_t window_left, window_right;
  int64_t group() const { return heads / kv_heads; }
  // Where key j of sequence b lives: (page, slot) through the block table, or (b, j).
  std::pair<int64_t, int64_t> key_location(const int32_t* table, int64_t b, int64_t j) const {
    if (!paged) return {b, j};
    return {table[b * pages_per_seq + j / page_size], j % page_size};
  }
};

// Checks everything that can be checked from shapes, dtypes and devices (no device
// values): throws std::runtime_error naming the argument and the expectation.
DecodeShape check_decode_inputs(const char* op, const Tensor& q,
                                const Tensor& k_cache, const Tensor& v_cache,
                                const std::optional<Tensor>& k,
                                const std::optional<Tensor>& v,
                                const std::optional<Tensor>& cache_seqlens,
                                const std::optional<Tensor>& block_table,
                                std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                int64_t window_right, double softcap, int64_t num_splits,
                                const std::optional<Tensor>& alibi_slopes, const std::optional<Tensor>& sinks);

// The CPU-only checks of device values: cache_seqlens in [0, capacity - seqlen_new] and the
// block_table entries of the pages each sequence uses in [0, num_pages). `seqlens` and `table`
// point to contiguous int32 data ([batch] and [batch, pages_per_seq]); either may be null.
void check_decode_values(const char* op, const DecodeShape& s, const int32_t* seqlens, const int32_t* table);

}  // namespace fattn
