// fattn for C++ LibTorch programs: typed calls to the torch.ops.fattn operators.
//
// Link libfattn.so (CMake: find_package(fattn) + target_link_libraries(app fattn::fattn)).
// The operators are registered by libfattn.so's static initializers when it loads; the
// program never calls into it directly, only through the dispatcher. So that a linker run
// with --as-needed (the default on Ubuntu) does not drop it, this header refers to a
// function the library exports, which keeps libfattn.so a dependency of every program
// that calls fattn::forward or fattn::decode.
//
// Layout (the flash-attn convention): q, k, v are [batch, seqlen, heads, head_dim], any
// strides with a contiguous last dim; k and v may have fewer heads than q (GQA/MQA, q's
// heads a multiple of theirs). CUDA takes float16/bfloat16; CPU also float32/float64.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

// Defined by libfattn.so (csrc/runtime/build_info.cpp): the kernel table as JSON.
extern "C" const char* fattn_build_info_json();

namespace fattn {

namespace detail {
// Reading a volatile pointer to a libfattn.so function is a reference the compiler
// cannot drop, and costs one load per call.
inline void keep_library_linked() {
  static const char* (*volatile const anchor)() = &fattn_build_info_json;
  (void)anchor;
}
}  // namespace detail

// Attention of q over k, v: softmax(q k^T * softmax_scale) v per head.
// Returns (out, lse): out [batch, seqlen_q, heads, head_dim] in q's dtype, lse float32
// [batch, heads, seqlen_q] (natural log of the softmax denominator, -inf for a row that
// attends to nothing). softmax_scale defaults to 1/sqrt(head_dim). Masks are aligned to the
// bottom-right corner: query i sees key j iff i + d - window_left <= j <= i + d + window_right,
// d = seqlen_k - seqlen_q, a side < 0 being unbounded; causal forces window_right = 0, so a
// decode step's single query sees the whole cache. softcap > 0 maps a score s to
// softcap * tanh(s / softcap); alibi_slopes (float32 [heads] or [batch, heads]) then adds
// -slope * |i + d - j|. q_segment_ids int32 [batch, seqlen_q] and kv_segment_ids [batch,
// seqlen_k] (both or neither) restrict query i to keys of its own segment (packing several
// documents into one row). sinks (float32 [heads]) adds one logit per head to every row's
// softmax denominator, carrying no value (gpt-oss); a row that sees no key then has lse = sink.
// bias ([batch or 1, heads or 1, seqlen_q or 1, seqlen_k] in q's dtype, keys contiguous) is
// added to the scores after the softcap and ALiBi; -inf hides a key.
// q, k and v may be float8_e4m3fn or float8_e5m2 (all three the same; sm_89 and sm_90, and the
// CPU) standing for their values times q_descale, k_descale, v_descale (float32 [batch, kv_heads],
// q_descale also [batch, heads]; absent means 1): out is then bfloat16, and neither bias nor
// segment ids may be given.
// Inference only: autograd for the operator is registered by the Python package, and dropout
// (a training feature) is left off.
inline std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v,
                                                  std::optional<double> softmax_scale = std::nullopt,
                                                  bool causal = false, int64_t window_left = -1,
                                                  int64_t window_right = -1, double softcap = 0.0,
                                                  const std::optional<at::Tensor>& alibi_slopes = std::nullopt,
                                                  const std::optional<at::Tensor>& q_segment_ids = std::nullopt,
                                                  const std::optional<at::Tensor>& kv_segment_ids = std::nullopt,
                                                  const std::optional<at::Tensor>& sinks = std::nullopt,
                                                  const std::optional<at::Tensor>& bias = std::nullopt,
                                                  const std::optional<at::Tensor>& q_descale = std::nullopt,
                                                  const std::optional<at::Tensor>& k_descale = std::nullopt,
                                                  const std::optional<at::Tensor>& v_descale = std::nullopt) {
  detail::keep_library_linked();
  // Schema: forward(Tensor q, Tensor k, Tensor v, float? softmax_scale=None,
  //                 bool causal=False, bool deterministic=False, int window_left=-1,
  //                 int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None,
  //                 Tensor? q_segment_ids=None, Tensor? kv_segment_ids=None, Tensor? sinks=None,
  //                 Tensor? bias=None, float dropout_p=0.0, Tensor? dropout_seed=None,
  //                 int alibi_offset=0, Tensor? q_descale=None, Tensor? k_descale=None,
  //                 Tensor? v_descale=None) -> (Tensor out, Tensor lse)
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fattn::forward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, std::optional<double>,
                                                    bool, bool, int64_t, int64_t, double,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&, double,
                                                    const std::optional<at::Tensor>&, int64_t,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&,
                                                    const std::optional<at::Tensor>&)>();
  // `deterministic` only matters to the backward, which C++ callers do not run; alibi_offset
  // serves callers that split one sequence into pieces (ring attention).
  return op.call(q, k, v, softmax_scale, causal, /*deterministic=*/false, window_left, window_right,
                 softcap, alibi_slopes, q_segment_ids, kv_segment_ids, sinks, bias, /*dropout_p=*/0.0,
                 /*dropout_seed=*/std::nullopt, /*alibi_offset=*/0, q_descale, k_descale, v_descale);
}

