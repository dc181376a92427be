// fattn::forward and fattn::varlen_forward on CUDA, their arguments already checked
// (attention_ops.cpp): pick the compiled variant, allocate, launch. One launch serves both
// layouts (attention/kernel_layout.h).
#include <torch/csrc/stable/ops.h>

#include "attention/attention_impl.h"
#include "attention/host_maps.h"
#include "attention/kernel_args.h"
#include "attention/kernel_layout.h"
#include "attention/query_tile_programs.h"
#include "attention/segment_spans.h"
#include "runtime/cuda_driver.h"

namespace fattn {
namespace {

using kernels::attn_fwd;
using kernels::fp8_transpose_v;

// V^T of an FP8 V, each sequence's keys from the start of a row of `columns` keys (zeros past
// its end): what attn_fwd's FP8 variants read (triton_src/fp8.py says why). key_order 1: each
// 32 keys in the order of the Hopper kernel's FP8 P (forward_sm90._p_operand).
Tensor transposed_fp8_v(const char* op, const AttentionShape& s, const Tensor& v, int64_t columns,
                        const kernels::SequencesArgs& seqs, int64_t key_order) {
  Tensor vt = torch::stable::new_empty(v, {s.batch, s.kv_heads, s.head_dim, columns});
  const auto transpose = choose<fp8_transpose_v>(op, v.get_device_index(), ScalarType::BFloat16, 0, {});
  const runtime::Grid grid{dim(ceil_div(columns, transpose.constant(fp8_transpose_v::BLOCK_S))), dim(s.kv_heads),
                           dim(s.batch)};
  check_grid(op, grid, "key tiles", "kv heads", "batch");
  if (vt.numel() == 0) return vt;
  const RowStrides vs = row_strides(v);
  kernels::launch_fp8_transpose_v(transpose, grid, {
      .V = v.data_ptr(), .Vt = vt.data_ptr(), .stride_vb = vs.b, .stride_vs = vs.s, .stride_vh = vs.h,
      .stride_tb = vt.stride(0), .stride_th = vt.stride(1), .stride_td = vt.stride(2),
      .CuSeqlensK = seqs.CuSeqlensK, .SequsedK = seqs.SequsedK, .use_cu_seqlens = seqs.use_cu_seqlens,
      .use_seqused_k = seqs.use_seqused_k, .seqlen_k = s.seqlen_k, .head_dim = s.head_dim, .columns = columns,
      .key_order = key_order,
  });
  return vt;
}

}  // namespace

// cu_seqlens_q/k and seqused_k: packed inputs (q [total_q, heads, head_dim]) when given.
std::tuple<Tensor, Tensor> launch_forward(const char* op, const AttentionShape& s, const AttentionVariant& variant,
                                          std::optional<double> softmax_scale, Tensor q, Tensor k, Tensor v,
                                          const std::optional<Tensor>& sinks, const Fp8Inputs& fp8,
                                          const std::optional<Tensor>& cu_seqlens_q,
                                          const std::optional<Tensor>& cu_seqlens_k,
                                          const std::optional<Tensor>& seqused_k) {
  const bool packed = cu_seqlens_q.has_value();
  // Where the build has both kernels of a bucket, the length picks one; elsewhere the one
  // built serves every length.
  // A variant's dtype is its output's; float8 inputs are its FP8 flag (common/fp8.h).
  const ScalarType out_dtype = forward_output_dtype(q.scalar_type());
  const int64_t fp8_kind = fp8_flag(q.scalar_type());
  const ArchChoice arch = choose_arch(op, attn_fwd::kId, attn_fwd::kName, q.get_device_index());
  if (fp8.active && arch.arch < 89) {
    // An sm_89 GPU runs sm_86's cubins where the build has no sm_89 ones (FATTN_CUDA_ARCHS without 89).
    const int device_arch = cuda::compute_capability(q.get_device_index());
    if (device_arch >= 89 && !arch.from_ptx) {
      fail(op, "float8 q, k and v need FP8 kernels for sm_89 or sm_90, and this GPU (sm_", device_arch,
           ") runs this build's sm_", arch.arch, " ones; build with FATTN_CUDA_ARCHS including ", device_arch);
    }
    fail(op, "float8 q, k and v need FP8 tensor cores (sm_89 or sm_90); this GPU is sm_", arch.arch);
  }
  const int bucket = choose_bucket(op, attn_fwd::kId, attn_fwd::kName, arch, kernel_dtype(out_dtype), s.head_dim);
  // The Hopper kernel loads by TMA, which needs 16-byte aligned rows: FP8 rows of a head dim that
  // is 8 mod 16 (or views with such strides) run attn_fwd.
  const bool loop_allowed = !fp8.active || (meets_stride_multiple(q, 16) && meets_stride_multiple(k, 16));
  const bool tile_loop =
      loop_allowed && prefers_tile_loop(arch.arch, bucket, s.seqlen_q, packed, variant.window_right >= 0);
  // The variant built for this call's score modifiers where the build has it (the Hopper kernel's),
  // else the general one (attention_variant.h).
  const ScoreModChoice mods = forward_score_mods(variant);
  const bool host_maps =
      wants_host_maps(s.seqlen_q, kHostMapsUpToRows, packed, fp8.active, seqused_k.has_value(), {&q, &k, &v});
  const auto fwd = loop_allowed
      ? choose_first<attn_fwd>(op, q.get_device_index(), out_dtype, s.head_dim,
                               {{.SCORE_MOD = mods.best, .TILE_LOOP = tile_loop, .FP8 = fp8_kind, .HOST_MAPS = host_maps},
                                {.SCORE_MOD = mods.best, .TILE_LOOP = tile_loop, .FP8 = fp8_kind, .HOST_MAPS = false},
                                {.SCORE_MOD = mods.best, .TILE_LOOP = !tile_loop, .FP8 = fp8_kind, .HOST_MAPS = false},
                                {.SCORE_MOD = mods.general, .TILE_LOOP = tile_loop, .FP8 = fp8_kind, .HOST_MAPS = false},
                                {.SCORE_MOD = mods.general, .TILE_LOOP = !tile_loop, .FP8 = fp8_kind, .HOST_MAPS = false}})
      : choose_first<attn_fwd>(op, q.get_device_index(), out_dtype, s.head_dim,
                               {{.SCORE_MOD = mods.general, .TILE_LOOP = false, .FP8 = fp8_kind, .HOST_MAPS = false}});
  const int64_t tiles = ceil_div(s.seqlen_q, fwd.constant(attn_fwd::BLOCK_M));
  // Packed sequences keep one tile per program: their lengths differ, and the GPU balances
  // short programs itself.
  const int64_t programs = fwd.constant(attn_fwd::TILE_LOOP) && !packed
      ? query_tile_programs(tiles, s.heads * s.batch, cuda::multiprocessor_count(q.get_device_index()),
                            variant.window_right >= 0)
      : tiles;
  const runtime::Grid grid{dim(programs), dim(s.heads), dim(s.batch)};
  check_grid(op, grid, "query tiles", "heads", "batch");

  // Packed outputs start zeroed: rows outside every sequence are never written.
  Tensor out = packed ? torch::stable::new_zeros(q, sizes_of(q), out_dtype)
                      : torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim}, out_dtype);
  Tensor lse = packed ? torch::stable::new_zeros(q, {s.heads, q.size(0)}, ScalarType::Float)
                      : torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0 || grid.x == 0 || grid.z == 0) return {out, lse};

  q = aligned_for_kernel(q);
  k = aligned_for_kernel(k);
  v = aligned_for_kernel(v);
  LaunchScope scope(lse);
  const kernels::SequencesArgs seqs = sequences_args(scope, cu_seqlens_q, cu_seqlens_k, seqused_k);
  // FP8 V is read as V^T, one row of keys per (sequence, KV head, dim), padded to whole tiles.
  const int64_t v_columns = fp8.active ? ceil_div(s.seqlen_k, fwd.constant(attn_fwd::BLOCK_N)) *
                                             fwd.constant(attn_fwd::BLOCK_N) : 0;
  // The Hopper kernel (the looping one) reads its keys in its P's order.
  if (fp8.active) v = transposed_fp8_v(op, s, v, v_columns, seqs, fwd.constant(attn_fwd::TILE_LOOP) ? 1 : 0);
  const RowStrides qs = row_strides(q), ks = row_strides(k), os = row_strides(out);
  const RowStrides vs = fp8.active ? RowStrides{v.stride(0), 0, v.stride(1)} : row_strides(v);
  const LseStrides ls = lse_strides(lse);
  // The variant chosen takes the four tensors as maps (made from the tensors as they are now:
  // aligned_for_kernel kept any tensor wants_host_maps accepted).
  std::optional<attn_fwd::Maps> maps;
  if (fwd.constant(attn_fwd::HOST_MAPS)) {
    maps = attn_fwd::Maps{.Q = map_source(q), .K = map_source(k), .V = map_source(v), .Out = map_source(out)};
  }
  kernels::launch_attn_fwd(fwd, grid, {
      .Q = q.data_ptr(), .K = k.data_ptr(), .V = v.data_ptr(), .Out = out.data_ptr(), .Lse = lse.data_ptr(),
      .stride_qb = qs.b, .stride_qs = qs.s, .stride_qh = qs.h, .stride_kb = ks.b, .stride_ks = ks.s,
      .stride_kh = ks.h, .stride_vb = vs.b, .stride_vs = vs.s, .stride_vh = vs.h, .stride_ob = os.b,
      .stride_os = os.s, .stride_oh = os.h, .stride_lseb = ls.b, .stride_lseh = ls.h,
      .sequences = seqs,
      .shape = shape_args(s),
      .window = window_args(variant),
      .alibi = alibi_args(scope, variant),
      .segments = segments_args(scope, op, variant, s, SpanOver::kQueryTiles, fwd.constant(attn_fwd::BLOCK_M)),
      .scores = scores_args(resolve_softmax_scale(softmax_scale, s.head_dim), variant.softcap),
      .sinks = sinks_args(scope, sinks),
      .bias = bias_args(scope, variant.bias),
      .dropout = dropout_args(scope, variant),
      .fp8_inputs = fp8_inputs_args(scope, fp8, s, fp8.active ? v.stride(2) : 0),
  }, maps ? &*maps : nullptr);
  return {out, lse};
}

}  // namespace fattn
