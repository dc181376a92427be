// Validation of q, k, v shared by every attention operator, CUDA and CPU alike,
// so that bad input gets the same clear error whichever backend runs.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <string>

namespace fattn::ops {

struct AttentionShape {
  int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  int64_t group() const { return heads / kv_heads; }
};

constexpr int64_t kMaxHeadDim = 256;

// Checks rank, device, dtype, shapes, head dim and strides of q, k, v and the
// optional softmax scale; throws std::runtime_error naming the argument and the
// expectation. `op` prefixes the message (e.g. "fattn.forward").
AttentionShape check_attention_inputs(const char* op, const torch::stable::Tensor& q,
                                      const torch::stable::Tensor& k,
                                      const torch::stable::Tensor& v,
                                      std::optional<double> softmax_scale);

double resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim);

std::string dtype_name(torch::headeronly::ScalarType t);
std::string device_name(const torch::stable::Tensor& t);

}  // namespace fattn::ops
