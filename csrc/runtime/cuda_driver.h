// The CUDA driver API, opened at run time from libcuda.so.1.
//
// fattn links neither cudart nor libcuda: a build made on a machine without a GPU
// (or against CPU-only torch) loads anywhere, and only the first CUDA launch needs
// the driver. The few types and constants used are declared here with the values
// of cuda.h, so no CUDA headers are needed to build.
#pragma once

#include <cstdint>
#include <string>

namespace fattn::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

// A TMA map (cuda.h's CUtensorMap): 128 opaque bytes, 64-byte aligned.
struct alignas(64) CUtensorMap {
  unsigned char opaque[128];
};

constexpr CUresult CUDA_SUCCESS = 0;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;

struct Driver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  // Null where the driver predates it (CUDA 12.0): the kernels that take host-made maps are then
  // not chosen. Its enum arguments (data type, interleave, swizzle, L2 promotion, out-of-bounds
  // fill) are ints with cuda.h's values.
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                                     const uint32_t*, const uint32_t*, int, int, int, int);
};

// The driver, opened and initialised on first use (thread-safe). Throws
// std::runtime_error when libcuda.so.1 or one of its functions is missing.
const Driver& driver();

// Throws std::runtime_error with the driver's error name and message when
// `result` is not CUDA_SUCCESS. `what` says which call, `kernel` which kernel.
void check(CUresult result, const char* what, const std::string& kernel = "");

// The primary context of `device` (retained once, as torch uses it).
CUcontext primary_context(int device);

// Makes the primary context of `device` current for the scope, restoring the
// caller's context afterwards so torch's notion of the current device is untouched.
class ScopedContext {
 public:
  explicit ScopedContext(int device);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};

int device_attribute(int device, int attribute);

// 10 * major + minor of `device`, read once per device.
int compute_capability(int device);

// The number of SMs of `device`, read once per device.
int multiprocessor_count(int device);

// The shared memory of one SM of `device` in bytes (what its resident programs share), read once.
int shared_memory_per_multiprocessor(int device);

}  // namespace fattn::cuda
