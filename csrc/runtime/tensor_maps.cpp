#include "runtime/tensor_maps.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace fattn::runtime {
namespace {

// cuda.h's values.
constexpr int kInterleaveNone = 0;
constexpr int kL2Promotion128B = 2;
constexpr int kOutOfBoundsZero = 0;  // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros past the tensor

std::string launching(const LaunchTarget& target, const char* param) {
  return std::string("fattn: launching ") + target.entry->function_name + ": the map of " + param;
}

// A dimension of one element is never stepped: its stride is whatever keeps the map's strides
// valid, the dense one over the dimensions inside it.
void dense_strides_for_unit_dims(const MapSource& source, int64_t out[4]) {
  out[3] = 1;
  for (int d = 2; d >= 0; --d) {
    out[d] = source.sizes[d] == 1 ? source.sizes[d + 1] * out[d + 1] : source.strides[d];
  }
}

}  // namespace

bool maps_supported() { return cuda::driver().cuTensorMapEncodeTiled != nullptr; }

bool fits_map(const MapSource& source, int element_bytes) {
  if (reinterpret_cast<uintptr_t>(source.data) % 16 != 0 || source.strides[3] != 1) return false;
  int64_t strides[4];
  dense_strides_for_unit_dims(source, strides);
  for (int d = 0; d < 3; ++d) {
    if (strides[d] <= 0 || (strides[d] * element_bytes) % 16 != 0) return false;
  }
  return true;
}

void require_maps(const LaunchTarget& target, bool given, int expected) {
  if (!given || target.entry->num_maps != expected) {
    throw std::runtime_error(std::string("fattn: launching ") + target.entry->function_name + ": its variant takes " +
                             std::to_string(target.entry->num_maps) + " host-made maps, the launcher " +
                             std::to_string(expected) + (given ? "" : ", and none were given"));
  }
}

EncodedMap encode_map(const LaunchTarget& target, int index, const char* param, const MapSource& source) {
  const KernelEntry& e = *target.entry;
  if (index < 0 || index >= e.num_maps) {
    throw std::runtime_error(launching(target, param) + ": the kernel takes " + std::to_string(e.num_maps) +
                             " maps, not one at " + std::to_string(index));
  }
  const auto encode = cuda::driver().cuTensorMapEncodeTiled;
  if (encode == nullptr) {
    throw std::runtime_error(launching(target, param) + " needs cuTensorMapEncodeTiled, which this NVIDIA "
                             "driver lacks (CUDA 12.0 or newer has it)");
  }
  const MapBox& box = e.maps[index];
  // The driver checks the map's address in the current context, and the calling thread may have
  // none yet: autograd's backward thread has made no CUDA call of its own before the first op.
  cuda::ScopedContext context(target.device);
  EncodedMap out{};
  int64_t strides[4];
  dense_strides_for_unit_dims(source, strides);
  // cuda.h orders a map's dimensions innermost first; Triton's shape and strides, outermost first.
  uint64_t dims[4], byte_strides[3];
  uint32_t box_dims[4], element_strides[4] = {1, 1, 1, 1};
  for (int d = 0; d < 4; ++d) {
    if (source.sizes[d] <= 0 || source.sizes[d] > std::numeric_limits<int32_t>::max()) {
      throw std::runtime_error(launching(target, param) + ": dimension " + std::to_string(d) + " has " +
                               std::to_string(source.sizes[d]) + " elements, outside a map's int32 shape");
    }
    out.shape[d] = static_cast<int32_t>(source.sizes[d]);
    out.strides[d] = strides[d];
    dims[3 - d] = static_cast<uint64_t>(source.sizes[d]);
    box_dims[3 - d] = box.box[d];
  }
  for (int d = 0; d < 3; ++d) byte_strides[2 - d] = static_cast<uint64_t>(strides[d] * box.element_bytes);
  const cuda::CUresult result =
      encode(&out.map, box.data_type, 4, const_cast<void*>(source.data), dims, byte_strides, box_dims,
             element_strides, kInterleaveNone, box.swizzle, kL2Promotion128B, kOutOfBoundsZero);
  if (result != cuda::CUDA_SUCCESS) {
    std::string shape;
    for (int d = 0; d < 4; ++d) {
      shape += (d ? ", " : "") + std::to_string(source.sizes[d]) + " (stride " + std::to_string(strides[d]) + ")";
    }
    cuda::check(result, (launching(target, param) + " over [" + shape + "], cuTensorMapEncodeTiled").c_str(),
                e.function_name);
  }
  return out;
}

}  // namespace fattn::runtime
