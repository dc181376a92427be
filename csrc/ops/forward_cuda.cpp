// fattn::forward on CUDA: validate, pick the compiled variant, allocate, launch.
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/attention_inputs.h"
#include "ops/ops.h"
#include "ops/kernel_choice.h"
#include "runtime/launch.h"

namespace fattn::ops {
namespace {

using torch::headeronly::ScalarType;
constexpr const char* kOp = "fattn.forward";
constexpr int64_t kMaxGridYZ = 65535;

}  // namespace

std::tuple<Tensor, Tensor> forward_cuda(Tensor q, Tensor k, Tensor v,
                                        std::optional<double> softmax_scale, bool causal,
                                        bool /*deterministic: a backward setting, saved by autograd*/) {
  const AttentionShape s = check_attention_inputs(kOp, q, k, v, softmax_scale);
  if (s.heads > kMaxGridYZ || s.batch > kMaxGridYZ) {
    throw std::runtime_error(std::string(kOp) + ": batch and heads must each be at most 65535, got batch " +
                             std::to_string(s.batch) + " and heads " + std::to_string(s.heads));
  }
  const int device = q.get_device_index();
  const KernelChoice choice =
      choose_kernel(kOp, "attn_fwd", device, q.scalar_type(), s.head_dim, {{"CAUSAL", causal ? 1 : 0}});
  const int64_t block_m = choice.constant("BLOCK_M");

  Tensor out = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse = torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0) return {out, lse};

  q = aligned_for_kernel(q);
  k = aligned_for_kernel(k);
  v = aligned_for_kernel(v);
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const runtime::Grid grid{ceil_div(s.seqlen_q, block_m), static_cast<unsigned>(s.heads),
                           static_cast<unsigned>(s.batch)};
  using runtime::Arg;
  runtime::launch(choice.target, grid, {
      Arg("Q", q.data_ptr()), Arg("K", k.data_ptr()), Arg("V", v.data_ptr()),
      Arg("Out", out.data_ptr()), Arg("Lse", lse.data_ptr()),
      Arg("stride_qb", kernel_stride(q, 0)), Arg("stride_qs", kernel_stride(q, 1)), Arg("stride_qh", kernel_stride(q, 2)),
      Arg("stride_kb", kernel_stride(k, 0)), Arg("stride_ks", kernel_stride(k, 1)), Arg("stride_kh", kernel_stride(k, 2)),
      Arg("stride_vb", kernel_stride(v, 0)), Arg("stride_vs", kernel_stride(v, 1)), Arg("stride_vh", kernel_stride(v, 2)),
      Arg("stride_ob", kernel_stride(out, 0)), Arg("stride_os", kernel_stride(out, 1)), Arg("stride_oh", kernel_stride(out, 2)),
      Arg("seqlen_q", s.seqlen_q), Arg("seqlen_k", s.seqlen_k), Arg("num_heads", s.heads),
      Arg("kv_group_size", s.group()), Arg("head_dim", s.head_dim),
      // log2(e) folded into the scale: the kernel's softmax uses exp2.
      Arg("qk_scale", scale * M_LOG2E),
  });
  return {out, lse};
}

}  // namespace fattn::ops
