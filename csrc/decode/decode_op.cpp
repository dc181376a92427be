// fattn::decode: attention of a sequence's new query tokens over its (paged) KV cache, after
// appending the optional new tokens k/v in place at cache_seqlens (rotated first when
// rotary_cos/sin are given); flash-attn's flash_attn_with_kvcache order. Returns out [batch,
// seqlen_q, heads, head_dim] (q's dtype) and lse [batch, heads, seqlen_q]. With an FP8 cache
// (float8_e4m3fn or float8_e5m2, both caches alike) k_descale and v_descale (float32 [batch,
// kv_heads], optional) say what its values stand for (decode/decode_shape.h).
//
// The arguments are checked once, then handed to the implementation of q's device
// (decode/decode_impl.h). Registered here for both dispatch keys; the schema is in
// csrc/register.cpp.
#include <torch/csrc/stable/library.h>

#include "decode/decode_impl.h"
#include "runtime/host_exception.h"

namespace fattn {
namespace {

std::tuple<Tensor, Tensor> decode(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                                  std::optional<Tensor> v, std::optional<Tensor> rotary_cos,
                                  std::optional<Tensor> rotary_sin, std::optional<Tensor> cache_seqlens,
                                  std::optional<Tensor> cache_batch_idx, std::optional<Tensor> cache_leftpad,
                                  std::optional<Tensor> block_table, std::optional<double> softmax_scale, bool causal,
                                  int64_t window_left, int64_t window_right, double softcap, bool rotary_interleaved,
                                  std::optional<Tensor> alibi_slopes, int64_t num_splits, std::optional<Tensor> sinks,
                                  std::optional<Tensor> k_descale, std::optional<Tensor> v_descale) {
  const DecodeInputs in{
      .q = q, .k_cache = k_cache, .v_cache = v_cache, .k = k, .v = v, .rotary_cos = rotary_cos,
      .rotary_sin = rotary_sin, .cache_seqlens = cache_seqlens, .cache_batch_idx = cache_batch_idx,
      .cache_leftpad = cache_leftpad, .block_table = block_table, .softmax_scale = softmax_scale, .causal = causal,
      .window_left = window_left, .window_right = window_right, .softcap = softcap,
      .rotary_interleaved = rotary_interleaved, .alibi_slopes = alibi_slopes, .num_splits = num_splits,
      .sinks = sinks, .k_descale = k_descale, .v_descale = v_descale};
  const DecodeShape s = check_decode_inputs("fattn.decode", in);
  if (q.is_cpu()) return decode_on_cpu(s, in);
  return launch_decode(s, in);
}

}  // namespace
}  // namespace fattn

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("decode", FATTN_BOX(&fattn::decode));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("decode", FATTN_BOX(&fattn::decode));
}
