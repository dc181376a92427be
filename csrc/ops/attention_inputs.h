// Validation of q, k, v shared by every attention operator, CUDA and CPU alike,
// so that bad input gets the same clear error whichever backend runs.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

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

// Checks the extra inputs of a backward: dout and out shaped and typed like q,
// lse (and dlse when given) float32 [batch, heads, seqlen_q], all on q's device.
void check_backward_inputs(const char* op, const AttentionShape& s, const torch::stable::Tensor& q,
                           const torch::stable::Tensor& dout, const torch::stable::Tensor& out,
                           const torch::stable::Tensor& lse,
                           const std::optional<torch::stable::Tensor>& dlse);

struct MergeShape {
  int64_t splits, batch, seqlen_q, heads, head_dim;
};

// Checks a stack of partial results for merging: outs [splits, batch, seqlen_q, heads,
// head_dim] (float; last dim contiguous; head_dim a multiple of 8 up to 256) and lses
// [splits, batch, heads, seqlen_q] (float32, float64 with float64 outs on CPU).
MergeShape check_merge_inputs(const char* op, const torch::stable::Tensor& outs,
                              const torch::stable::Tensor& lses);

// lse is float32, except for float64 inputs (CPU only), where it keeps float64 so
// that gradients through it can be checked by finite differences.
inline torch::headeronly::ScalarType lse_dtype(torch::headeronly::ScalarType input) {
  return input == torch::headeronly::ScalarType::Double ? input : torch::headeronly::ScalarType::Float;
}

// A contiguous float64 copy (or view) of `t`: what the CPU reference implementations compute on.
torch::stable::Tensor as_double(const torch::stable::Tensor& t);

double resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim);

// Message pieces as text without iostreams: a library built with a newer libstdc++ than
// the one torch's process loads crashes on its first formatted number through an
// ostream (the locale facets differ; seen on the H100 machine, whose g++ is newer).
inline std::string to_text(const char* s) { return s; }
inline std::string to_text(const std::string& s) { return s; }
template <typename T>
std::string to_text(T value) {
  static_assert(std::is_arithmetic_v<T>, "fail(): pass strings or numbers");
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%g", static_cast<double>(value));
    return buffer;
  } else {
    return std::to_string(value);
  }
}

// Throws std::runtime_error "<op>: <parts...>": every input error goes through here.
template <typename... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  std::string message = std::string(op) + ": ";
  ((message += to_text(parts)), ...);
  throw std::runtime_error(message);
}

std::string shape_of(const torch::stable::Tensor& t);
// float16/bfloat16 anywhere; float32/float64 also on CPU (the reference implementations).
bool attention_dtype_supported(const torch::stable::Tensor& t);
std::string dtype_name(torch::headeronly::ScalarType t);
std::string device_name(const torch::stable::Tensor& t);

}  // namespace fattn::ops
