#include "runtime/torch_stream.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace fattn::runtime {
namespace {

using GetStreamFn = int (*)(int32_t, void**);

GetStreamFn find_get_stream() {
  const char* name = "aoti_torch_get_current_cuda_stream";
  if (void* sym = dlsym(RTLD_DEFAULT, name)) return reinterpret_cast<GetStreamFn>(sym);
  // Python loads torch's libraries RTLD_LOCAL; reach the loaded copy by name.
  if (void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD)) {
    if (void* sym = dlsym(lib, name)) return reinterpret_cast<GetStreamFn>(sym);
  }
  throw std::runtime_error(
      "fattn: this torch has no CUDA support (aoti_torch_get_current_cuda_stream not found "
      "in the loaded libtorch_cuda.so); install a CUDA build of torch to run on GPUs");
}

}  // namespace

void* current_cuda_stream(int device_index) {
  static const GetStreamFn get_stream = find_get_stream();
  void* stream = nullptr;
  if (get_stream(device_index, &stream) != 0) {
    throw std::runtime_error("fattn: torch could not report the current CUDA stream of device " +
                             std::to_string(device_index));
  }
  return stream;
}

}  // namespace fattn::runtime
