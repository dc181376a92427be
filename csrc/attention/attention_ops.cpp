// fattn::forward, fattn::backward, fattn::varlen_forward and fattn::varlen_backward: each op's
// arguments in the order of its schema (csrc/register.cpp), checked once for CUDA and CPU alike,
// then handed to the implementation of the inputs' device (attention/attention_impl.h).
// Registered here for both dispatch keys.
//
// The variant arguments (window_left, window_right, softcap, alibi_slopes) and alibi_offset are
// attention/attention_variant.h's; bias (attention/bias.h), q_segment_ids and kv_segment_ids take
// the dense layout only; dropout (attention/dropout.h) needs dropout_seed when dropout_p > 0, and
// the backward the same seed and dropout_p. alibi_offset shifts the query positions in ALiBi's
// distance for callers that compute one sequence in pieces (ring attention); 0 otherwise.
#include <torch/csrc/stable/library.h>

#include "attention/attention_impl.h"
#include "runtime/host_exception.h"

namespace fattn {
namespace {

// out [batch, seqlen_q, heads, head_dim] (contiguous, q's dtype) and lse [batch, heads, seqlen_q]
// (natural log, -inf for empty rows; lse_dtype of q). `deterministic` is not used by the forward:
// autograd saves it for the backward. `sinks` (float32 [heads], optional) is a forward argument
// only: the backward sees it through lse. float8 q, k, v come with optional float32 descales
// [batch, kv_heads] (attention/fp8_inputs.h); out is then bfloat16.
std::tuple<Tensor, Tensor> forward(Tensor q, Tensor k, Tensor v, std::optional<double> softmax_scale, bool causal,
                                   bool deterministic, int64_t window_left, int64_t window_right, double softcap,
                                   std::optional<Tensor> alibi_slopes, std::optional<Tensor> q_segment_ids,
                                   std::optional<Tensor> kv_segment_ids, std::optional<Tensor> sinks,
                                   std::optional<Tensor> bias, double dropout_p, std::optional<Tensor> dropout_seed,
                                   int64_t alibi_offset, std::optional<Tensor> q_descale,
                                   std::optional<Tensor> k_descale, std::optional<Tensor> v_descale) {
  (void)deterministic;  // a backward setting, saved by autograd
  constexpr const char* op = "fattn.forward";
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale, /*fp8_allowed=*/true);
  AttentionVariant variant = check_attention_variant(op, s, q, causal, window_left, window_right, softcap,
                                                     alibi_slopes, q_segment_ids, kv_segment_ids);
  add_alibi_offset(op, variant, s, alibi_offset);
  check_sinks(op, sinks, q, s.heads);
  add_bias_and_dropout(op, variant, s, q, bias, dropout_p, dropout_seed);
  const Fp8Inputs fp8 = check_fp8_inputs(op, s, q, variant, q_descale, k_descale, v_descale);
  if (q.is_cpu()) return forward_on_cpu(op, s, variant, softmax_scale, q, k, v, sinks, fp8);
  return launch_forward(op, s, variant, softmax_scale, q, k, v, sinks, fp8);
}

// (dq, dk, dv, dbias); dq, dk, dv contiguous, in the inputs' dtype and shapes. `dlse` is the
// gradient flowing into the forward's lse (optional). dbias, with bias_grad, is d loss / d bias
// before any broadcast: [batch, heads, seqlen_q, seqlen_k] in lse's dtype (the caller sums the
// bias's broadcast dims); without, an empty [0] tensor. deterministic = false lets the CUDA
// backward add dQ up in an order that varies between runs (attention/backward_cuda.cpp); the CPU's
// is always ordered.
std::tuple<Tensor, Tensor, Tensor, Tensor> backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                                                    std::optional<Tensor> dlse, std::optional<double> softmax_scale,
                                                    bool causal, bool deterministic, int64_t window_left,
                                                    int64_t window_right, double softcap,
                                                    std::optional<Tensor> alibi_slopes,
                                                    std::optional<Tensor> q_segment_ids,
                                                    std::optional<Tensor> kv_segment_ids, std::optional<Tensor> bias,
                                                    bool bias_grad, double dropout_p,
                                                    std::optional<Tensor> dropout_seed, int64_t alibi_offset) {
  constexpr const char* op = "fattn.backward";
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale);
  check_backward_inputs(op, s, q, dout, out, lse, dlse);
  AttentionVariant variant = check_attention_variant(op, s, q, causal, window_left, window_right, softcap,
                                                     alibi_slopes, q_segment_ids, kv_segment_ids);
  add_alibi_offset(op, variant, s, alibi_offset);
  add_bias_and_dropout(op, variant, s, q, bias, dropout_p, dropout_seed);
  check_bias_grad(op, bias, bias_grad);
  if (q.is_cpu()) return backward_on_cpu(op, s, variant, softmax_scale, dout, q, k, v, out, lse, dlse, bias_grad);
  return launch_backward(op, s, variant, softmax_scale, dout, q, k, v, out, lse, dlse, bias_grad, deterministic);
}