// Attention over a KV cache (flash-attn's flash_attn_with_kvcache, in its argument order):
// flash decoding for a few new query tokens, a prefill-sized tile for longer query chunks
// (chunked prefill), optionally appending the new tokens' k, v to the cache first. Returns
// (out, lse) as forward does: out [batch, seqlen_q, heads, head_dim] in q's dtype, lse float32
// [batch, heads, seqlen_q] (float64 for float64 inputs).
//
// The cache is either contiguous, k_cache/v_cache [batch_cache, capacity, kv_heads, head_dim]
// (batch_cache = batch, or any number of rows picked by cache_batch_idx int32 [batch]), or
// paged: k_cache/v_cache [num_pages, page_size, kv_heads, head_dim] (page_size a multiple of
// 16) with block_table int32 [batch, pages_per_seq], key j of sequence b living at
// k_cache[block_table[b, j / page_size], j % page_size]. Caches may be strided views.
// cache_seqlens int32 [batch] counts the keys already in each sequence's cache (nullopt: the
// whole capacity, and then no k/v); cache_leftpad int32 [batch] hides the keys before it.
//
// MUTATES k_cache and v_cache when k, v ([batch, seqlen_new, kv_heads, head_dim], q's dtype)
// are given: they are written in place at positions cache_seqlens[b] + i, then attended to, so
// sequence b has cache_seqlens[b] + seqlen_new keys. cache_seqlens itself is NOT advanced: the
// caller adds seqlen_new after the call. Sequences that append need cache rows and pages of
// their own where the new tokens go: pages shared for reading (a common prefix) are fine, a
// page one sequence appends into and another uses is not. rotary_cos/rotary_sin [seqlen_ro >=
// capacity, rotary_dim / 2] (q's dtype) rotate the new keys at their positions and q at
// cache_seqlens[b] (+ t when causal or windowed), pairs (2i, 2i+1) if rotary_interleaved, else
// (i, i + rotary_dim / 2). Masks are aligned bottom-right as in forward; causal forces
// window_right = 0; window_left/right < 0 mean unbounded; softcap > 0 applies softcap *
// tanh(score / softcap); alibi_slopes then adds -slope * |t + d - j| as in forward; sinks
// (float32 [heads]) join every row's denominator as in forward. num_splits: 0 picks the split-K
// count on CUDA, n forces it (same result within rounding); CPU ignores it. On CUDA the device
// values are not checked (it needs a host sync; FATTN_DEBUG_CHECKS=1 does it): an append past
// the capacity is dropped and the sequence clamped to capacity (paged: block_table's columns x
// page_size), and a page one sequence appends into is read or written by any other that uses it
// too. The CPU implementation checks them all.
//
// FP8 KV cache: k_cache and v_cache may both be float8_e4m3fn or both float8_e5m2 (q, k, v stay
// float16/bfloat16; CUDA needs sm_89 or sm_90). A cache value stands for x_fp8 * descale[b, h]
// with k_descale / v_descale float32 [batch, kv_heads] (indexed by the sequence b, not its cache
// row; nullopt means 1), and appended tokens are stored quantized: x / descale rounded to
// nearest even, saturated to the format's largest finite value (after the rotary embedding).
inline std::tuple<at::Tensor, at::Tensor> decode(const at::Tensor& q, const at::Tensor& k_cache,
                                                 const at::Tensor& v_cache,
                                                 const std::optional<at::Tensor>& k = std::nullopt,
                                                 const std::optional<at::Tensor>& v = std::nullopt,
                                                 const std::optional<at::Tensor>& rotary_cos = std::nullopt,
                                                 const std::optional<at::Tensor>& rotary_sin = std::nullopt,
                                                 const std::optional<at::Tensor>& cache_seqlens = std::nullopt,
                                                 const std::optional<at::Tensor>& cache_batch_idx = std::nullopt,
                                                 const std::optional<at::Tensor>& cache_leftpad = std::nullopt,
                                                 const std::optional<at::Tensor>& block_table = std::nullopt,
                                                 std::optional<double> softmax_scale = std::nullopt,
                                                 bool causal = false, int64_t window_left = -1,
                                                 int64_t window_right = -1, double softcap = 0.0,
                                                 bool rotary_interleaved = true,
                                                 const std::optional<at::Tensor>& alibi_slopes = std::nullopt,
                                                 int64_t num_splits = 0,
                                                 const std::optional<at::Tensor>& sinks = std::nullopt,
                                                 const std::optional<at::Tensor>& k_descale = std::nullopt,
                                                 const std::optional<at::Tensor>& v_descale = std::nullopt) {
  detail::keep_library_linked();
  // Schema: decode(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None,
  //                Tensor? v=None, Tensor? rotary_cos=None, Tensor? rotary_sin=None,
  //                Tensor? cache_seqlens=None, Tensor? cache_batch_idx=None,
  //                Tensor? cache_leftpad=None, Tensor? block_table=None,
  //                float? softmax_scale=None, bool causal=False, int window_left=-1,
  //                int window_right=-1, float softcap=0.0, bool rotary_interleaved=True,
  //                Tensor? alibi_slopes=None, int num_splits=0, Tensor? sinks=None,
  //                Tensor? k_descale=None, Tensor? v_descale=None) -> (Tensor out, Tensor lse)
  // The mutable Tensor(a!) arguments are at::Tensor& in the typed signature, as in ATen's
  // generated operators. A const at::Tensor& is taken here so that views (cache slices) can
  // be passed; the handle is not reseated, only the storage it points to is written, the
  // same as at::Tensor::add_ being a const method. The kernels are registered boxed (stable
  // ABI), so the dispatcher holds no C++ signature to check this one against: a mismatch does
  // not throw at typed<>() (an `int` for an `int64_t` passes); tests/test_cpp_header.py checks
  // it against the registered schema.
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fattn::decode", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              const at::Tensor&, at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, std::optional<double>, bool, int64_t, int64_t, double, bool,
              const std::optional<at::Tensor>&, int64_t, const std::optional<at::Tensor>&,
              const std::optional<at::Tensor>&, const std::optional<at::Tensor>&)>();
  return op.call(q, const_cast<at::Tensor&>(k_cache), const_cast<at::Tensor&>(v_cache), k, v, rotary_cos,
                 rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                 window_left, window_right, softcap, rotary_interleaved, alibi_slopes, num_splits, sinks,
                 k_descale, v_descale);
}

}  // namespace fattn
