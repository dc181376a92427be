#include "attention/attention_variant.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdlib>

namespace fattn {

int64_t alibi_stride_b(const std::optional<Tensor>& slopes) {
  if (!slopes.has_value() || slopes->dim() == 1 || slopes->size(0) == 1) return 0;
  return slopes->stride(0);
}

int64_t alibi_stride_h(const std::optional<Tensor>& slopes) {
  return slopes.has_value() ? slopes->stride(slopes->dim() - 1) : 0;
}

void check_alibi_slopes(const char* op, const Tensor& a, const Tensor& q, int64_t batch, int64_t heads) {
  if (a.scalar_type() != ScalarType::Float) {
    fail(op, "alibi_slopes has dtype ", dtype_name(a.scalar_type()), "; expected float32");
  }
  const bool per_head = a.dim() == 1 && a.size(0) == heads;
  const bool per_batch = a.dim() == 2 && a.size(0) == batch && a.size(1) == heads;
  if (!per_head && !per_batch) {
    fail(op, "alibi_slopes has shape ", shape_of(a), "; expected [heads] = [", heads, "] or [batch, heads] = [",
         batch, ", ", heads, "]");
  }
  check_same_device(op, "alibi_slopes", a, "q", q);
}

void check_sinks(const char* op, const std::optional<Tensor>& sinks, const Tensor& q, int64_t heads) {
  if (!sinks.has_value()) return;
  if (sinks->scalar_type() != ScalarType::Float) {
    fail(op, "sinks has dtype ", dtype_name(sinks->scalar_type()), "; expected float32");
  }
  if (sinks->dim() != 1 || sinks->size(0) != heads) {
    fail(op, "sinks has shape ", shape_of(*sinks), "; expected [heads] = [", heads, "]");
  }
  check_same_device(op, "sinks", *sinks, "q", q);
}


std::vector<double> cpu_sinks(const std::optional<Tensor>& sinks) {
  if (!sinks.has_value()) return {};
  Tensor d = as_double(*sinks);
  const double* p = d.const_data_ptr<double>();
  return std::vector<double>(p, p + d.size(0));
}

void check_softcap(const char* op, double softcap) {
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    fail(op, "softcap must be a finite number >= 0 (0 disables it), got ", softcap);
  }
}

void check_window(const char* op, int64_t window_left, int64_t window_right) {
  if (window_left < -1) fail(op, "window_left is ", window_left, "; expected -1 (unbounded) or >= 0");
  if (window_right < -1) fail(op, "window_right is ", window_right, "; expected -1 (unbounded) or >= 0");
}

AttentionVariant check_attention_variant(const char* op, const AttentionShape& s, const Tensor& q, bool causal,
                                         int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<Tensor>& alibi_slopes,
                                         const std::optional<Tensor>& q_segment_ids,
                                         const std::optional<Tensor>& kv_segment_ids) {
  check_window(op, window_left, window_right);
  check_softcap(op, softcap);
  AttentionVariant variant;
  variant.window_left = bounded_window(window_left, s.seqlen_k + s.seqlen_q);
  variant.window_right = causal ? 0 : bounded_window(window_right, s.seqlen_k + s.seqlen_q);
  variant.softcap = softcap;
  if (alibi_slopes.has_value()) {
    check_alibi_slopes(op, *alibi_slopes, q, s.batch, s.heads);
    variant.alibi_slopes = *alibi_slopes;
  }
  if (q_segment_ids.has_value() != kv_segment_ids.has_value()) {
    fail(op, q_segment_ids.has_value() ? "q_segment_ids is given without kv_segment_ids"
                                       : "kv_segment_ids is given without q_segment_ids",
         "; pass both or neither");
  }
  if (q_segment_ids.has_value()) {
    if (q.dim() != 4) fail(op, "segment ids take the dense [batch, seqlen, heads, head_dim] layout");
    const char* names[] = {"q_segment_ids", "kv_segment_ids"};
    const Tensor* ids[] = {&*q_segment_ids, &*kv_segment_ids};
    const int64_t lengths[] = {s.seqlen_q, s.seqlen_k};
    for (int i = 0; i < 2; ++i) {
      check_index_tensor(op, names[i], *ids[i], 2, q);
      if (ids[i]->size(0) != s.batch || ids[i]->size(1) != lengths[i]) {
        fail(op, names[i], " has shape ", shape_of(*ids[i]), "; expected [batch, ", i == 0 ? "seqlen_q" : "seqlen_k",
             "] = [", s.batch, ", ", lengths[i], "]");
      }
      if (lengths[i] > 1 && ids[i]->stride(1) != 1) {
        fail(op, names[i], " must have contiguous rows (stride 1 along the sequence); call .contiguous() first");
      }
    }
    variant.q_segment_ids = *q_segment_ids;
    variant.kv_segment_ids = *kv_segment_ids;
  }
  return variant;
}

