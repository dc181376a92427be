// fattn::forward on CUDA: validate, pick the compiled variant, allocate, launch.
#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "attention/attention_variant.h"
#include "common/kernel_choice.h"
#include "ops.h"

namespace fattn {

std::tuple<Tensor, Tensor> forward_cuda(FATTN_FORWARD_ARGS) {
  (void)deterministic;  // a backward setting, saved by autograd
  constexpr const char* op = "fattn.forward";
  using kernels::attn_fwd;
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale);
  const AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  const auto fwd = choose<attn_fwd>(op, q.get_device_index(), q.scalar_type(), s.head_dim,
                                    {.SCORE_MOD = variant.modifies_scores()});
  const runtime::Grid grid{ceil_div(s.seqlen_q, fwd.constant(attn_fwd::BLOCK_M)), dim(s.heads), dim(s.batch)};
  check_grid(op, grid, "query tiles", "heads", "batch");

  Tensor out = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse = torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0) return {out, lse};

  q = aligned_for_kernel(q);
  k = aligned_for_kernel(k);
  v = aligned_for_kernel(v);
  const KernelScores scores = kernel_scores(variant, softmax_scale, s.head_dim, lse);
  kernels::launch_attn_fwd(fwd, grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .Out = out.data_ptr(), .Lse = lse.data_ptr(),
      .stride_qb = kernel_stride(q, 0), .stride_qs = kernel_stride(q, 1), .stride_qh = kernel_stride(q, 2),
      .stride_kb = kernel_stride(k, 0), .stride_ks = kernel_stride(k, 1), .stride_kh = kernel_stride(k, 2),
      .stride_vb = kernel_stride(v, 0), .stride_vs = kernel_stride(v, 1), .stride_vh = kernel_stride(v, 2),
      .stride_ob = kernel_stride(out, 0), .stride_os = kernel_stride(out, 1), .stride_oh = kernel_stride(out, 2),
      .seqlen_q = s.seqlen_q, .seqlen_k = s.seqlen_k, .num_heads = s.heads, .kv_group_size = s.group(),
      .head_dim = s.head_dim, .window_left = variant.window_left, .window_right = variant.window_right,
      .Alibi = scores.alibi, .stride_alibib = variant.alibi_stride_b(), .stride_alibih = variant.alibi_stride_h(),
      .use_alibi = scores.use_alibi, .qk_scale = scores.qk_scale, .softcap_log2 = scores.softcap_log2,
  });
  return {out, lse};
}

}  // namespace fattn
