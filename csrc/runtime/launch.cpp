#include "runtime/launch.h"

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "runtime/cuda_driver.h"
#include "runtime/module_cache.h"
#include "runtime/torch_stream.h"

namespace fattn::runtime {
namespace {

torch::stable::Tensor scratch_buffer(int device, int64_t bytes) {
  return torch::stable::empty({bytes}, torch::headeronly::ScalarType::Byte, std::nullopt,
                              torch::stable::Device(torch::headeronly::DeviceType::CUDA, device));
}

}  // namespace

const unsigned char* KernelEntry::cubin() const { return kernel_blob() + cubin_offset; }
const char* KernelEntry::ptx() const { return reinterpret_cast<const char*>(kernel_blob() + ptx_offset); }

const char* dtype_tag(DType dtype) {
  switch (dtype) {
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::F32: return "fp32";
  }
  return "?";
}

int32_t narrow_i32(const LaunchTarget& target, const char* name, int64_t value) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    throw std::runtime_error(std::string("fattn: launching ") + target.entry->function_name + ": argument " +
                             name + " = " + std::to_string(value) + " does not fit the kernel's int32 parameter");
  }
  return static_cast<int32_t>(value);
}

void launch(const LaunchTarget& target, Grid grid, void** params, void** scratch) {
  const KernelEntry& e = *target.entry;
  const int64_t programs = int64_t(grid.x) * grid.y * grid.z;
  torch::stable::Tensor global_scratch, profile_scratch;  // live until the launch is queued
  if (e.global_scratch_size > 0) {
    // torch's allocator hands out 512-byte aligned blocks, enough for any Triton alignment.
    global_scratch = scratch_buffer(target.device, programs * e.global_scratch_size);
    scratch[0] = global_scratch.mutable_data_ptr();
  }
  if (e.profile_scratch_size > 0) {
    profile_scratch = scratch_buffer(target.device, programs * e.profile_scratch_size);
    scratch[1] = profile_scratch.mutable_data_ptr();
  }
  cuda::CUfunction fn = load_function(e, target.device, target.from_ptx);
  cuda::ScopedContext context(target.device);
  auto stream = static_cast<cuda::CUstream>(current_cuda_stream(target.device));
  cuda::check(cuda::driver().cuLaunchKernel(fn, grid.x, grid.y, grid.z, 32 * e.num_warps, 1, 1, e.shared_bytes,
                                            stream, params, nullptr),
              "cuLaunchKernel", e.function_name);
}

}  // namespace fattn::runtime
