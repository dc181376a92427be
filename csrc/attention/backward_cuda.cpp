// fattn::backward on CUDA: delta (preprocess), then dK/dV per key tile, then dQ per query
// tile. Three launches on one stream, no atomics: bitwise reproducible.
#include <torch/csrc/stable/ops.h>

#include <cmath>

#include "attention/attention_variant.h"
#include "common/kernel_choice.h"
#include "ops.h"

namespace fattn {
namespace {

using kernels::attn_bwd_dkdv;
using kernels::attn_bwd_dq;
using kernels::attn_bwd_preprocess;

Tensor float32_contiguous(const Tensor& t) {
  return aligned_for_kernel(torch::stable::contiguous(torch::stable::to(t, ScalarType::Float)));
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> backward_cuda(FATTN_BACKWARD_ARGS) {
  (void)deterministic;
  constexpr const char* op = "fattn.backward";
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale);
  check_backward_inputs(op, s, q, dout, out, lse, dlse);
  const AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  const int device = q.get_device_index();
  const ScalarType dtype = q.scalar_type();
  const auto pre = choose<attn_bwd_preprocess>(op, device, dtype, s.head_dim, {.HAS_DLSE = dlse.has_value()});
  const bool score_mod = variant.modifies_scores();
  const auto dkdv = choose<attn_bwd_dkdv>(op, device, dtype, s.head_dim, {.SCORE_MOD = score_mod});
  const auto dqk = choose<attn_bwd_dq>(op, device, dtype, s.head_dim, {.SCORE_MOD = score_mod});
  const runtime::Grid pre_grid{ceil_div(s.seqlen_q, pre.constant(attn_bwd_preprocess::BLOCK_M)), dim(s.heads),
                               dim(s.batch)};
  const runtime::Grid dkdv_grid{ceil_div(s.seqlen_k, dkdv.constant(attn_bwd_dkdv::BLOCK_N)), dim(s.kv_heads),
                                dim(s.batch)};
  const runtime::Grid dq_grid{ceil_div(s.seqlen_q, dqk.constant(attn_bwd_dq::BLOCK_M)), dim(s.heads), dim(s.batch)};
  check_grid(op, pre_grid, "query tiles", "heads", "batch");
  check_grid(op, dq_grid, "query tiles", "heads", "batch");
  check_grid(op, dkdv_grid, "key tiles", "kv heads", "batch");

  const bool empty = s.batch == 0 || s.seqlen_q == 0 || s.seqlen_k == 0;
  // The kernels write every element (0 for keys no query sees), so only an empty problem,
  // which launches nothing, needs zero-filled gradients.
  auto make = empty ? torch::stable::new_zeros : torch::stable::new_empty;
  const auto none = std::nullopt;
  Tensor dq = make(q, {s.batch, s.seqlen_q, s.heads, s.head_dim}, none, none, none, none);
  Tensor dk = make(q, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim}, none, none, none, none);
  Tensor dv = make(q, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim}, none, none, none, none);
  if (empty) return {dq, dk, dv};

  // dout comes from autograd with whatever strides the graph produced.
  q = aligned_for_kernel(q);
  k = aligned_for_kernel(k);
  v = aligned_for_kernel(v);
  dout = aligned_for_kernel(dout);
  out = aligned_for_kernel(out);
  lse = float32_contiguous(lse);
  Tensor dlse32 = dlse.has_value() ? float32_contiguous(*dlse) : lse;  // not read without HAS_DLSE
  Tensor delta = torch::stable::new_empty(lse, {s.batch, s.heads, s.seqlen_q});

  kernels::launch_attn_bwd_preprocess(pre, pre_grid, {
      .Out = out.data_ptr(), .DO = dout.data_ptr(), .DLse = dlse32.data_ptr(), .Delta = delta.data_ptr(),
      .stride_ob = kernel_stride(out, 0), .stride_os = kernel_stride(out, 1), .stride_oh = kernel_stride(out, 2),
      .stride_dob = kernel_stride(dout, 0), .stride_dos = kernel_stride(dout, 1), .stride_doh = kernel_stride(dout, 2),
      .seqlen_q = s.seqlen_q, .num_heads = s.heads, .head_dim = s.head_dim});

  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const KernelScores scores = kernel_scores(variant, softmax_scale, s.head_dim, lse);
  kernels::launch_attn_bwd_dkdv(dkdv, dkdv_grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .DO = dout.data_ptr(), .Lse = lse.data_ptr(),
      .Delta = delta.data_ptr(), .DK = dk.data_ptr(), .DV = dv.data_ptr(),
      .stride_qb = kernel_stride(q, 0), .stride_qs = kernel_stride(q, 1), .stride_qh = kernel_stride(q, 2),
      .stride_kb = kernel_stride(k, 0), .stride_ks = kernel_stride(k, 1), .stride_kh = kernel_stride(k, 2),
      .stride_vb = kernel_stride(v, 0), .stride_vs = kernel_stride(v, 1), .stride_vh = kernel_stride(v, 2),
      .stride_dob = kernel_stride(dout, 0), .stride_dos = kernel_stride(dout, 1), .stride_doh = kernel_stride(dout, 2),
      .stride_dkb = kernel_stride(dk, 0), .stride_dks = kernel_stride(dk, 1), .stride_dkh = kernel_stride(dk, 2),
      .stride_dvb = kernel_stride(dv, 0), .stride_dvs = kernel_stride(dv, 1), .stride_dvh = kernel_stride(dv, 2),
      .seqlen_q = s.seqlen_q, .seqlen_k = s.seqlen_k, .num_heads = s.heads, .kv_group_size = s.group(),
      .head_dim = s.head_dim, .window_left = variant.window_left, .window_right = variant.window_right,
      .Alibi = scores.alibi, .stride_alibib = variant.alibi_stride_b(), .stride_alibih = variant.alibi_stride_h(),
      .use_alibi = scores.use_alibi, .qk_scale = scores.qk_scale, .softcap_log2 = scores.softcap_log2,
      .softmax_scale = scale});
  kernels::launch_attn_bwd_dq(dqk, dq_grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .DO = dout.data_ptr(), .Lse = lse.data_ptr(),
      .Delta = delta.data_ptr(), .DQ = dq.data_ptr(),
      .stride_qb = kernel_stride(q, 0), .stride_qs = kernel_stride(q, 1), .stride_qh = kernel_stride(q, 2),
      .stride_kb = kernel_stride(k, 0), .stride_ks = kernel_stride(k, 1), .stride_kh = kernel_stride(k, 2),
      .stride_vb = kernel_stride(v, 0), .stride_vs = kernel_stride(v, 1), .stride_vh = kernel_stride(v, 2),
      .stride_dob = kernel_stride(dout, 0), .stride_dos = kernel_stride(dout, 1), .stride_doh = kernel_stride(dout, 2),
      .stride_dqb = kernel_stride(dq, 0), .stride_dqs = kernel_stride(dq, 1), .stride_dqh = kernel_stride(dq, 2),
      .seqlen_q = s.seqlen_q, .seqlen_k = s.seqlen_k, .num_heads = s.heads, .kv_group_size = s.group(),
      .head_dim = s.head_dim, .window_left = variant.window_left, .window_right = variant.window_right,
      .Alibi = scores.alibi, .stride_alibib = variant.alibi_stride_b(), .stride_alibih = variant.alibi_stride_h(),
      .use_alibi = scores.use_alibi, .qk_scale = scores.qk_scale, .softcap_log2 = scores.softcap_log2,
      .softmax_scale = scale});
  return {dq, dk, dv};
}

}  // namespace fattn
