// fattn::backward on CUDA: delta (preprocess), then dK/dV per key tile, then dQ per
// query tile. Three launches on one stream, no atomics: bitwise reproducible.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "ops/attention_inputs.h"
#include "ops/kernel_choice.h"
#include "ops/ops.h"
#include "runtime/launch.h"

namespace fattn::ops {
namespace {

using runtime::Arg;
using torch::headeronly::ScalarType;
constexpr const char* kOp = "fattn.backward";

Tensor float32_contiguous(const Tensor& t) {
  return aligned_for_kernel(torch::stable::contiguous(torch::stable::to(t, ScalarType::Float)));
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> backward_cuda(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                                 Tensor lse, std::optional<Tensor> dlse,
                                                 std::optional<double> softmax_scale, bool causal,
                                                 bool /*deterministic*/) {
  const AttentionShape s = check_attention_inputs(kOp, q, k, v, softmax_scale);
  check_backward_inputs(kOp, s, q, dout, out, lse, dlse);
  if (s.heads > 65535 || s.batch > 65535) {
    throw std::runtime_error(std::string(kOp) + ": batch and heads must each be at most 65535");
  }
  const int device = q.get_device_index();
  const ScalarType dtype = q.scalar_type();
  const int64_t c = causal ? 1 : 0;
  const KernelChoice pre = choose_kernel(kOp, "attn_bwd_preprocess", device, dtype, s.head_dim,
                                         {{"HAS_DLSE", dlse.has_value() ? 1 : 0}});
  const KernelChoice dkdv = choose_kernel(kOp, "attn_bwd_dkdv", device, dtype, s.head_dim, {{"CAUSAL", c}});
  const KernelChoice dqk = choose_kernel(kOp, "attn_bwd_dq", device, dtype, s.head_dim, {{"CAUSAL", c}});

  const bool empty = s.batch == 0 || s.seqlen_q == 0 || s.seqlen_k == 0;
  // The kernels write every element (0 for keys no query sees), so only an empty
  // problem, which launches nothing, needs zero-filled gradients.
  auto make = empty ? torch::stable::new_zeros : torch::stable::new_empty;
  Tensor dq = make(q, {s.batch, s.seqlen_q, s.heads, s.head_dim}, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  Tensor dk = make(q, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim}, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
  Tensor dv = make(q, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim}, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
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

  const unsigned heads = static_cast<unsigned>(s.heads), batch = static_cast<unsigned>(s.batch);
  runtime::launch(pre.target, {ceil_div(s.seqlen_q, pre.constant("BLOCK_M")), heads, batch}, {
      Arg("Out", out.data_ptr()), Arg("DO", dout.data_ptr()), Arg("DLse", dlse32.data_ptr()),
      Arg("Delta", delta.data_ptr()),
      Arg("stride_ob", kernel_stride(out, 0)), Arg("stride_os", kernel_stride(out, 1)),
      Arg("stride_oh", kernel_stride(out, 2)),
      Arg("stride_dob", kernel_stride(dout, 0)), Arg("stride_dos", kernel_stride(dout, 1)),
      Arg("stride_doh", kernel_stride(dout, 2)),
      Arg("seqlen_q", s.seqlen_q), Arg("num_heads", s.heads), Arg("head_dim", s.head_dim)});

  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const double qk_scale = scale * M_LOG2E;  // the kernels' scores are in the log2 domain
  runtime::launch(dkdv.target,
                  {ceil_div(s.seqlen_k, dkdv.constant("BLOCK_N")), static_cast<unsigned>(s.kv_heads), batch}, {
      Arg("Q", q.data_ptr()), Arg("K", k.data_ptr()), Arg("V", v.data_ptr()), Arg("DO", dout.data_ptr()),
      Arg("Lse", lse.data_ptr()), Arg("Delta", delta.data_ptr()), Arg("DK", dk.data_ptr()),
      Arg("DV", dv.data_ptr()),
      Arg("stride_qb", kernel_stride(q, 0)), Arg("stride_qs", kernel_stride(q, 1)), Arg("stride_qh", kernel_stride(q, 2)),
      Arg("stride_kb", kernel_stride(k, 0)), Arg("stride_ks", kernel_stride(k, 1)), Arg("stride_kh", kernel_stride(k, 2)),
      Arg("stride_vb", kernel_stride(v, 0)), Arg("stride_vs", kernel_stride(v, 1)), Arg("stride_vh", kernel_stride(v, 2)),
      Arg("stride_dob", kernel_stride(dout, 0)), Arg("stride_dos", kernel_stride(dout, 1)),
      Arg("stride_doh", kernel_stride(dout, 2)),
      Arg("stride_dkb", kernel_stride(dk, 0)), Arg("stride_dks", kernel_stride(dk, 1)), Arg("stride_dkh", kernel_stride(dk, 2)),
      Arg("stride_dvb", kernel_stride(dv, 0)), Arg("stride_dvs", kernel_stride(dv, 1)), Arg("stride_dvh", kernel_stride(dv, 2)),
      Arg("seqlen_q", s.seqlen_q), Arg("seqlen_k", s.seqlen_k), Arg("num_heads", s.heads),
      Arg("kv_group_size", s.group()), Arg("head_dim", s.head_dim),
      Arg("qk_scale", qk_scale), Arg("softmax_scale", scale)});

  runtime::launch(dqk.target, {ceil_div(s.seqlen_q, dqk.constant("BLOCK_M")), heads, batch}, {
      Arg("Q", q.data_ptr()), Arg("K", k.data_ptr()), Arg("V", v.data_ptr()), Arg("DO", dout.data_ptr()),
      Arg("Lse", lse.data_ptr()), Arg("Delta", delta.data_ptr()), Arg("DQ", dq.data_ptr()),
      Arg("stride_qb", kernel_stride(q, 0)), Arg("stride_qs", kernel_stride(q, 1)), Arg("stride_qh", kernel_stride(q, 2)),
      Arg("stride_kb", kernel_stride(k, 0)), Arg("stride_ks", kernel_stride(k, 1)), Arg("stride_kh", kernel_stride(k, 2)),
      Arg("stride_vb", kernel_stride(v, 0)), Arg("stride_vs", kernel_stride(v, 1)), Arg("stride_vh", kernel_stride(v, 2)),
      Arg("stride_dob", kernel_stride(dout, 0)), Arg("stride_dos", kernel_stride(dout, 1)),
      Arg("stride_doh", kernel_stride(dout, 2)),
      Arg("stride_dqb", kernel_stride(dq, 0)), Arg("stride_dqs", kernel_stride(dq, 1)), Arg("stride_dqh", kernel_stride(dq, 2)),
      Arg("seqlen_q", s.seqlen_q), Arg("seqlen_k", s.seqlen_k), Arg("num_heads", s.heads),
      Arg("kv_group_size", s.group()), Arg("head_dim", s.head_dim),
      Arg("qk_scale", qk_scale), Arg("softmax_scale", scale)});
  return {dq, dk, dv};
}

}  // namespace fattn::ops
