// How the attention kernels address rows, dense or packed (varlen): the arguments every
// attention kernel takes alike, computed once per call.
#pragma once

#include <optional>

#include "common/kernel_choice.h"
#include "runtime/tensor_maps.h"

namespace fattn {

// A dense [batch, seqlen, heads, dim] tensor as a host-made TMA map covers it (runtime/tensor_maps.h).
inline runtime::MapSource map_source(const Tensor& t) {
  return {t.data_ptr(), {t.size(0), t.size(1), t.size(2), t.size(3)}, {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}};
}

// Element strides of a [batch, seqlen, heads, dim] tensor, or of a packed [total, heads,
// dim] one (batch stride 0: each program adds its sequence's first row instead).
struct RowStrides {
  int64_t b, s, h;
};
inline RowStrides row_strides(const Tensor& t) {
  if (t.dim() == 4) return {kernel_stride(t, 0), kernel_stride(t, 1), kernel_stride(t, 2)};
  return {0, kernel_stride(t, 0), kernel_stride(t, 1)};
}

// lse (and delta, dlse) of query row i of sequence b, head h, at b * b_stride + h * h_stride
// + first row of b + i: [batch, heads, seqlen_q] dense, [heads, total_q] packed.
struct LseStrides {
  int64_t b, h;
};
inline LseStrides lse_strides(const Tensor& lse) {
  if (lse.dim() == 3) return {lse.stride(0), lse.stride(1)};
  return {0, lse.stride(0)};
}


}  // namespace fattn
