// The additive bias of the scores: [batch | 1, heads | 1, seqlen_q | 1, seqlen_k] in q's dtype,
// keys contiguous, broadcast over its size-1 dims; added after the softcap and ALiBi, in natural-log
// units. -inf hides a key (python/fattn turns a boolean mask into 0 / -inf). Dense layout only.
#pragma once

#include <optional>

#include "attention/attention_shape.h"

namespace fattn {

void check_bias(const char* op, const std::optional<Tensor>& bias, const AttentionShape& s, const Tensor& q);
// bias_grad asks the backward for d bias: there must be a bias.
void check_bias_grad(const char* op, const std::optional<Tensor>& bias, bool bias_grad);

// Whether there is a bias and TMA can read its rows (bias_tma, the Hopper kernels'):
// a 16-byte aligned base, a nonzero query stride and every stride a multiple of 16 bytes. A bias
// broadcast over the queries (stride 0) or with rows of a length that is not a multiple of 8
// elements is not: those run bias_dropout.
bool bias_rows_for_tma(const std::optional<Tensor>& bias);

// The bias for the CPU references, in float64: at(b, h, i, j), 0 when there is none.
struct CpuBias {
  std::optional<Tensor> values;  // a contiguous float64 copy, kept alive for the pointer
  const double* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, stride_q = 0;
  double at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return data == nullptr ? 0.0 : data[b * stride_b + h * stride_h + i * stride_q + j];
  }
};
CpuBias cpu_bias(const std::optional<Tensor>& bias);

}  // namespace fattn
