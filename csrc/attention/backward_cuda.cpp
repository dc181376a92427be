// fattn::backward and fattn::varlen_backward on CUDA, their arguments already checked
// (attention_ops.cpp): delta (preprocess), then dK/dV per key
// tile, then dQ per query tile. Three launches on one stream, no atomics: bitwise
// reproducible. With deterministic=False (flash-attn's default) and where the build has it
// (configs.json: the Hopper dK/dV at d64, and at d128 with softcap or ALiBi), the dK/dV pass
// also adds each tile pair's dQ into a float32 accumulator by bulk reductions, whose order
// varies between runs, and attn_bwd_dq is not launched. One launch sequence serves both layouts
// (attention/kernel_layout.h).
#include <torch/csrc/stable/ops.h>

#include <cstdint>

#include "attention/attention_impl.h"
#include "attention/host_maps.h"
#include "attention/kernel_args.h"
#include "attention/kernel_layout.h"
#include "attention/segment_spans.h"

namespace fattn {
namespace {

using kernels::attn_bwd_dkdv;
using kernels::attn_bwd_dq;
using kernels::attn_bwd_preprocess;

// lse and dlse as the kernels read them: contiguous float32 on a 16-byte aligned base. Their
// strides carry no promise (seqlen_q or total_q need not be a multiple of 8), so a contiguous
// tensor is used as it is.
Tensor float32_contiguous(const Tensor& t) {
  Tensor c = torch::stable::contiguous(torch::stable::to(t, ScalarType::Float));
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : torch::stable::clone(c);
}

}  // namespace

// bias_grad: also dS, the bias's unreduced gradient (dense layout only).
std::tuple<Tensor, Tensor, Tensor, Tensor> launch_backward(
    const char* op, const AttentionShape& s, const AttentionVariant& variant, std::optional<double> softmax_scale,
    Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, const std::optional<Tensor>& dlse,
    bool bias_grad, bool deterministic, const std::optional<Tensor>& cu_seqlens_q,
    const std::optional<Tensor>& cu_seqlens_k, const std::optional<Tensor>& seqused_k) {
  const int device = q.get_device_index();
  const ScalarType dtype = q.scalar_type();
  const auto pre = choose<attn_bwd_preprocess>(op, device, dtype, s.head_dim, {.HAS_DLSE = dlse.has_value()});
  // The variant built for this call's score modifiers where the build has it (the Hopper kernels';
  // attention_variant.h), else the general one; neither narrower dK/dV variant has a dQ part at d128.
  const ScoreModChoice mods = backward_score_mods(variant, bias_grad, s.seqlen_k);
  const bool packed = cu_seqlens_q.has_value();
  const bool empty = s.batch == 0 || s.seqlen_q == 0 || s.seqlen_k == 0 || q.numel() == 0 || k.numel() == 0;
  // The kernels write every element of a dense problem (0 for keys no query sees); packed
  // rows outside every sequence (or past seqused_k) are never written, so they start zeroed,
  // as does an empty problem, which launches nothing.
  auto make = empty || packed ? torch::stable::new_zeros : torch::stable::new_empty;
  const auto none = std::nullopt;
  Tensor dq = make(q, sizes_of(q), none, none, none, none);
  Tensor dk = make(q, sizes_of(k), none, none, none, none);
  Tensor dv = make(q, sizes_of(v), none, none, none, none);
  // Host-made maps of the tensors as given (aligned_for_kernel keeps any tensor a map fits), for
  // the plain dense calls the HOST_MAPS variants serve; the variants without them follow.
  const bool host_maps = wants_host_maps(s.seqlen_q, kBackwardHostMapsUpToRows, packed, false,
                                         seqused_k.has_value(), {&q, &k, &v, &dout, &dq});
  const auto dkdv = choose_first<attn_bwd_dkdv>(
      op, device, dtype, s.head_dim,
      {{.SCORE_MOD = mods.best, .ACCUMULATE_DQ = !deterministic, .HOST_MAPS = host_maps},
       {.SCORE_MOD = mods.best, .ACCUMULATE_DQ = !deterministic, .HOST_MAPS = false},
       {.SCORE_MOD = mods.best, .ACCUMULATE_DQ = false, .HOST_MAPS = host_maps},
       {.SCORE_MOD = mods.best, .ACCUMULATE_DQ = false, .HOST_MAPS = false},
       {.SCORE_MOD = mods.general, .ACCUMULATE_DQ = !deterministic, .HOST_MAPS = false},
       {.SCORE_MOD = mods.general, .ACCUMULATE_DQ = false, .HOST_MAPS = false}});
  const bool dq_in_dkdv = dkdv.constant(attn_bwd_dkdv::ACCUMULATE_DQ) != 0;
  const auto dqk = choose_first<attn_bwd_dq>(op, device, dtype, s.head_dim,
                                             {{.SCORE_MOD = mods.best, .HOST_MAPS = host_maps},
                                              {.SCORE_MOD = mods.best, .HOST_MAPS = false},
                                              {.SCORE_MOD = mods.general, .HOST_MAPS = false}});
  const runtime::Grid pre_grid{ceil_div(s.seqlen_q, pre.constant(attn_bwd_preprocess::BLOCK_M)), dim(s.heads),
                               dim(s.batch)};
  const runtime::Grid dkdv_grid{ceil_div(s.seqlen_k, dkdv.constant(attn_bwd_dkdv::BLOCK_N)), dim(s.kv_heads),
                                dim(s.batch)};
  const runtime::Grid dq_grid{ceil_div(s.seqlen_q, dqk.constant(attn_bwd_dq::BLOCK_M)), dim(s.heads), dim(s.batch)};
  check_grid(op, pre_grid, "query tiles", "heads", "batch");
  check_grid(op, dq_grid, "query tiles", "heads", "batch");
  check_grid(op, dkdv_grid, "key tiles", "kv heads", "batch");

  // dS is written for the (query, key) pairs some tile visits: the rest stays 0.
  Tensor dbias = torch::stable::new_zeros(
      q, bias_grad ? std::vector<int64_t>{s.batch, s.heads, s.seqlen_q, s.seqlen_k} : std::vector<int64_t>{0},
      ScalarType::Float);
  if (empty) return {dq, dk, dv, dbias};

  // dout comes from autograd with whatever strides the graph produced.
  q = aligned_for_kernel(q);
  k = aligned_for_kernel(k);
  v = aligned_for_kernel(v);
  dout = aligned_for_kernel(dout);
  out = aligned_for_kernel(out);
  lse = float32_contiguous(lse);
  Tensor dlse32 = dlse.has_value() ? float32_contiguous(*dlse) : lse;  // not read without HAS_DLSE
  // Shaped like dq, contiguous (head_dim is a multiple of 8, so its rows are 16-byte aligned as the
  // TMA needs); zeroed, since every key tile adds into it. Not read without ACCUMULATE_DQ.
  Tensor dq_accum = dq_in_dkdv ? torch::stable::new_zeros(q, sizes_of(dq), ScalarType::Float) : lse;
  Tensor delta = torch::stable::new_empty(lse, sizes_of(lse));

  LaunchScope scope(lse);
  const RowStrides qs = row_strides(q), ks = row_strides(k), vs = row_strides(v), os = row_strides(out),
                   dos = row_strides(dout), dqs = row_strides(dq), dks = row_strides(dk), dvs = row_strides(dv),
                   dqas = dq_in_dkdv ? row_strides(dq_accum) : RowStrides{0, 0, 0};
  const LseStrides ls = lse_strides(lse);
  kernels::launch_attn_bwd_preprocess(pre, pre_grid, {
      .Out = out.data_ptr(), .DO = dout.data_ptr(), .DLse = dlse32.data_ptr(), .Delta = delta.data_ptr(),
      .stride_ob = os.b, .stride_os = os.s, .stride_oh = os.h, .stride_dob = dos.b, .stride_dos = dos.s,
      .stride_doh = dos.h, .stride_lseb = ls.b, .stride_lseh = ls.h, .CuSeqlensQ = scope.address_of(cu_seqlens_q),
      .use_cu_seqlens = cu_seqlens_q.has_value() ? 1 : 0, .seqlen_q = s.seqlen_q, .head_dim = s.head_dim});

  // What the dK/dV and dQ passes take alike, as the forward took it.
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const kernels::SequencesArgs seqs = sequences_args(scope, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const kernels::ScoresArgs scores = scores_args(scale, variant.softcap);
  const kernels::BiasArgs bias = bias_args(scope, variant.bias);
  const kernels::DropoutArgs dropout = dropout_args(scope, variant);
  const Tensor& dbias_target = bias_grad ? dbias : lse;  // never written without bias_grad
  std::optional<attn_bwd_dkdv::Maps> dkdv_maps;
  if (dkdv.constant(attn_bwd_dkdv::HOST_MAPS)) {
    dkdv_maps = attn_bwd_dkdv::Maps{.Q = map_source(q), .K = map_source(k), .V = map_source(v), .DO = map_source(dout)};
  }
  kernels::launch_attn_bwd_dkdv(dkdv, dkdv_grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .DO = dout.data_ptr(), .Lse = lse.data_ptr(),
      .Delta = delta.data_ptr(), .DK = dk.data_ptr(), .DV = dv.data_ptr(),
      .stride_qb = qs.b, .stride_qs = qs.s, .stride_qh = qs.h, .stride_kb = ks.b, .stride_ks = ks.s,
      .stride_kh = ks.h, .stride_vb = vs.b, .stride_vs = vs.s, .stride_vh = vs.h, .stride_dob = dos.b,
      .stride_dos = dos.s, .stride_doh = dos.h, .stride_dkb = dks.b, .stride_dks = dks.s, .stride_dkh = dks.h,
      .stride_dvb = dvs.b, .stride_dvs = dvs.s, .stride_dvh = dvs.h, .stride_lseb = ls.b, .stride_lseh = ls.h,
      .sequences = seqs, .shape = shape_args(s), .window = window_args(variant), .alibi = alibi_args(scope, variant),
      .segments = segments_args(scope, op, variant, s, SpanOver::kKeyTiles, dkdv.constant(attn_bwd_dkdv::BLOCK_N)),
      .scores = scores, .softmax_scale = scale, .bias = bias, .dropout = dropout,
      .DBias = dbias_target.data_ptr(), .stride_dbiasb = bias_grad ? dbias.stride(0) : 0,
      .stride_dbiash = bias_grad ? dbias.stride(1) : 0, .stride_dbiasq = bias_grad ? dbias.stride(2) : 0,
      .write_dbias = bias_grad ? 1 : 0, .DQAccum = dq_accum.data_ptr(), .stride_dqab = dqas.b,
      .stride_dqas = dqas.s, .stride_dqah = dqas.h}, dkdv_maps ? &*dkdv_maps : nullptr);
  if (dq_in_dkdv) {
    torch::stable::copy_(dq, dq_accum);  // to q's dtype
    return {dq, dk, dv, dbias};
  }
  std::optional<attn_bwd_dq::Maps> dq_maps;
  if (dqk.constant(attn_bwd_dq::HOST_MAPS)) {
    dq_maps = attn_bwd_dq::Maps{.Q = map_source(q), .K = map_source(k), .V = map_source(v), .DO = map_source(dout),
                                .DQ = map_source(dq)};
  }
  kernels::launch_attn_bwd_dq(dqk, dq_grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .DO = dout.data_ptr(), .Lse = lse.data_ptr(),
      .Delta = delta.data_ptr(), .DQ = dq.data_ptr(),
      .stride_qb = qs.b, .stride_qs = qs.s, .stride_qh = qs.h, .stride_kb = ks.b, .stride_ks = ks.s,
      .stride_kh = ks.h, .stride_vb = vs.b, .stride_vs = vs.s, .stride_vh = vs.h, .stride_dob = dos.b,
      .stride_dos = dos.s, .stride_doh = dos.h, .stride_dqb = dqs.b, .stride_dqs = dqs.s, .stride_dqh = dqs.h,
      .stride_lseb = ls.b, .stride_lseh = ls.h,
      .sequences = seqs, .shape = shape_args(s), .window = window_args(variant), .alibi = alibi_args(scope, variant),
      .segments = segments_args(scope, op, variant, s, SpanOver::kQueryTiles, dqk.constant(attn_bwd_dq::BLOCK_M)),
      .scores = scores, .softmax_scale = scale, .bias = bias, .dropout = dropout}, dq_maps ? &*dq_maps : nullptr);
  return {dq, dk, dv, dbias};
}

}  // namespace fattn