void add_alibi_offset(const char* op, AttentionVariant& variant, const AttentionShape& s, int64_t alibi_offset) {
  if (alibi_offset == 0) return;
  if (!variant.alibi_slopes.has_value()) {
    fail(op, "alibi_offset is ", alibi_offset, " but alibi_slopes is None; the offset only shifts ALiBi's distances");
  }
  // The kernels add it to 32-bit positions: the largest distance, |offset| + seqlen_q + seqlen_k,
  // must stay below 2^31.
  const int64_t limit = (int64_t{1} << 31) - 1 - s.seqlen_q - s.seqlen_k;
  if (alibi_offset > limit || alibi_offset < -limit) {
    fail(op, "alibi_offset is ", alibi_offset, "; expected |alibi_offset| <= ", limit,
         " (2^31 - 1 - seqlen_q - seqlen_k, so that every distance fits in 32 bits)");
  }
  variant.alibi_offset = alibi_offset;
}

void add_bias_and_dropout(const char* op, AttentionVariant& variant, const AttentionShape& s, const Tensor& q,
                          const std::optional<Tensor>& bias, double dropout_p,
                          const std::optional<Tensor>& dropout_seed) {
  check_bias(op, bias, s, q);
  variant.bias = bias;
  variant.dropout = check_dropout(op, dropout_p, dropout_seed, q);
  if (variant.dropout.active()) variant.dropout_seed = dropout_seed;
}

ScoreModChoice forward_score_mods(const AttentionVariant& variant) {
  const kernels::score_mod::Value general = variant.score_mod();
  if (general == kernels::score_mod::kSoftcapAlibi && variant.softcap <= 0) {
    return {kernels::score_mod::kAlibiOnly, general};
  }
  if (general == kernels::score_mod::kBiasDropout && bias_rows_for_tma(variant.bias)) {
    return {kernels::score_mod::kBiasTma, general};
  }
  return {general, general};
}

ScoreModChoice backward_score_mods(const AttentionVariant& variant, bool bias_grad, int64_t seqlen_k) {
  ScoreModChoice choice = forward_score_mods(variant);
  if (choice.best == kernels::score_mod::kBiasTma && (variant.softcap > 0 || (bias_grad && seqlen_k % 4 != 0))) {
    choice.best = choice.general;
  }
  return choice;
}

double ScoreMod::score(double scaled_dot, int64_t i, int64_t j, int64_t alibi_diagonal) const {
  double score = softcap > 0 ? softcap * std::tanh(scaled_dot / softcap) : scaled_dot;
  return score - slope * static_cast<double>(std::llabs(i + alibi_diagonal - j));
}

double ScoreMod::derivative(double scaled_dot) const {
  if (softcap <= 0) return 1.0;
  const double t = std::tanh(scaled_dot / softcap);
  return 1.0 - t * t;
}

CpuSegments cpu_segments(const AttentionVariant& variant, const AttentionShape& s) {
  CpuSegments segments;
  if (!variant.q_segment_ids.has_value()) return segments;
  segments.q = torch::stable::contiguous(*variant.q_segment_ids);
  segments.kv = torch::stable::contiguous(*variant.kv_segment_ids);
  segments.q_ids = segments.q->const_data_ptr<int32_t>();
  segments.kv_ids = segments.kv->const_data_ptr<int32_t>();
  segments.seqlen_q = s.seqlen_q;
  segments.seqlen_k = s.seqlen_k;
  return segments;
}

std::vector<ScoreMod> score_mods(double softcap, const std::optional<Tensor>& alibi_slopes, int64_t batch,
                                 int64_t heads) {
  std::vector<ScoreMod> mods(batch * heads, ScoreMod{softcap, 0.0});
  if (!alibi_slopes.has_value()) return mods;
  Tensor slopes = as_double(*alibi_slopes);
  const double* a = slopes.const_data_ptr<double>();
  const bool per_batch = slopes.dim() == 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) mods[b * heads + h].slope = a[(per_batch ? b * heads : 0) + h];
  }
  return mods;
}

}  // namespace fattn
