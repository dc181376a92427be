#include "runtime/launch.h"

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda_driver.h"
#include "runtime/module_cache.h"
#include "runtime/torch_stream.h"

namespace fattn::runtime {
namespace {

// Storage for one marshalled argument; cuLaunchKernel reads through pointers to these.
union Slot {
  void* pointer;
  int32_t i32;
  int64_t i64;
  float f32;
};

[[noreturn]] void fail(const KernelEntry& e, const std::string& message) {
  throw std::runtime_error(std::string("fattn: launching ") + e.function_name + " (sm_" +
                           std::to_string(e.arch) + "): " + message);
}

Slot marshal(const KernelEntry& e, const KernelParam& p, const Arg& a) {
  Slot s{};
  switch (p.type) {
    case ParamType::Pointer:
      if (a.kind != Arg::Kind::Pointer) fail(e, std::string("argument ") + p.name + " must be a pointer");
      s.pointer = const_cast<void*>(a.pointer);
      break;
    case ParamType::I32:
      if (a.kind != Arg::Kind::Int) fail(e, std::string("argument ") + p.name + " must be an integer");
      if (a.integer < std::numeric_limits<int32_t>::min() || a.integer > std::numeric_limits<int32_t>::max()) {
        fail(e, std::string("argument ") + p.name + " = " + std::to_string(a.integer) +
                    " does not fit the kernel's int32 parameter");
      }
      s.i32 = static_cast<int32_t>(a.integer);
      break;
    case ParamType::I64:
      if (a.kind != Arg::Kind::Int) fail(e, std::string("argument ") + p.name + " must be an integer");
      s.i64 = a.integer;
      break;
    case ParamType::F32:
      if (a.kind != Arg::Kind::Float) fail(e, std::string("argument ") + p.name + " must be a float");
      s.f32 = static_cast<float>(a.real);
      break;
  }
  return s;
}

torch::stable::Tensor scratch(int device, int64_t bytes) {
  return torch::stable::empty({bytes}, torch::headeronly::ScalarType::Byte, std::nullopt,
                              torch::stable::Device(torch::headeronly::DeviceType::CUDA, device));
}

}  // namespace

void launch(const LaunchTarget& target, Grid grid, std::initializer_list<Arg> args) {
  const KernelEntry& e = *target.entry;
  if (args.size() != static_cast<size_t>(e.num_params)) {
    fail(e, "got " + std::to_string(args.size()) + " arguments, the kernel takes " +
                std::to_string(e.num_params));
  }
  // Two trailing slots: Triton's global scratch and profile scratch pointers.
  std::vector<Slot> slots(e.num_params + 2);
  std::vector<void*> pointers(e.num_params + 2);
  for (int i = 0; i < e.num_params; ++i) {
    const Arg* found = nullptr;
    for (const Arg& a : args) {
      if (std::strcmp(a.name, e.params[i].name) == 0) found = &a;
    }
    if (found == nullptr) fail(e, std::string("missing argument ") + e.params[i].name);
    slots[i] = marshal(e, e.params[i], *found);
  }
  const int64_t programs = int64_t(grid.x) * grid.y * grid.z;
  torch::stable::Tensor global_scratch, profile_scratch;  // live until the launch is queued
  if (e.global_scratch_size > 0) {
    // torch's allocator hands out 512-byte aligned blocks, enough for any Triton alignment.
    global_scratch = scratch(target.device, programs * e.global_scratch_size);
    slots[e.num_params].pointer = global_scratch.mutable_data_ptr();
  }
  if (e.profile_scratch_size > 0) {
    profile_scratch = scratch(target.device, programs * e.profile_scratch_size);
    slots[e.num_params + 1].pointer = profile_scratch.mutable_data_ptr();
  }
  for (size_t i = 0; i < slots.size(); ++i) pointers[i] = &slots[i];

  cuda::CUfunction fn = load_function(e, target.device, target.from_ptx);
  cuda::ScopedContext context(target.device);
  auto stream = static_cast<cuda::CUstream>(current_cuda_stream(target.device));
  cuda::check(cuda::driver().cuLaunchKernel(fn, grid.x, grid.y, grid.z, 32 * e.num_warps, 1, 1,
                                            e.shared_bytes, stream, pointers.data(), nullptr),
              "cuLaunchKernel", e.function_name);
}

}  // namespace fattn::runtime
