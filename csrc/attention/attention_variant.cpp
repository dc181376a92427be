#include "attention/attention_variant.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdlib>

namespace fattn {

int64_t AttentionVariant::alibi_stride_b() const {
  if (!alibi_slopes.has_value() || alibi_slopes->dim() == 1 || alibi_slopes->size(0) == 1) return 0;
  return alibi_slopes->stride(0);
}

int64_t AttentionVariant::alibi_stride_h() const {
  if (!alibi_slopes.has_value()) return 0;
  return alibi_slopes->stride(alibi_slopes->dim() - 1);
}

AttentionVariant check_attention_variant(const char* op, const AttentionShape& s, const Tensor& q, bool causal,
                                         int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<Tensor>& alibi_slopes) {
  if (window_left < -1) fail(op, "window_left is ", window_left, "; expected -1 (unbounded) or >= 0");
  if (window_right < -1) fail(op, "window_right is ", window_right, "; expected -1 (unbounded) or >= 0");
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    fail(op, "softcap must be a finite number >= 0 (0 disables it), got ", softcap);
  }
  AttentionVariant variant;
  auto bound = [&](int64_t w) { return w < 0 || w >= s.seqlen_k + s.seqlen_q ? int64_t{-1} : w; };
  variant.window_left = bound(window_left);
  variant.window_right = causal ? 0 : bound(window_right);
  variant.softcap = softcap;
  if (alibi_slopes.has_value()) {
    const Tensor& a = *alibi_slopes;
    if (a.scalar_type() != ScalarType::Float) {
      fail(op, "alibi_slopes has dtype ", dtype_name(a.scalar_type()), "; expected float32");
    }
    const bool per_head = a.dim() == 1 && a.size(0) == s.heads;
    const bool per_batch = a.dim() == 2 && a.size(0) == s.batch && a.size(1) == s.heads;
    if (!per_head && !per_batch) {
      fail(op, "alibi_slopes has shape ", shape_of(a), "; expected [heads] = [", s.heads, "] or [batch, heads] = [",
           s.batch, ", ", s.heads, "]");
    }
    check_same_device(op, "alibi_slopes", a, "q", q);
    variant.alibi_slopes = a;
  }
  return variant;
}

KernelScores kernel_scores(const AttentionVariant& variant, std::optional<double> softmax_scale, int64_t head_dim,
                           const Tensor& placeholder) {
  const double scale = resolve_softmax_scale(softmax_scale, head_dim);
  const bool capped = variant.softcap > 0;
  return {capped ? scale / variant.softcap : scale * M_LOG2E, capped ? variant.softcap * M_LOG2E : 0.0,
          variant.alibi_slopes.has_value() ? variant.alibi_slopes->data_ptr() : placeholder.data_ptr(),
          variant.alibi_slopes.has_value() ? 1 : 0};
}

double ScoreMod::score(double scaled_dot, int64_t i, int64_t j, int64_t diagonal) const {
  double score = softcap > 0 ? softcap * std::tanh(scaled_dot / softcap) : scaled_dot;
  return score - slope * static_cast<double>(std::llabs(i + diagonal - j));
}

double ScoreMod::derivative(double scaled_dot) const {
  if (softcap <= 0) return 1.0;
  const double t = std::tanh(scaled_dot / softcap);
  return 1.0 - t * t;
}

std::vector<ScoreMod> score_mods(const AttentionVariant& variant, const AttentionShape& s) {
  std::vector<ScoreMod> mods(s.batch * s.heads, ScoreMod{variant.softcap, 0.0});
  if (!variant.alibi_slopes.has_value()) return mods;
  Tensor slopes = as_double(*variant.alibi_slopes);
  const double* a = slopes.const_data_ptr<double>();
  const bool per_batch = slopes.dim() == 2;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) mods[b * s.heads + h].slope = a[(per_batch ? b * s.heads : 0) + h];
  }
  return mods;
}

}  // namespace fattn
