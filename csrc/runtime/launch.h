// Launching a table entry: what the generated launchers (kernel_launchers.h) call.
#pragma once

#include <cstdint>

#include "runtime/kernel_table.h"

namespace fattn::runtime {

struct Grid {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchTarget {
  const KernelEntry* entry;
  int device;     // CUDA device index of the tensors
  bool from_ptx;  // load the entry's PTX instead of its cubin (FATTN_FORCE_PTX_ARCH)
};

// A launcher argument or flag that must be given: it has no default constructor, so an
// aggregate initializer that leaves it out, or passes empty braces, does not compile.
template <typename T>
struct Required {
  T value;
  Required(T v) : value(v) {}  // NOLINT: implicit, so that `.seqlen_q = s.seqlen_q` reads plainly
};

// A chosen variant of kernel K (a struct of kernel_launchers.h): the type ties the
// variant to K's launcher, and K::Constant indexes its constexprs directly.
template <typename K>
struct Variant {
  LaunchTarget target;
  int64_t constant(typename K::Constant c) const { return target.entry->constants[c].value; }
};

// `value` as the kernel's int32 parameter `name`; throws naming both when it does not fit.
int32_t narrow_i32(const LaunchTarget& target, const char* name, int64_t value);

// Launches `target` over `grid` on the current torch stream of its device. `params` holds
// one pointer per runtime parameter, in the kernel's order, then &scratch[0] and
// &scratch[1]: the kernel's global and profile scratch, allocated here from torch's
// caching allocator (so CUDA graph capture works) when its metadata asks for it.
void launch(const LaunchTarget& target, Grid grid, void** params, void** scratch);

}  // namespace fattn::runtime
