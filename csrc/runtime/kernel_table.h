// The table of precompiled kernels that aot_build generates (build/generated/kernel_table.cpp).
//
// Each entry is one Triton kernel compiled for one arch with fixed constexprs. The
// runtime knows nothing about what a kernel computes: ops find entries by kernel
// name, dtype and constants, and the launch helper marshals arguments by the
// entry's parameter list (Triton's launch ABI: non-constexpr parameters in order,
// then global scratch, then profile scratch).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fattn::runtime {

enum class ParamType : uint8_t { Pointer, I32, I64, F32 };

struct KernelParam {
  const char* name;
  ParamType type;
};

struct KernelConstant {
  const char* name;
  int64_t value;
};

struct KernelEntry {
  const char* kernel;  // Triton function name, e.g. "attn_fwd"
  int arch;            // 10 * major + minor of the target
  const char* dtype;   // element type of the tensors: "fp16", "bf16"
  const KernelConstant* constants;
  int num_constants;
  const KernelParam* params;
  int num_params;
  int num_warps;
  int num_stages;
  int shared_bytes;           // dynamic shared memory at launch
  int global_scratch_size;    // bytes per program; 0 = none
  int global_scratch_align;
  int profile_scratch_size;   // bytes per program; 0 = none
  size_t cubin_offset, cubin_size;  // into kernel_blob()
  size_t ptx_offset, ptx_size;      // into kernel_blob()
  // Each image is what cuModuleLoadData takes: a compressed fatbinary (the driver
  // decompresses it at first load), or a raw cubin / NUL-terminated PTX.
  const char* function_name;

  // Value of a constexpr; throws if the kernel has no such constant.
  int64_t constant(const char* name) const;
  const unsigned char* cubin() const;
  const char* ptx() const;
};

const KernelEntry* kernel_table();
size_t kernel_table_size();
const unsigned char* kernel_blob();
const char* kernel_triton_version();

}  // namespace fattn::runtime
