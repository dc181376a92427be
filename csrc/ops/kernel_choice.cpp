#include "ops/kernel_choice.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "runtime/cuda_driver.h"
#include "runtime/kernel_select.h"

namespace fattn::ops {
namespace {

using torch::headeronly::ScalarType;

std::string prefix(const char* op) { return std::string(op) + ": "; }

int choose_arch(const char* op, const char* kernel, int device, bool* from_ptx) {
  const std::vector<int> built = runtime::built_archs(kernel);
  const int device_arch = cuda::compute_capability(device);
  int arch = runtime::forced_ptx_arch();
  *from_ptx = arch >= 0;
  if (*from_ptx) {
    if (std::find(built.begin(), built.end(), arch) == built.end()) {
      throw std::runtime_error(prefix(op) + "FATTN_FORCE_PTX_ARCH=" + std::to_string(arch) +
                               " but this build has PTX for " + runtime::join_archs(built));
    }
    if (arch > device_arch) {
      throw std::runtime_error(prefix(op) + "FATTN_FORCE_PTX_ARCH=" + std::to_string(arch) +
                               " is newer than the GPU (sm_" + std::to_string(device_arch) + ")");
    }
    return arch;
  }
  arch = runtime::pick_arch(built, device_arch);
  if (arch < 0) {
    throw std::runtime_error(prefix(op) + "no kernel for this GPU (cuda:" + std::to_string(device) +
                             " is sm_" + std::to_string(device_arch) + "); this build has " +
                             runtime::join_archs(built) + ". Rebuild with FATTN_CUDA_ARCHS including " +
                             std::to_string(device_arch));
  }
  return arch;
}

}  // namespace

KernelChoice choose_kernel(const char* op, const char* kernel, int device, ScalarType dtype,
                           int64_t head_dim, std::vector<std::pair<const char*, int64_t>> flags) {
  const char* dtype_tag = dtype == ScalarType::Half ? "fp16" : dtype == ScalarType::BFloat16 ? "bf16" : "fp32";
  bool from_ptx = false;
  const int arch = choose_arch(op, kernel, device, &from_ptx);
  // The smallest compiled head-dim bucket that holds head_dim.
  int64_t bucket = -1;
  std::vector<int64_t> buckets;
  for (size_t i = 0; i < runtime::kernel_table_size(); ++i) {
    const runtime::KernelEntry& e = runtime::kernel_table()[i];
    if (e.arch != arch || std::string(e.kernel) != kernel || std::string(e.dtype) != dtype_tag) continue;
    const int64_t b = e.constant("BLOCK_D");
    if (std::find(buckets.begin(), buckets.end(), b) == buckets.end()) buckets.push_back(b);
    if (b >= head_dim && (bucket < 0 || b < bucket)) bucket = b;
  }
  if (bucket < 0) {
    std::sort(buckets.begin(), buckets.end());
    std::string built;
    for (int64_t b : buckets) built += (built.empty() ? "" : ", ") + std::to_string(b);
    throw std::runtime_error(prefix(op) + "head_dim " + std::to_string(head_dim) +
                             " has no compiled " + kernel + " kernel for sm_" + std::to_string(arch) +
                             " (head-dim buckets built: " + (built.empty() ? "none" : built) +
                             "); rebuild with FATTN_HEAD_DIMS including " + std::to_string(head_dim));
  }
  flags.emplace_back("BLOCK_D", bucket);
  flags.emplace_back("PAD_D", bucket != head_dim ? 1 : 0);
  const runtime::KernelEntry* entry = runtime::find_entry(kernel, arch, dtype_tag, flags);
  if (entry == nullptr) {
    std::string wanted;
    for (const auto& [name, value] : flags) wanted += std::string(" ") + name + "=" + std::to_string(value);
    throw std::runtime_error(prefix(op) + "the build has no " + kernel + " variant for sm_" +
                             std::to_string(arch) + " " + dtype_tag + " with" + wanted);
  }
  return {{entry, device, from_ptx}};
}

torch::stable::Tensor aligned_for_kernel(const torch::stable::Tensor& t) {
  auto meets = [](const torch::stable::Tensor& x) {
    if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0) return false;
    for (int d = 0; d + 1 < x.dim(); ++d) {
      if (x.size(d) > 1 && x.stride(d) % 8 != 0) return false;
    }
    return x.dim() == 0 || x.stride(x.dim() - 1) == 1;
  };
  if (meets(t)) return t;
  torch::stable::Tensor c = torch::stable::contiguous(t);  // a view's copy starts on a fresh allocation
  return meets(c) ? c : torch::stable::clone(c);
}

int64_t kernel_stride(const torch::stable::Tensor& t, int d) { return t.size(d) > 1 ? t.stride(d) : 0; }

}  // namespace fattn::ops
