#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <vector>

namespace fattn::cuda {
namespace {

// A libcuda.so.1 function, converted to the type of the Driver member it initialises.
struct Symbol {
  void* address;
  template <typename Fn>
  operator Fn() const {
    return reinterpret_cast<Fn>(address);
  }
};

Symbol resolve(void* lib, const char* name) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    throw std::runtime_error(std::string("fattn: libcuda.so.1 has no symbol ") + name +
                             " (the NVIDIA driver is too old)");
  }
  return {sym};
}

// A function that drivers older than the CUDA version introducing it lack: null there (its
// callers check).
Symbol resolve_optional(void* lib, const char* name) { return {dlsym(lib, name)}; }

Driver load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    throw std::runtime_error(std::string("fattn: cannot open the CUDA driver libcuda.so.1: ") +
                             (err ? err : "unknown error") +
                             ". CUDA tensors need an NVIDIA driver; CPU tensors do not.");
  }
  const auto fn = [lib](const char* name) { return resolve(lib, name); };
  // Designated, so that a member left out fails the build (-Werror=missing-field-initializers).
  // The _v2 names are the current ABI of the context push and pop; the plain names are legacy.
  const Driver d{.cuInit = fn("cuInit"), .cuGetErrorName = fn("cuGetErrorName"),
                 .cuGetErrorString = fn("cuGetErrorString"), .cuDeviceGet = fn("cuDeviceGet"),
                 .cuDeviceGetAttribute = fn("cuDeviceGetAttribute"),
                 .cuDevicePrimaryCtxRetain = fn("cuDevicePrimaryCtxRetain"), .cuCtxGetCurrent = fn("cuCtxGetCurrent"),
                 .cuCtxPushCurrent = fn("cuCtxPushCurrent_v2"), .cuCtxPopCurrent = fn("cuCtxPopCurrent_v2"),
                 .cuModuleLoadData = fn("cuModuleLoadData"), .cuModuleGetFunction = fn("cuModuleGetFunction"),
                 .cuFuncSetAttribute = fn("cuFuncSetAttribute"), .cuLaunchKernel = fn("cuLaunchKernel"),
                 .cuTensorMapEncodeTiled = resolve_optional(lib, "cuTensorMapEncodeTiled")};
  check(d.cuInit(0), "cuInit");
  return d;
}

}  // namespace

const Driver& driver() {
  // A function-local static initialises once even with concurrent callers; if the
  // load throws, the next call tries again.
  static const Driver d = load_driver();
  return d;
}

void check(CUresult result, const char* what, const std::string& kernel) {
  if (result == CUDA_SUCCESS) return;
  const char* name = "unknown";
  const char* message = "unknown error";
  // Careful not to recurse: driver() may be what failed to initialise.
  static thread_local bool in_check = false;
  if (!in_check) {
    in_check = true;
    try {
      const Driver& d = driver();
      d.cuGetErrorName(result, &name);
      d.cuGetErrorString(result, &message);
    } catch (...) {
    }
    in_check = false;
  }
  std::string text = std::string("fattn: CUDA driver error in ") + what;
  if (!kernel.empty()) text += " for kernel " + kernel;
  text += ": " + std::string(name) + " (" + std::to_string(result) + "): " + message;
  throw std::runtime_error(text);
}

CUcontext primary_context(int device) {
  static std::mutex mutex;
  static std::vector<CUcontext> contexts;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) throw std::runtime_error("fattn: invalid CUDA device index");
  if (contexts.size() <= static_cast<size_t>(device)) contexts.resize(device + 1, nullptr);
  if (contexts[device] == nullptr) {
    const Driver& d = driver();
    CUdevice dev;
    check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
    check(d.cuDevicePrimaryCtxRetain(&contexts[device], dev), "cuDevicePrimaryCtxRetain");
  }
  return contexts[device];
}

ScopedContext::ScopedContext(int device) {
  const Driver& d = driver();
  CUcontext wanted = primary_context(device);
  CUcontext current = nullptr;
  check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != wanted) {
    check(d.cuCtxPushCurrent(wanted), "cuCtxPushCurrent");
    pushed_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped;
    driver().cuCtxPopCurrent(&popped);  // destructors must not throw
  }
}

int device_attribute(int device, int attribute) {
  const Driver& d = driver();
  CUdevice dev;
  check(d.cuDeviceGet(&dev, device), "cuDeviceGet");
  int value = 0;
  check(d.cuDeviceGetAttribute(&value, attribute, dev), "cuDeviceGetAttribute");
  return value;
}

namespace {

// One attribute of `device`, read from the driver once and remembered.
int cached_attribute(int device, int attribute, std::vector<int>& known, std::mutex& mutex) {
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) throw std::runtime_error("fattn: invalid CUDA device index");
  if (known.size() <= static_cast<size_t>(device)) known.resize(device + 1, -1);
  if (known[device] < 0) known[device] = device_attribute(device, attribute);
  return known[device];
}

}  // namespace

int compute_capability(int device) {
  static std::mutex mutex;
  static std::vector<int> major, minor;
  return 10 * cached_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, major, mutex) +
         cached_attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, minor, mutex);
}

int multiprocessor_count(int device) {
  static std::mutex mutex;
  static std::vector<int> known;
  return cached_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, known, mutex);
}

int shared_memory_per_multiprocessor(int device) {
  static std::mutex mutex;
  static std::vector<int> known;
  return cached_attribute(device, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, known, mutex);
}

}  // namespace fattn::cuda
