// Errors leave the library through the C++ runtime of the process, not the library's own.
//
// torch calls each op's boxed kernel and catches what it throws as std::exception. A
// library that links its C++ runtime statically (the portable wheel: libc++, libc++abi
// and libunwind inside libfattn.so, so that it needs no libstdc++ or libgcc_s) cannot
// throw across that boundary: its exception is foreign to torch's libstdc++ and its
// unwinder is not torch's, and the process aborts. So every boxed kernel catches inside
// the library and rethrows the message as std::runtime_error through the libstdc++ that
// torch itself loaded. Between that throw and torch only frames without landing pads
// are unwound (boxed_with_host_errors and raise_in_host hold no destructors and no
// try blocks), so the process's unwinder never calls the library's own personality.
#pragma once

#include <cstdint>

#include <torch/csrc/stable/library.h>

namespace fattn {

using BoxedKernel = void (*)(StableIValue*, uint64_t, uint64_t);

// Runs `boxed`; nullptr when it returned, else the message of what it threw (valid
// until this thread's next call).
const char* run_catching(BoxedKernel boxed, StableIValue* stack, uint64_t num_args,
                         uint64_t num_outputs) noexcept;

// Throws std::runtime_error(message) through the process's libstdc++ (the one torch
// was built against), or through the library's own runtime if the process has none.
[[noreturn]] void raise_in_host(const char* message);

template <BoxedKernel boxed>
void boxed_with_host_errors(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  if (const char* message = run_catching(boxed, stack, num_args, num_outputs)) raise_in_host(message);
}

}  // namespace fattn

// TORCH_BOX(func), with errors rethrown through the process's C++ runtime.
#define FATTN_BOX(func) (&fattn::boxed_with_host_errors<TORCH_BOX(func)>)
