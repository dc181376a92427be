// How the attention kernels address rows, dense or packed (varlen): the arguments every
// attention kernel takes alike, computed once per call.
#pragma once

#include <optional>

#include "common/kernel_choice.h"

namespace fattn {

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

// The varlen offsets as the kernels take them; unused pointers point at `placeholder` and
// are never read (their use flags are 0).
struct Packing {
  const void* cu_seqlens_q;
  const void* cu_seqlens_k;
  const void* seqused_k;
  int64_t use_cu_seqlens, use_seqused_k;
};
inline Packing packing(const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                       const std::optional<Tensor>& seqused_k, const Tensor& placeholder) {
  auto ptr = [&](const std::optional<Tensor>& t) { return t.has_value() ? t->data_ptr() : placeholder.data_ptr(); };
  return {ptr(cu_seqlens_q), ptr(cu_seqlens_k), ptr(seqused_k), cu_seqlens_q.has_value() ? 1 : 0,
          seqused_k.has_value() ? 1 : 0};
}

}  // namespace fattn
