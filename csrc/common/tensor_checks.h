// Checks and facts about tensors that every op family shares, CUDA and CPU alike, so
// that bad input gets the same clear error whichever backend runs.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace fattn {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

constexpr int64_t kMaxHeadDim = 256;

std::string shape_of(const Tensor& t);
std::string dtype_name(ScalarType t);
std::string device_name(const Tensor& t);

// Same device type and index; allocates nothing (it runs on every call).
bool same_device(const Tensor& a, const Tensor& b);
// Rank, then "must be a CUDA or CPU tensor".
void check_rank(const char* op, const char* name, const Tensor& t, int64_t rank, const char* layout);
void check_same_device(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref);
void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref);
void check_last_dim_contiguous(const char* op, const char* name, const Tensor& t);
// float16/bfloat16 anywhere, float8 (e4m3fn, e5m2) where fp8_allowed (the forwards); float32/float64
// also on CPU (the reference implementations).
void check_attention_dtype(const char* op, const char* name, const Tensor& t, bool fp8_allowed = false);
// int32, `rank`-D, on ref's device (lengths, block tables).
void check_index_tensor(const char* op, const char* name, const Tensor& t, int64_t rank, const Tensor& ref);
void check_head_dim(const char* op, int64_t head_dim);
// q heads a multiple of kv heads (GQA/MQA).
void check_head_groups(const char* op, int64_t heads, int64_t kv_heads, const char* kv_names);
void check_softmax_scale(const char* op, std::optional<double> softmax_scale);

// lse is float32, except for float64 inputs (CPU only), where it keeps float64 so that
// gradients through it can be checked by finite differences. The one place this rule lives
// in C++; python/fattn mirrors it for the fakes.
inline ScalarType lse_dtype(ScalarType input) {
  return input == ScalarType::Double ? input : ScalarType::Float;
}

double resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim);

// t's sizes, for allocating a tensor shaped like it.
std::vector<int64_t> sizes_of(const Tensor& t);

// A contiguous float64 copy (or view) of `t`: what the CPU reference implementations compute on.
Tensor as_double(const Tensor& t);

}  // namespace fattn
