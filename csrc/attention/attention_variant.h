// What a call adds to plain attention: the sliding window (causal is its right edge at 0),
// the softcap and the ALiBi slopes. Validated once for CUDA and CPU; the CPU references
// use its float64 definitions, the kernels its normalised values.
#pragma once

#include <optional>
#include <vector>

#include "attention/attention_shape.h"
#include "attention/bias.h"
#include "attention/dropout.h"
#include "kernel_launchers.h"

namespace fattn {

// ALiBi slopes' (batch, head) strides as the kernels read them: a [heads] tensor repeats over
// batch; 0 without slopes.
int64_t alibi_stride_b(const std::optional<Tensor>& slopes);
int64_t alibi_stride_h(const std::optional<Tensor>& slopes);

struct AttentionVariant {
  // Key j is visible to query i iff i + diagonal - window_left <= j <= i + diagonal +
  // window_right (diagonal = seqlen_k - seqlen_q); -1 is unbounded. A side wide enough to
  // hide nothing is stored as -1, which also keeps it within the kernels' 32 bits.
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;                   // > 0: score -> softcap * tanh(score / softcap)
  std::optional<Tensor> alibi_slopes;   // float32 [heads] or [batch, heads]
  // Added to the query position in ALiBi's distance alone: -slope * |i + diagonal + alibi_offset
  // - j|. A caller that runs one sequence in pieces (ring attention) gives each piece its global
  // distances; the masks keep the piece's own diagonal.
  int64_t alibi_offset = 0;
  // int32 [batch, seqlen_q] and [batch, seqlen_k], rows contiguous: query i sees key j only
  // if their ids are equal (dense layout only).
  std::optional<Tensor> q_segment_ids, kv_segment_ids;
  std::optional<Tensor> bias;  // attention/bias.h
  Dropout dropout;             // attention/dropout.h
  std::optional<Tensor> dropout_seed;

  // The score-modifier variant that compiles this call's modifiers in every kernel family
  // (triton_src/variants.py names them): plain without any, softcap_alibi for the softcap and
  // ALiBi, bias_dropout when a bias or dropout is given too (their code costs registers even
  // unused, so the others leave it out). forward_score_mods and backward_score_mods say which
  // narrower variant the Hopper kernels try first.
  kernels::score_mod::Value score_mod() const {
    if (bias.has_value() || dropout.active()) return kernels::score_mod::kBiasDropout;
    return softcap > 0 || alibi_slopes.has_value() ? kernels::score_mod::kSoftcapAlibi : kernels::score_mod::kPlain;
  }
  bool visible(int64_t i, int64_t j, int64_t diagonal) const {
    return (window_left < 0 || j >= i + diagonal - window_left) && (window_right < 0 || j <= i + diagonal + window_right);
  }
  // ALiBi strides over (batch, head) as the kernels read them: a [heads] tensor repeats over batch.
  int64_t alibi_stride_b() const { return fattn::alibi_stride_b(alibi_slopes); }
  int64_t alibi_stride_h() const { return fattn::alibi_stride_h(alibi_slopes); }
};

// The score-modifier variants that serve a call, best first: `best`, where the build has it (the
// Hopper kernels'), then `general` (AttentionVariant::score_mod, which every build has).
struct ScoreModChoice {
  kernels::score_mod::Value best, general;
};
// ALiBi without a softcap: alibi_only; a bias whose rows TMA can read: bias_tma.
ScoreModChoice forward_score_mods(const AttentionVariant& variant);
// As the forward's, but bias_tma compiles no softcap in the backward, and its d bias (bias_grad) is
// written by TMA too, which needs whole 16-byte rows of float32: seqlen_k a multiple of 4.
ScoreModChoice backward_score_mods(const AttentionVariant& variant, bool bias_grad, int64_t seqlen_k);

// Rejects windows below -1, a negative or non-finite softcap, slopes that are not float32
// [heads] / [batch, heads] on q's device, and segment ids that are not int32 [batch, seqlen]
// pairs on q's device (given alone, or with packed inputs); causal forces window_right to 0.
AttentionVariant check_attention_variant(const char* op, const AttentionShape& s, const Tensor& q, bool causal,
                                         int64_t window_left, int64_t window_right, double softcap,
                                         const std::optional<Tensor>& alibi_slopes,
                                         const std::optional<Tensor>& q_segment_ids = std::nullopt,
                                         const std::optional<Tensor>& kv_segment_ids = std::nullopt);

// Adds ALiBi's position offset to a checked variant: 0, or any value with alibi_slopes that
// keeps every distance |i + diagonal + offset - j| within the kernels' 32 bits.
void add_alibi_offset(const char* op, AttentionVariant& variant, const AttentionShape& s, int64_t alibi_offset);

// Adds the bias (dense layout only) and dropout to a checked variant, after checking them.
void add_bias_and_dropout(const char* op, AttentionVariant& variant, const AttentionShape& s, const Tensor& q,
                          const std::optional<Tensor>& bias, double dropout_p,
                          const std::optional<Tensor>& dropout_seed);

// softcap: finite and >= 0 (0 disables it).
void check_softcap(const char* op, double softcap);
// window_left, window_right: -1 (unbounded) or >= 0, for every op that takes a window.
void check_window(const char* op, int64_t window_left, int64_t window_right);
// A window side as the kernels take it: -1 when it is unbounded or hides nothing (at least
// `keys` wide, e.g. seqlen_k + seqlen_q), which also keeps it within 32 bits.
inline int64_t bounded_window(int64_t w, int64_t keys) { return w < 0 || w >= keys ? int64_t{-1} : w; }

// Sinks: float32 [heads] on q's device (one logit per query head that joins every row's
// softmax denominator and carries no value).
void check_sinks(const char* op, const std::optional<Tensor>& sinks, const Tensor& q, int64_t heads);
// The sinks for the CPU references: one float64 logit per head, or none.
std::vector<double> cpu_sinks(const std::optional<Tensor>& sinks);

// ALiBi slopes: float32 [heads] or [batch, heads] on q's device.
void check_alibi_slopes(const char* op, const Tensor& slopes, const Tensor& q, int64_t batch, int64_t heads);

// The float64 definition the CPU references use, for one (batch, head): the score of
// key j for query i from its scaled dot product, and d score / d scaled_dot (the
// softcap's 1 - tanh^2, else 1). alibi_diagonal: the masks' diagonal plus alibi_offset.
struct ScoreMod {
  double softcap = 0, slope = 0;
  double score(double scaled_dot, int64_t i, int64_t j, int64_t alibi_diagonal) const;
  double derivative(double scaled_dot) const;
};
// The segment ids for the CPU references: same(b, i, j) is true when there are none.
struct CpuSegments {
  std::optional<Tensor> q, kv;  // contiguous copies, kept alive for the pointers
  const int32_t* q_ids = nullptr;
  const int32_t* kv_ids = nullptr;
  int64_t seqlen_q = 0, seqlen_k = 0;
  bool same(int64_t b, int64_t i, int64_t j) const {
    return q_ids == nullptr || q_ids[b * seqlen_q + i] == kv_ids[b * seqlen_k + j];
  }
};
CpuSegments cpu_segments(const AttentionVariant& variant, const AttentionShape& s);

// One ScoreMod per (batch, head), batch-major (decode's CPU reference uses them too).
std::vector<ScoreMod> score_mods(double softcap, const std::optional<Tensor>& alibi_slopes, int64_t batch,
                                 int64_t heads);

}  // namespace fattn
