#include "runtime/module_cache.h"

#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

namespace fattn::runtime {
namespace {

constexpr int kDefaultSharedLimit = 48 * 1024;  // what a launch gets without opting in

cuda::CUfunction load_uncached(const KernelEntry& entry, int device, bool from_ptx) {
  const cuda::Driver& d = cuda::driver();
  cuda::ScopedContext context(device);
  const std::string what = std::string(entry.function_name) + " (sm_" +
                           std::to_string(entry.arch) + (from_ptx ? " PTX)" : " cubin)");
  cuda::CUmodule module = nullptr;
  const void* image = from_ptx ? static_cast<const void*>(entry.ptx())
                               : static_cast<const void*>(entry.cubin());
  cuda::check(d.cuModuleLoadData(&module, image), "cuModuleLoadData", what);
  cuda::CUfunction fn = nullptr;
  cuda::check(d.cuModuleGetFunction(&fn, module, entry.function_name), "cuModuleGetFunction", what);
  if (entry.shared_bytes > kDefaultSharedLimit) {
    int optin = cuda::device_attribute(device, cuda::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    if (entry.shared_bytes > optin) {
      throw std::runtime_error("fattn: kernel " + what + " needs " + std::to_string(entry.shared_bytes) +
                               " bytes of shared memory; device " + std::to_string(device) +
                               " allows " + std::to_string(optin));
    }
    cuda::check(d.cuFuncSetAttribute(fn, cuda::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     entry.shared_bytes),
                "cuFuncSetAttribute", what);
  }
  return fn;
}

}  // namespace

namespace {

struct Cache {
  std::mutex mutex;
  std::map<std::tuple<const KernelEntry*, int, bool>, cuda::CUfunction> loaded;
  ModuleStats stats;
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace

cuda::CUfunction load_function(const KernelEntry& entry, int device, bool from_ptx) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto key = std::make_tuple(&entry, device, from_ptx);
  auto it = c.loaded.find(key);
  if (it != c.loaded.end()) return it->second;
  ++c.stats.load_attempts;
  cuda::CUfunction fn = load_uncached(entry, device, from_ptx);  // a failure is not cached: the next call retries
  c.loaded.emplace(key, fn);
  c.stats.functions = static_cast<int64_t>(c.loaded.size());
  return fn;
}

ModuleStats module_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

}  // namespace fattn::runtime
