// The one launch helper: marshals named arguments by a table entry's parameter
// list and launches with cuLaunchKernel on torch's current stream.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_table.h"

namespace fattn::runtime {

// A named kernel argument. Integers are range-checked against the parameter's
// declared width; floats are passed as the 4-byte float Triton declares.
struct Arg {
  enum class Kind { Pointer, Int, Float };
  const char* name;
  Kind kind;
  const void* pointer = nullptr;
  int64_t integer = 0;
  double real = 0.0;

  Arg(const char* n, const void* p) : name(n), kind(Kind::Pointer), pointer(p) {}
  Arg(const char* n, int64_t v) : name(n), kind(Kind::Int), integer(v) {}
  Arg(const char* n, int v) : name(n), kind(Kind::Int), integer(v) {}
  Arg(const char* n, double v) : name(n), kind(Kind::Float), real(v) {}
};

struct Grid {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchTarget {
  const KernelEntry* entry;
  int device;     // CUDA device index of the tensors
  bool from_ptx;  // load the entry's PTX instead of its cubin (FATTN_FORCE_PTX_ARCH)
};

// Launches `target` over `grid` on the current torch stream of its device. Every
// parameter of the kernel must be named exactly once in `args`. Allocates the
// kernel's global scratch from torch's caching allocator (so CUDA graph capture
// works) when its metadata asks for it.
void launch(const LaunchTarget& target, Grid grid, std::initializer_list<Arg> args);

}  // namespace fattn::runtime
