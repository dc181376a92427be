// The builders of the argument groups the kernels share: one per group of
// triton_src/arguments.py (which says what each group means), returning the struct that
// aot_build/launchers.py generates for it. A launch site gives a kernel its own tensors and
// strides and one builder call per group:
//
//   kernels::launch_attn_fwd(fwd, grid, {.Q = ..., .stride_lseh = ls.h,
//                                        .sequences = sequences_args(scope, ...),
//                                        .shape = shape_args(s), .window = window_args(variant), ...});
//
// so a new argument of a group touches the group, its builder here and the kernels that read it.
#pragma once

#include <optional>
#include <vector>

#include "attention/attention_shape.h"
#include "attention/attention_variant.h"
#include "attention/fp8_inputs.h"
#include "attention/segment_spans.h"
#include "kernel_launchers.h"

namespace fattn {

// What the builders of one call share: the address that pointers the call does not use take
// (any live tensor of the call; never read, since their use flags are 0), and the temporaries
// the builders make (segment spans, stand-in descales, unit-stride sinks), kept alive until the
// call's launches are queued.
class LaunchScope {
 public:
  explicit LaunchScope(Tensor placeholder) : placeholder_(std::move(placeholder)) {}
  const void* unused() const { return placeholder_.data_ptr(); }
  const void* address_of(const std::optional<Tensor>& t) const { return t.has_value() ? t->data_ptr() : unused(); }
  const Tensor& placeholder() const { return placeholder_; }
  const void* keep(const Tensor& t) {
    kept_.push_back(t);
    return t.data_ptr();
  }

 private:
  Tensor placeholder_;
  std::vector<Tensor> kept_;
};

// Packed sequences when cu_seqlens_q is given (cu_seqlens_k with it), the keys' seqused_k when given.
kernels::SequencesArgs sequences_args(const LaunchScope& scope, const std::optional<Tensor>& cu_seqlens_q,
                                      const std::optional<Tensor>& cu_seqlens_k,
                                      const std::optional<Tensor>& seqused_k);
kernels::ShapeArgs shape_args(const AttentionShape& s);
// Window sides as AttentionVariant and DecodeShape store them (-1 unbounded).
kernels::WindowArgs window_args(int64_t window_left, int64_t window_right);
inline kernels::WindowArgs window_args(const AttentionVariant& v) { return window_args(v.window_left, v.window_right); }
kernels::AlibiArgs alibi_args(const LaunchScope& scope, const AttentionVariant& variant);
// The segment ids and each tile's span of the other side: query tiles of `tile` rows get the keys
// they need (forward, dQ), key tiles the queries (dK/dV). It launches the spans' kernel: call it
// after every check.
kernels::SegmentsArgs segments_args(LaunchScope& scope, const char* op, const AttentionVariant& variant,
                                    const AttentionShape& s, SpanOver over, int64_t tile);
// The log2-domain scales of AttentionVariant's softcap and the resolved softmax scale.
kernels::ScoresArgs scores_args(double softmax_scale, double softcap);
kernels::SinksArgs sinks_args(LaunchScope& scope, const std::optional<Tensor>& sinks);
kernels::BiasArgs bias_args(const LaunchScope& scope, const std::optional<Tensor>& bias);
kernels::DropoutArgs dropout_args(const LaunchScope& scope, const AttentionVariant& variant);
// stride_vd: the head-dim stride of FP8 V read transposed (0 without FP8).
kernels::Fp8InputsArgs fp8_inputs_args(LaunchScope& scope, const Fp8Inputs& fp8, const AttentionShape& s,
                                       int64_t stride_vd);
kernels::CacheDescalesArgs cache_descales_args(const LaunchScope& scope, const std::optional<Tensor>& k_descale,
                                               const std::optional<Tensor>& v_descale);

}  // namespace fattn
