// The operators' implementations, one pair (CUDA, CPU) per operator.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <tuple>

namespace fattn::ops {

using torch::stable::Tensor;

// fattn::forward: out [batch, seqlen_q, heads, head_dim] (contiguous, q's dtype)
// and lse float32 [batch, heads, seqlen_q] (natural log, -inf for empty rows).
std::tuple<Tensor, Tensor> forward_cuda(Tensor q, Tensor k, Tensor v,
                                        std::optional<double> softmax_scale, bool causal);
std::tuple<Tensor, Tensor> forward_cpu(Tensor q, Tensor k, Tensor v,
                                       std::optional<double> softmax_scale, bool causal);

}  // namespace fattn::ops
