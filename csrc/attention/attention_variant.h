// What a call adds to plain attention: the sliding window (causal is its right edge at 0),
// the softcap and the ALiBi slopes. Validated once for CUDA and CPU; the CPU references
// use its float64 definitions, the kernels its normalised values.
#pragma once

#include <optional>
#include <vector>

#include "attention/attention_shape.h"

namespace fattn {

struct AttentionVariant {
  // Key j is visible to query i iff i + diagonal - window_left <= j <= i + diagonal +
  // window_right (diagonal = seqlen_k - seqlen_q); -1 is unbounded. A side wide enough to
  // hide nothing is stored as -1, which also keeps it within the kernels' 32 bits.
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;                   // > 0: score -> softcap * tanh(score / softcap)
  std::optional<Tensor> alibi_slopes;   // float32 [heads] or [batch, heads]

  bool modifies_scores() const { return softcap > 0 || alibi_slopes.has_value(); }
  bool visible(int64_t i, int64_t j, int64_t diagonal) const {
    return (window_left < 0 || j >= i + diagonal - window_left) && (window_right < 0 || j <= i + diagonal + window_right);
  }
  // ALiBi strides over (batch, head) as the kernels read them: a [heads] tensor repeats over batch.
  int64_t alibi_stride_b() const;
  int64_t alibi_stride_h() const;
};

// Rejects windows below -1, a negative or non-finite softcap, and slopes that are not
// float32 [heads] / [batch, heads] on q's device; causal forces window_right to 0.
AttentionVariant check_attention_variant(const char* op, const AttentionShape& s, const Tensor& q, bool causal,
                                         int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<Tensor>& alibi_slopes);

// How the kernels take the scores (log2 domain, exp2 softmax): qk_scale multiplies q.k;
// with a softcap it is scale / softcap and the kernel applies softcap_log2 * tanh (softcap_log2
// = softcap * log2(e)), else it is scale * log2(e) and softcap_log2 is 0. `alibi` is the
// slopes' address, or `placeholder`'s (never read: use_alibi is 0).
struct KernelScores {
  double qk_scale, softcap_log2;
  const void* alibi;
  int64_t use_alibi;
};
KernelScores kernel_scores(const AttentionVariant& variant, std::optional<double> softmax_scale, int64_t head_dim,
                           const Tensor& placeholder);

// The float64 definition the CPU references use, for one (batch, head): the score of
// key j for query i from its scaled dot product, and d score / d scaled_dot (the
// softcap's 1 - tanh^2, else 1).
struct ScoreMod {
  double softcap = 0, slope = 0;
  double score(double scaled_dot, int64_t i, int64_t j, int64_t diagonal) const;
  double derivative(double scaled_dot) const;
};
// One ScoreMod per (batch, head), batch-major.
std::vector<ScoreMod> score_mods(const AttentionVariant& variant, const AttentionShape& s);

}  // namespace fattn
