#include "runtime/host_exception.h"

#include <dlfcn.h>

#include <cstdio>
#include <exception>
#include <stdexcept>

namespace fattn {
namespace {

using ThrowFn = void (*)(const char*);

// libstdc++'s own `std::__throw_runtime_error(const char*)`: it builds and throws the
// exception entirely inside the process's runtime.
ThrowFn find_host_throw() noexcept {
  void* runtime = dlopen("libstdc++.so.6", RTLD_NOW | RTLD_NOLOAD);
  return runtime ? reinterpret_cast<ThrowFn>(dlsym(runtime, "_ZSt21__throw_runtime_errorPKc")) : nullptr;
}

// Looked up when the library loads: libtorch_cpu, and so its libstdc++, is loaded first.
const ThrowFn host_throw = find_host_throw();

// Kept out of raise_in_host: a throw expression needs a landing pad in its frame.
[[noreturn]] __attribute__((noinline)) void throw_own(const char* message) {
  throw std::runtime_error(message);
}

}  // namespace

const char* run_catching(BoxedKernel boxed, StableIValue* stack, uint64_t num_args,
                         uint64_t num_outputs) noexcept {
  // A plain buffer: a thread_local with a destructor would import glibc 2.18's
  // __cxa_thread_atexit_impl and raise the wheel's manylinux tag for nothing.
  static thread_local char message[4096];
  try {
    boxed(stack, num_args, num_outputs);
    return nullptr;
  } catch (const std::exception& e) {
    std::snprintf(message, sizeof(message), "%s", e.what());
  } catch (...) {
    std::snprintf(message, sizeof(message), "%s", "fattn: unknown C++ exception");
  }
  return message;
}

void raise_in_host(const char* message) {
  if (host_throw != nullptr) host_throw(message);
  throw_own(message);
}

}  // namespace fattn
