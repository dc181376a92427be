#include "attention/host_maps.h"

#include "attention/kernel_layout.h"
#include "runtime/tensor_maps.h"

namespace fattn {

bool wants_host_maps(int64_t seqlen_q, int64_t up_to_rows, bool packed, bool fp8, bool seqused_k,
                     std::initializer_list<const Tensor*> tensors) {
  if (packed || fp8 || seqused_k || seqlen_q > up_to_rows || !runtime::maps_supported()) return false;
  for (const Tensor* t : tensors) {
    if (!runtime::fits_map(map_source(*t), static_cast<int>(t->element_size()))) return false;
  }
  return true;
}

}  // namespace fattn

// The limits as the op applies them, for the tuner (tuning/tune_tile_loop.py) and tests through
// python/fattn/_library.py.
extern "C" __attribute__((visibility("default"))) int64_t fattn_host_maps_up_to_rows() {
  return fattn::kHostMapsUpToRows;
}

extern "C" __attribute__((visibility("default"))) int64_t fattn_backward_host_maps_up_to_rows() {
  return fattn::kBackwardHostMapsUpToRows;
}