// The forward over packed sequences: q [total_q, heads, head_dim], k/v [total_k, kv_heads,
// head_dim], sequence b at rows [cu_seqlens[b], cu_seqlens[b + 1]) (its first seqused_k[b] keys
// when given). out is shaped like q, lse [heads, total_q]; rows outside every sequence get out 0
// and lse 0. The offsets' values are checked by the CPU implementation only: on CUDA reading
// them would stall the stream.
std::tuple<Tensor, Tensor> varlen_forward(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                                          int64_t max_seqlen_q, int64_t max_seqlen_k,
                                          std::optional<Tensor> seqused_k, std::optional<double> softmax_scale,
                                          bool causal, bool deterministic, int64_t window_left,
                                          int64_t window_right, double softcap, std::optional<Tensor> alibi_slopes,
                                          std::optional<Tensor> sinks, double dropout_p,
                                          std::optional<Tensor> dropout_seed, std::optional<Tensor> q_descale,
                                          std::optional<Tensor> k_descale, std::optional<Tensor> v_descale) {
  (void)deterministic;
  constexpr const char* op = "fattn.varlen_forward";
  const AttentionShape s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               seqused_k, softmax_scale, /*fp8_allowed=*/true);
  AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  check_sinks(op, sinks, q, s.heads);
  add_bias_and_dropout(op, variant, s, q, std::nullopt, dropout_p, dropout_seed);
  const Fp8Inputs fp8 = check_fp8_inputs(op, s, q, variant, q_descale, k_descale, v_descale);
  if (q.is_cpu()) {
    return forward_on_cpu(op, s, variant, softmax_scale, q, k, v, sinks, fp8, cu_seqlens_q, cu_seqlens_k, seqused_k);
  }
  return launch_forward(op, s, variant, softmax_scale, q, k, v, sinks, fp8, cu_seqlens_q, cu_seqlens_k, seqused_k);
}

// (dq, dk, dv) of varlen_forward, shaped like q, k, v.
std::tuple<Tensor, Tensor, Tensor> varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,
                                                   std::optional<Tensor> dlse, Tensor cu_seqlens_q,
                                                   Tensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                                   std::optional<Tensor> seqused_k,
                                                   std::optional<double> softmax_scale, bool causal,
                                                   bool deterministic, int64_t window_left, int64_t window_right,
                                                   double softcap, std::optional<Tensor> alibi_slopes,
                                                   double dropout_p, std::optional<Tensor> dropout_seed) {
  constexpr const char* op = "fattn.varlen_backward";
  const AttentionShape s = check_varlen_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               seqused_k, softmax_scale);
  check_backward_inputs(op, s, q, dout, out, lse, dlse);
  AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  add_bias_and_dropout(op, variant, s, q, std::nullopt, dropout_p, dropout_seed);
  auto [dq, dk, dv, dbias] =
      q.is_cpu() ? backward_on_cpu(op, s, variant, softmax_scale, dout, q, k, v, out, lse, dlse, false, cu_seqlens_q,
                                   cu_seqlens_k, seqused_k)
                 : launch_backward(op, s, variant, softmax_scale, dout, q, k, v, out, lse, dlse, false,
                                   deterministic, cu_seqlens_q, cu_seqlens_k, seqused_k);
  return {dq, dk, dv};
}

}  // namespace
}  // namespace fattn

STABLE_TORCH_LIBRARY_IMPL(fattn, CUDA, m) {
  m.impl("forward", FATTN_BOX(&fattn::forward));
  m.impl("backward", FATTN_BOX(&fattn::backward));
  m.impl("varlen_forward", FATTN_BOX(&fattn::varlen_forward));
  m.impl("varlen_backward", FATTN_BOX(&fattn::varlen_backward));
}

STABLE_TORCH_LIBRARY_IMPL(fattn, CPU, m) {
  m.impl("forward", FATTN_BOX(&fattn::forward));
  m.impl("backward", FATTN_BOX(&fattn::backward));
  m.impl("varlen_forward", FATTN_BOX(&fattn::varlen_forward));
  m.impl("varlen_backward", FATTN_BOX(&fattn::varlen_backward));
}
