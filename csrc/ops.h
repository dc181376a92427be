// The operators' implementations, one (CUDA, CPU) pair per operator; schemas in register.cpp.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <tuple>

namespace fattn {

using torch::stable::Tensor;

// The variant arguments forward and backward share (attention/attention_variant.h says
// what they mean); segment ids take the dense layout only.
#define FATTN_VARIANT_ARGS int64_t window_left, int64_t window_right, double softcap, \
                           std::optional<Tensor> alibi_slopes

// fattn::forward: out [batch, seqlen_q, heads, head_dim] (contiguous, q's dtype) and lse
// [batch, heads, seqlen_q] (natural log, -inf for empty rows; lse_dtype of q).
// `deterministic` is not used by the forward; autograd saves it for the backward.
// `sinks` (float32 [heads], optional) is a forward argument only: the backward sees it through lse.
#define FATTN_SEGMENT_ARGS std::optional<Tensor> q_segment_ids, std::optional<Tensor> kv_segment_ids
// `bias` (attention/bias.h) takes the dense layout only; dropout (attention/dropout.h) needs
// `dropout_seed` when dropout_p > 0, and the backward the same seed and dropout_p.
#define FATTN_DROPOUT_ARGS double dropout_p, std::optional<Tensor> dropout_seed
// `alibi_offset` shifts the query positions in ALiBi's distance (attention/attention_variant.h),
// for callers that compute one sequence in pieces (ring attention); 0 otherwise.
// float8 q, k, v come with optional float32 descales [batch, kv_heads] (attention/fp8_inputs.h);
// out is then bfloat16.
#define FATTN_DESCALE_ARGS std::optional<Tensor> q_descale, std::optional<Tensor> k_descale, \
                           std::optional<Tensor> v_descale
#define FATTN_FORWARD_ARGS Tensor q, Tensor k, Tensor v, std::optional<double> softmax_scale, bool causal, \
                           bool deterministic, FATTN_VARIANT_ARGS, FATTN_SEGMENT_ARGS, std::optional<Tensor> sinks, \
                           std::optional<Tensor> bias, FATTN_DROPOUT_ARGS, int64_t alibi_offset, FATTN_DESCALE_ARGS
std::tuple<Tensor, Tensor> forward_cuda(FATTN_FORWARD_ARGS);
std::tuple<Tensor, Tensor> forward_cpu(FATTN_FORWARD_ARGS);

// fattn::backward: (dq, dk, dv, dbias); dq, dk, dv contiguous, in the inputs' dtype and shapes.
// `dlse` is the gradient flowing into the forward's lse (optional). dbias, with bias_grad, is
// d loss / d bias before any broadcast: [batch, heads, seqlen_q, seqlen_k] in lse's dtype (the
// caller sums the bias's broadcast dims); without, an empty [0] tensor. Every mode is
// deterministic today (no atomics); `deterministic` keeps the contract explicit.
#define FATTN_BACKWARD_ARGS Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, \
                            std::optional<Tensor> dlse, std::optional<double> softmax_scale, bool causal, \
                            bool deterministic, FATTN_VARIANT_ARGS, FATTN_SEGMENT_ARGS, std::optional<Tensor> bias, \
                            bool bias_grad, FATTN_DROPOUT_ARGS, int64_t alibi_offset
std::tuple<Tensor, Tensor, Tensor, Tensor> backward_cuda(FATTN_BACKWARD_ARGS);
std::tuple<Tensor, Tensor, Tensor, Tensor> backward_cpu(FATTN_BACKWARD_ARGS);

// fattn::varlen_forward / varlen_backward: the same over packed sequences, q [total_q,
// heads, head_dim], k/v [total_k, kv_heads, head_dim], sequence b at rows [cu_seqlens[b],
// cu_seqlens[b + 1]) (its first seqused_k[b] keys when given). out is shaped like q, lse
// [heads, total_q]; rows outside every sequence get out 0 and lse 0.
#define FATTN_VARLEN_ARGS Tensor cu_seqlens_q, Tensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, \
                          std::optional<Tensor> seqused_k
#define FATTN_VARLEN_FORWARD_ARGS Tensor q, Tensor k, Tensor v, FATTN_VARLEN_ARGS, \
                                  std::optional<double> softmax_scale, bool causal, bool deterministic, \
                                  FATTN_VARIANT_ARGS, std::optional<Tensor> sinks, FATTN_DROPOUT_ARGS, \
                                  FATTN_DESCALE_ARGS
#define FATTN_VARLEN_BACKWARD_ARGS Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, \
                                   std::optional<Tensor> dlse, FATTN_VARLEN_ARGS, \
                                   std::optional<double> softmax_scale, bool causal, bool deterministic, \
                                   FATTN_VARIANT_ARGS, FATTN_DROPOUT_ARGS
std::tuple<Tensor, Tensor> varlen_forward_cuda(FATTN_VARLEN_FORWARD_ARGS);
std::tuple<Tensor, Tensor> varlen_forward_cpu(FATTN_VARLEN_FORWARD_ARGS);
std::tuple<Tensor, Tensor, Tensor> varlen_backward_cuda(FATTN_VARLEN_BACKWARD_ARGS);
std::tuple<Tensor, Tensor, Tensor> varlen_backward_cpu(FATTN_VARLEN_BACKWARD_ARGS);

// fattn::merge_attention_states: one (out, lse) from a stack of partial results over
// disjoint key sets, weighted by their lse in fp32; -inf partials are ignored.
std::tuple<Tensor, Tensor> merge_cuda(Tensor outs, Tensor lses);
std::tuple<Tensor, Tensor> merge_cpu(Tensor outs, Tensor lses);

// fattn::decode: attention of a sequence's new query tokens over its (paged) KV cache, after
// appending the optional new tokens k/v in place at cache_seqlens (rotated first when
// rotary_cos/sin are given). flash-attn's flash_attn_with_kvcache order. Returns out [batch,
// seqlen_q, heads, head_dim] (q's dtype) and lse [batch, heads, seqlen_q]. With an FP8 cache
// (float8_e4m3fn or float8_e5m2, both caches alike) k_descale and v_descale (float32 [batch,
// kv_heads], optional) say what its values stand for (decode/decode_shape.h).
#define FATTN_DECODE_ARGS Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k, \
                          std::optional<Tensor> v, std::optional<Tensor> rotary_cos, \
                          std::optional<Tensor> rotary_sin, std::optional<Tensor> cache_seqlens, \
                          std::optional<Tensor> cache_batch_idx, std::optional<Tensor> cache_leftpad, \
                          std::optional<Tensor> block_table, std::optional<double> softmax_scale, bool causal, \
                          int64_t window_left, int64_t window_right, double softcap, bool rotary_interleaved, \
                          std::optional<Tensor> alibi_slopes, int64_t num_splits, std::optional<Tensor> sinks, \
                          std::optional<Tensor> k_descale, std::optional<Tensor> v_descale
std::tuple<Tensor, Tensor> decode_cuda(FATTN_DECODE_ARGS);
std::tuple<Tensor, Tensor> decode_cpu(FATTN_DECODE_ARGS);

}  // namespace fattn
