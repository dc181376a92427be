#include "attention/kernel_args.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "attention/bias.h"
#include "common/kernel_choice.h"

namespace fattn {

kernels::SequencesArgs sequences_args(const LaunchScope& scope, const std::optional<Tensor>& cu_seqlens_q,
                                      const std::optional<Tensor>& cu_seqlens_k,
                                      const std::optional<Tensor>& seqused_k) {
  return {.CuSeqlensQ = scope.address_of(cu_seqlens_q), .CuSeqlensK = scope.address_of(cu_seqlens_k),
          .SequsedK = scope.address_of(seqused_k), .use_cu_seqlens = cu_seqlens_q.has_value() ? 1 : 0,
          .use_seqused_k = seqused_k.has_value() ? 1 : 0};
}

kernels::ShapeArgs shape_args(const AttentionShape& s) {
  return {.seqlen_q = s.seqlen_q, .seqlen_k = s.seqlen_k, .kv_group_size = s.group(), .head_dim = s.head_dim};
}

kernels::WindowArgs window_args(int64_t window_left, int64_t window_right) {
  return {.window_left = window_left, .window_right = window_right};
}

kernels::AlibiArgs alibi_args(const LaunchScope& scope, const AttentionVariant& variant) {
  return {.Alibi = scope.address_of(variant.alibi_slopes), .stride_alibib = variant.alibi_stride_b(),
          .stride_alibih = variant.alibi_stride_h(), .use_alibi = variant.alibi_slopes.has_value() ? 1 : 0,
          .alibi_offset = variant.alibi_offset};
}

kernels::SegmentsArgs segments_args(LaunchScope& scope, const char* op, const AttentionVariant& variant,
                                    const AttentionShape& s, SpanOver over, int64_t tile) {
  if (!variant.q_segment_ids.has_value()) {
    return {.QSegmentIds = scope.unused(), .KvSegmentIds = scope.unused(), .stride_qsegb = 0, .stride_kvsegb = 0,
            .use_segments = 0, .SegmentSpans = scope.unused(), .stride_spanb = 0};
  }
  const Tensor &q = *variant.q_segment_ids, &kv = *variant.kv_segment_ids;
  const Tensor spans = tile_segment_spans(op, variant, s, over, tile);
  return {.QSegmentIds = q.data_ptr(), .KvSegmentIds = kv.data_ptr(), .stride_qsegb = kernel_stride(q, 0),
          .stride_kvsegb = kernel_stride(kv, 0), .use_segments = 1, .SegmentSpans = scope.keep(spans),
          .stride_spanb = spans.stride(0)};
}

kernels::ScoresArgs scores_args(double softmax_scale, double softcap) {
  // The kernels' softmax runs in exp2: with a softcap, softcap_log2 * tanh(q.k * qk_scale); else
  // q.k * qk_scale, log2(e) folded into the scale.
  if (softcap > 0) return {.qk_scale = softmax_scale / softcap, .softcap_log2 = softcap * M_LOG2E};
  return {.qk_scale = softmax_scale * M_LOG2E, .softcap_log2 = 0.0};
}

kernels::SinksArgs sinks_args(LaunchScope& scope, const std::optional<Tensor>& sinks) {
  if (!sinks.has_value()) return {.Sinks = scope.unused(), .use_sinks = 0};
  // The kernels read one logit per head at unit stride: a strided view is copied.
  const Tensor unit = sinks->stride(0) == 1 ? *sinks : torch::stable::contiguous(*sinks);
  return {.Sinks = scope.keep(unit), .use_sinks = 1};
}

kernels::BiasArgs bias_args(const LaunchScope& scope, const std::optional<Tensor>& bias) {
  if (!bias.has_value()) {
    return {.Bias = scope.unused(), .stride_biasb = 0, .stride_biash = 0, .stride_biasq = 0, .use_bias = 0};
  }
  const Tensor& b = *bias;
  return {.Bias = b.data_ptr(), .stride_biasb = kernel_stride(b, 0), .stride_biash = kernel_stride(b, 1),
          .stride_biasq = kernel_stride(b, 2), .use_bias = 1};
}

kernels::DropoutArgs dropout_args(const LaunchScope& scope, const AttentionVariant& variant) {
  return {.DropoutSeed = variant.dropout.active() ? variant.dropout_seed->data_ptr() : scope.unused(),
          .dropout_threshold = variant.dropout.threshold, .dropout_scale = variant.dropout.scale};
}

namespace {

// One FP8 descale: its address and (batch, head) strides; a one-element tensor of 1 (strides 0)
// stands in for a missing one.
struct Descale {
  const void* address;
  int64_t stride_b, stride_h;
};

Descale descale(LaunchScope& scope, const std::optional<Tensor>& d) {
  if (d.has_value()) return {d->data_ptr(), kernel_stride(*d, 0), kernel_stride(*d, 1)};
  Tensor one = torch::stable::new_empty(scope.placeholder(), {1}, ScalarType::Float);
  torch::stable::fill_(one, 1.0);
  return {scope.keep(one), 0, 0};
}

}  // namespace

kernels::Fp8InputsArgs fp8_inputs_args(LaunchScope& scope, const Fp8Inputs& fp8, const AttentionShape& s,
                                       int64_t stride_vd) {
  const Descale none{scope.unused(), 0, 0};
  const Descale q = fp8.active ? descale(scope, fp8.q_descale) : none;
  const Descale k = fp8.active ? descale(scope, fp8.k_descale) : none;
  const Descale v = fp8.active ? descale(scope, fp8.v_descale) : none;
  // q_descale is [batch, kv_heads]: the query heads of a KV head share its entry.
  const int64_t q_group = fp8.active && fp8.q_descale.has_value() ? s.heads / fp8.q_descale->size(1) : 1;
  return {.QDescale = q.address, .KDescale = k.address, .VDescale = v.address,
          .stride_qdescaleb = q.stride_b, .stride_qdescaleh = q.stride_h, .stride_kdescaleb = k.stride_b,
          .stride_kdescaleh = k.stride_h, .stride_vdescaleb = v.stride_b, .stride_vdescaleh = v.stride_h,
          .q_descale_group = q_group, .p_scale = kFp8ProbabilityScale, .stride_vd = stride_vd};
}

kernels::CacheDescalesArgs cache_descales_args(const LaunchScope& scope, const std::optional<Tensor>& k_descale,
                                               const std::optional<Tensor>& v_descale) {
  auto stride = [](const std::optional<Tensor>& d, int dim) { return d.has_value() ? kernel_stride(*d, dim) : 0; };
  return {.KDescale = scope.address_of(k_descale), .stride_kdb = stride(k_descale, 0),
          .stride_kdh = stride(k_descale, 1), .use_k_descale = k_descale.has_value() ? 1 : 0,
          .VDescale = scope.address_of(v_descale), .stride_vdb = stride(v_descale, 0),
          .stride_vdh = stride(v_descale, 1), .use_v_descale = v_descale.has_value() ? 1 : 0};
}

}  // namespace fattn
