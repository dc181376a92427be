// Loaded kernels, one CUfunction per (table entry, device, cubin-or-PTX).
//
// Modules load lazily on first use on each device and stay loaded for the life of
// the process (as torch's own kernels do). Safe to call from many threads.
#pragma once

#include "runtime/cuda_driver.h"
#include "runtime/kernel_table.h"

namespace fattn::runtime {

// The loaded function of `entry` on `device`; from its PTX (JIT-compiled by the
// driver for the device) when `from_ptx`, else from its cubin. Raises the
// function's dynamic shared memory limit when the kernel needs more than 48 KB.
cuda::CUfunction load_function(const KernelEntry& entry, int device, bool from_ptx);

}  // namespace fattn::runtime
