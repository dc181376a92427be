// Loaded kernels, one CUfunction per (table entry, device, cubin-or-PTX).
//
// Modules load lazily on first use on each device and stay loaded for the life of
// the process (as torch's own kernels do). Safe to call from many threads.
#pragma once

#include <cstdint>

#include "runtime/cuda_driver.h"
#include "runtime/kernel_table.h"

namespace fattn::runtime {

// The loaded function of `entry` on `device`; from its PTX (JIT-compiled by the
// driver for the device) when `from_ptx`, else from its cubin. Raises the
// function's dynamic shared memory limit when the kernel needs more than 48 KB.
cuda::CUfunction load_function(const KernelEntry& entry, int device, bool from_ptx);

struct ModuleStats {
  int64_t load_attempts = 0;  // module loads started (failed ones included)
  int64_t functions = 0;      // functions loaded and cached
};

// What load_function has done in this process: tests check that every module loads once.
ModuleStats module_stats();

}  // namespace fattn::runtime
