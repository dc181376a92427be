// Which compiled arch serves a device, and finding entries in the kernel table.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/kernel_table.h"

namespace fattn::runtime {

// The archs the table holds for `kernel`, ascending.
std::vector<int> built_archs(const char* kernel);

// The arch whose cubins run on a device of compute capability `device_arch`
// (10 * major + minor): the exact arch if built, else the newest built arch of
// the same major that is not newer than the device (a cubin runs on later minors
// of its major). Returns -1 if none. sm_90 cubins use sm_90a features and run
// on 9.0 only, so they never serve another minor.
int pick_arch(const std::vector<int>& built, int device_arch);

// Arch override for testing older code paths on a newer GPU: FATTN_FORCE_PTX_ARCH=80
// makes launches use the PTX of the sm_80 variants, JIT-compiled by the driver.
// Returns -1 when unset. Throws on a malformed value.
int forced_ptx_arch();

// The first entry with this kernel, arch and dtype whose constants match every
// (name, value) pair given; nullptr if none.
const KernelEntry* find_entry(const char* kernel, int arch, const char* dtype,
                              const std::vector<std::pair<const char*, int64_t>>& constants);

std::string join_archs(const std::vector<int>& archs);

}  // namespace fattn::runtime
