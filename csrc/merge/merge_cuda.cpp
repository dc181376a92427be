// fattn::merge_attention_states on CUDA, its arguments already checked (merge_op.cpp): one
// launch of the attn_merge kernel.
#include <torch/csrc/stable/ops.h>

#include "common/kernel_choice.h"
#include "merge/merge_impl.h"

namespace fattn {

std::tuple<Tensor, Tensor> launch_merge(const char* op, const MergeShape& m, Tensor outs, Tensor lses) {
  using kernels::attn_merge;
  const auto merge = choose<attn_merge>(op, outs.get_device_index(), outs.scalar_type(), m.head_dim, {});
  const runtime::Grid grid{ceil_div(m.seqlen_q, merge.constant(attn_merge::BLOCK_M)), dim(m.heads), dim(m.batch)};
  check_grid(op, grid, "query tiles", "heads", "batch");
  Tensor out = torch::stable::new_empty(outs, {m.batch, m.seqlen_q, m.heads, m.head_dim});
  Tensor lse = torch::stable::new_empty(outs, {m.batch, m.heads, m.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0) return {out, lse};
  outs = aligned_for_kernel(outs);
  // The kernel indexes lses as contiguous rows and assumes a 16-byte aligned base.
  lses = torch::stable::contiguous(lses);
  if (reinterpret_cast<uintptr_t>(lses.data_ptr()) % 16 != 0) lses = torch::stable::clone(lses);
  kernels::launch_attn_merge(merge, grid, {
      .Outs = outs.data_ptr(), .Lses = lses.data_ptr(), .Out = out.data_ptr(), .Lse = lse.data_ptr(),
      .stride_ps = kernel_stride(outs, 0), .stride_pb = kernel_stride(outs, 1), .stride_pq = kernel_stride(outs, 2),
      .stride_ph = kernel_stride(outs, 3), .stride_ob = kernel_stride(out, 0), .stride_oq = kernel_stride(out, 1),
      .stride_oh = kernel_stride(out, 2), .num_splits = m.splits, .seqlen_q = m.seqlen_q, .num_heads = m.heads,
      .head_dim = m.head_dim});
  return {out, lse};
}

}  // namespace fattn
