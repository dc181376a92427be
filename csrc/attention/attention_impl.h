// The two implementations of each attention op: the CUDA launches and the CPU's float64
// definition. attention_ops.cpp checks a call's arguments once and hands the checked values to
// the implementation of the inputs' device.
//
// Dense calls leave cu_seqlens_q/k and seqused_k out; packed (varlen) calls give them, and the
// CPU implementations then check their values, which CUDA never reads on the host (that would
// stall the stream).
#pragma once

#include <optional>
#include <tuple>

#include "attention/attention_variant.h"
#include "attention/fp8_inputs.h"

namespace fattn {

// (out, lse) as fattn::forward and fattn::varlen_forward return them (attention_ops.cpp).
// forward_cuda.cpp:
std::tuple<Tensor, Tensor> launch_forward(const char* op, const AttentionShape& s, const AttentionVariant& variant,
                                          std::optional<double> softmax_scale, Tensor q, Tensor k, Tensor v,
                                          const std::optional<Tensor>& sinks, const Fp8Inputs& fp8,
                                          const std::optional<Tensor>& cu_seqlens_q = std::nullopt,
                                          const std::optional<Tensor>& cu_seqlens_k = std::nullopt,
                                          const std::optional<Tensor>& seqused_k = std::nullopt);
// forward_cpu.cpp:
std::tuple<Tensor, Tensor> forward_on_cpu(const char* op, const AttentionShape& s, const AttentionVariant& variant,
                                          std::optional<double> softmax_scale, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const std::optional<Tensor>& sinks, const Fp8Inputs& fp8,
                                          const std::optional<Tensor>& cu_seqlens_q = std::nullopt,
                                          const std::optional<Tensor>& cu_seqlens_k = std::nullopt,
                                          const std::optional<Tensor>& seqused_k = std::nullopt);

// (dq, dk, dv, dbias) as fattn::backward returns them; bias_grad: also dS, the bias's unreduced
// gradient (dense layout only). backward_cuda.cpp:
std::tuple<Tensor, Tensor, Tensor, Tensor> launch_backward(
    const char* op, const AttentionShape& s, const AttentionVariant& variant, std::optional<double> softmax_scale,
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, const std::optional<Tensor>& dlse,
    bool bias_grad, bool deterministic, const std::optional<Tensor>& cu_seqlens_q = std::nullopt,
    const std::optional<Tensor>& cu_seqlens_k = std::nullopt,
    const std::optional<Tensor>& seqused_k = std::nullopt);
// backward_cpu.cpp (its loops are always ordered: it needs no `deterministic`):
std::tuple<Tensor, Tensor, Tensor, Tensor> backward_on_cpu(
    const char* op, const AttentionShape& s, const AttentionVariant& variant, std::optional<double> softmax_scale,
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& dlse, bool bias_grad, const std::optional<Tensor>& cu_seqlens_q = std::nullopt,
    const std::optional<Tensor>& cu_seqlens_k = std::nullopt,
    const std::optional<Tensor>& seqused_k = std::nullopt);

}  // namespace fattn
