// fattn::merge_attention_states on CUDA: one launch of the attn_merge kernel.
#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ops/attention_inputs.h"
#include "ops/kernel_choice.h"
#include "ops/ops.h"
#include "runtime/launch.h"

namespace fattn::ops {

std::tuple<Tensor, Tensor> merge_cuda(Tensor outs, Tensor lses) {
  constexpr const char* op = "fattn.merge_attention_states";
  const MergeShape m = check_merge_inputs(op, outs, lses);
  if (m.heads > 65535 || m.batch > 65535) {
    throw std::runtime_error(std::string(op) + ": batch and heads must each be at most 65535");
  }
  using torch::headeronly::ScalarType;
  const KernelChoice choice =
      choose_kernel(op, "attn_merge", outs.get_device_index(), outs.scalar_type(), m.head_dim, {});
  Tensor out = torch::stable::new_empty(outs, {m.batch, m.seqlen_q, m.heads, m.head_dim});
  Tensor lse = torch::stable::new_empty(outs, {m.batch, m.heads, m.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0) return {out, lse};
  outs = aligned_for_kernel(outs);
  // The kernel indexes lses as contiguous rows and assumes a 16-byte aligned base.
  lses = torch::stable::contiguous(lses);
  if (reinterpret_cast<uintptr_t>(lses.data_ptr()) % 16 != 0) lses = torch::stable::clone(lses);
  using runtime::Arg;
  runtime::launch(choice.target,
                  {ceil_div(m.seqlen_q, choice.constant("BLOCK_M")), static_cast<unsigned>(m.heads),
                   static_cast<unsigned>(m.batch)},
                  {Arg("Outs", outs.data_ptr()), Arg("Lses", lses.data_ptr()), Arg("Out", out.data_ptr()),
                   Arg("Lse", lse.data_ptr()),
                   Arg("stride_ps", kernel_stride(outs, 0)), Arg("stride_pb", kernel_stride(outs, 1)),
                   Arg("stride_pq", kernel_stride(outs, 2)), Arg("stride_ph", kernel_stride(outs, 3)),
                   Arg("stride_ob", kernel_stride(out, 0)), Arg("stride_oq", kernel_stride(out, 1)),
                   Arg("stride_oh", kernel_stride(out, 2)),
                   Arg("num_splits", m.splits), Arg("seqlen_q", m.seqlen_q), Arg("num_heads", m.heads),
                   Arg("head_dim", m.head_dim)});
  return {out, lse};
}

}  // namespace fattn::ops
