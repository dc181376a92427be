// Picks the compiled variant of an attention kernel for a call: the arch that
// serves the device (or FATTN_FORCE_PTX_ARCH), the smallest head-dim bucket
// that holds head_dim, and the requested flags. Errors name what is missing.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/launch.h"

namespace fattn::ops {

struct KernelChoice {
  runtime::LaunchTarget target;
  const runtime::KernelEntry& entry() const { return *target.entry; }
  int64_t constant(const char* name) const { return target.entry->constant(name); }
};

// `flags` are constexpr (name, value) pairs besides BLOCK_D and PAD_D, which are
// derived from head_dim. `op` prefixes error messages.
KernelChoice choose_kernel(const char* op, const char* kernel, int device,
                           torch::headeronly::ScalarType dtype, int64_t head_dim,
                           std::vector<std::pair<const char*, int64_t>> flags);

// Kernels assume 16-byte aligned bases and strides that are multiples of 8
// elements (16-byte vector loads); a tensor that breaks this (a rare view) is
// replaced by an aligned contiguous copy.
torch::stable::Tensor aligned_for_kernel(const torch::stable::Tensor& t);

// The stride a kernel sees for dim `d`: 0 for a dim of size 1, which is never
// stepped and whose stride views may leave arbitrary.
int64_t kernel_stride(const torch::stable::Tensor& t, int d);

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace fattn::ops
