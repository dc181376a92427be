#include "common/kernel_choice.h"

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "runtime/arch.h"
#include "runtime/cuda_driver.h"
#include "runtime/kernel_index.h"

namespace fattn {

using runtime::DType;

namespace {

// Once per process and GPU arch: the GPU is newer than every cubin, so the driver JIT-compiles
// PTX. It works, but each kernel's first call pays the compilation and the tiles were never
// tuned for this GPU.
void warn_ptx_fallback_once(int device_arch, int ptx_arch, const std::vector<int>& built) {
  static std::mutex mutex;
  static std::set<int> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(device_arch).second) return;
  std::fprintf(stderr,
               "fattn: warning: no cubins for sm_%d (this build has %s); running the sm_%d PTX, which the "
               "CUDA driver compiles for this GPU at each kernel's first call. Rebuild with "
               "FATTN_CUDA_ARCHS including %d for native code.\n",
               device_arch, runtime::join_archs(built).c_str(), ptx_arch, device_arch);
}

// "sm_89", or "sm_89 (or sm_86)" where an older arch serves what it lacks.
std::string arch_names(const ArchChoice& a) {
  std::string names = "sm_" + std::to_string(a.arch);
  return a.older < 0 ? names : names + " (or sm_" + std::to_string(a.older) + ")";
}

}  // namespace

ArchChoice choose_arch(const char* op, int kernel_id, const char* kernel, int device) {
  const std::vector<int>& built = runtime::built_archs(kernel_id);
  const int device_arch = cuda::compute_capability(device);
  const int forced = runtime::forced_ptx_arch();
  const std::vector<int>& with_ptx = runtime::ptx_archs(kernel_id);
  if (forced >= 0) {
    // As a GPU of the forced arch would: its own PTX, else (a kernel it builds nothing of, as
    // sm_89 builds only FP8 variants) the next older arch's of its major.
    const bool own = std::find(with_ptx.begin(), with_ptx.end(), forced) != with_ptx.end();
    const int arch = own ? forced : runtime::next_older_arch(with_ptx, forced);
    if (arch < 0) {
      fail(op, "FATTN_FORCE_PTX_ARCH=", forced, " but this build has ", kernel, " PTX for ",
           runtime::join_archs(with_ptx), " (FATTN_PTX_ARCHS at build time chooses which archs keep their PTX)");
    }
    if (forced > device_arch) {
      fail(op, "FATTN_FORCE_PTX_ARCH=", forced, " is newer than the GPU (sm_", device_arch, ")");
    }
    return {arch, true, runtime::next_older_arch(with_ptx, arch)};
  }
  const runtime::ArchPath path = runtime::pick_path(built, with_ptx, device_arch);
  if (path.arch < 0) {
    fail(op, "no ", kernel, " kernel for this GPU (cuda:", device, " is sm_", device_arch, "); this build has ",
         runtime::join_archs(built), ". Rebuild with FATTN_CUDA_ARCHS including ", device_arch);
  }
  if (path.ptx) warn_ptx_fallback_once(device_arch, path.arch, built);
  return {path.arch, path.ptx, path.older};
}

int choose_bucket(const char* op, int kernel_id, const char* kernel, const ArchChoice& a, DType dtype,
                  int64_t head_dim) {
  std::string built;
  for (int arch : {a.arch, a.older}) {
    const std::vector<int>& buckets = runtime::built_buckets(kernel_id, arch, dtype);
    for (int b : buckets) {
      if (b >= head_dim) return b;
    }
    for (int b : buckets) built += (built.empty() ? "" : ", ") + std::to_string(b);
  }
  fail(op, "head_dim ", head_dim, " has no compiled ", kernel, " kernel for ", arch_names(a),
       " (head-dim buckets built: ", built.empty() ? "none" : built, "); rebuild with FATTN_HEAD_DIMS including ",
       head_dim);
}

DType kernel_dtype(ScalarType dtype) {
  return dtype == ScalarType::Half ? DType::F16 : dtype == ScalarType::BFloat16 ? DType::BF16 : DType::F32;
}

void fail_no_variant(const char* op, const char* kernel, const ArchChoice& a, DType dtype, int bucket) {
  fail(op, "the build has no ", kernel, " variant for ", arch_names(a), " ", runtime::dtype_tag(dtype),
       " with BLOCK_D=", bucket, " and the requested flags; see aot_build/configs.json");
}

void check_grid(const char* op, runtime::Grid grid, const char* x_counts, const char* y_counts,
                const char* z_counts) {
  constexpr unsigned kMaxYZ = 65535, kMaxX = 2147483647u;
  if (grid.x > kMaxX) fail(op, x_counts, " (", grid.x, ") exceeds the launch grid limit of ", kMaxX);
  if (grid.y > kMaxYZ) fail(op, y_counts, " (", grid.y, ") exceeds the launch grid limit of ", kMaxYZ);
  if (grid.z > kMaxYZ) fail(op, z_counts, " (", grid.z, ") exceeds the launch grid limit of ", kMaxYZ);
}

bool meets_stride_multiple(const Tensor& t, int64_t multiple) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) % multiple != 0) return false;
  }
  return t.dim() == 0 || t.stride(t.dim() - 1) == 1;
}

Tensor aligned_for_kernel(const Tensor& t) {
  if (meets_stride_multiple(t, 8)) return t;
  Tensor c = torch::stable::contiguous(t);  // a view's copy starts on a fresh allocation
  return meets_stride_multiple(c, 8) ? c : torch::stable::clone(c);
}

}  // namespace fattn
