// fattn::decode on CUDA: append the new tokens, attend split-K, merge the splits.
//
// Up to three launches, all sized from shapes alone (never from cache_seqlens, which
// stays on the device), so a decode step can be captured in a CUDA graph and replayed
// with new lengths: kv_append (when k/v are given), attn_decode_split, and
// attn_decode_merge (when there is more than one split).
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ops/attention_inputs.h"
#include "ops/decode_inputs.h"
#include "ops/kernel_choice.h"
#include "ops/ops.h"
#include "runtime/cuda_driver.h"
#include "runtime/launch.h"

namespace fattn::ops {
namespace {

using torch::headeronly::ScalarType;
using runtime::Arg;
constexpr const char* kOp = "fattn.decode";
constexpr int64_t kMaxGridYZ = 65535;
// The automatic split count, from the H100 sweeps of benchmarks/bench_decode.py (NOTES.md):
// as many splits as keep every program in the first wave, one program per SM. A second,
// partial wave costs more than it adds: 17 splits x 8 KV heads on 132 SMs ran 20 %
// slower than 16. Chunks never shrink below kMinTilesPerSplit key tiles.
constexpr int64_t kMinTilesPerSplit = 2;
constexpr int64_t kMaxAutoSplits = 64;

int64_t auto_num_splits(int64_t programs, int64_t capacity, int64_t block_n, int device) {
  const int64_t sms = cuda::multiprocessor_count(device);
  const int64_t shortest = std::max<int64_t>(1, capacity / (kMinTilesPerSplit * block_n));
  return std::clamp<int64_t>(std::min(sms / programs, shortest), 1, kMaxAutoSplits);
}

// The kernels write the cache in place, so it cannot be swapped for an aligned copy
// the way read-only inputs are (aligned_for_kernel); without an append it can.
Tensor cache_for_kernel(const char* name, const Tensor& cache, bool written) {
  Tensor aligned = aligned_for_kernel(cache);
  if (written && aligned.data_ptr() != cache.data_ptr()) {
    std::string strides;
    for (int64_t d = 0; d < cache.dim(); ++d) strides += (d ? ", " : "") + std::to_string(cache.stride(d));
    fail(kOp, name, " must start 16-byte aligned with strides that are multiples of 8 elements to be ",
         "appended to in place; got strides [", strides, "]");
  }
  return aligned;
}

}  // namespace

std::tuple<Tensor, Tensor> decode_cuda(Tensor q, Tensor k_cache, Tensor v_cache, std::optional<Tensor> k,
                                       std::optional<Tensor> v, std::optional<Tensor> cache_seqlens,
                                       std::optional<Tensor> block_table, std::optional<double> softmax_scale,
                                       bool causal, int64_t window_left, int64_t window_right, double softcap,
                                       int64_t num_splits) {
  const DecodeShape s = check_decode_inputs(kOp, q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                            softmax_scale, causal, window_left, window_right, softcap, num_splits);
  if (s.capacity > INT32_MAX || s.num_pages > INT32_MAX) {
    fail(kOp, "the cache holds ", s.capacity, " keys per sequence; at most 2^31 - 1 are supported");
  }
  const int device = q.get_device_index();
  const auto dtype = q.scalar_type();
  const KernelChoice split = choose_kernel(kOp, "attn_decode_split", device, dtype, s.head_dim,
                                           {{"PAGED", s.paged ? 1 : 0}});
  const int64_t block_m = split.constant("BLOCK_M");
  const int64_t row_tiles = (s.seqlen_q * s.group() + block_m - 1) / block_m;
  if (s.batch > kMaxGridYZ || s.kv_heads * row_tiles > kMaxGridYZ || s.heads > kMaxGridYZ) {
    fail(kOp, "batch (", s.batch, "), heads (", s.heads, ") and kv_heads x query tiles (", s.kv_heads * row_tiles,
         ") must each be at most 65535");
  }
  const int64_t splits = num_splits > 0 ? num_splits
                                        : auto_num_splits(s.batch * s.kv_heads * row_tiles, s.capacity,
                                                          split.constant("BLOCK_N"), device);

  Tensor out = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse = torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (s.batch == 0) return {out, lse};

  q = aligned_for_kernel(q);
  k_cache = cache_for_kernel("k_cache", k_cache, k.has_value());
  v_cache = cache_for_kernel("v_cache", v_cache, k.has_value());
  Tensor seqlens;
  if (cache_seqlens) {
    seqlens = torch::stable::contiguous(*cache_seqlens);
  } else {  // every sequence fills its cache
    seqlens = torch::stable::new_empty(q, {s.batch}, ScalarType::Int);
    torch::stable::fill_(seqlens, static_cast<double>(s.capacity));
  }
  const void* table = block_table ? block_table->data_ptr() : nullptr;
  const int64_t stride_tb = block_table ? block_table->stride(0) : 0;

  if (k && s.seqlen_new > 0) {
    Tensor k_new = aligned_for_kernel(*k), v_new = aligned_for_kernel(*v);
    const KernelChoice append = choose_kernel(kOp, "kv_append", device, dtype, s.head_dim,
                                              {{"PAGED", s.paged ? 1 : 0}});
    runtime::launch(append.target,
                    {static_cast<unsigned>(s.seqlen_new), static_cast<unsigned>(s.kv_heads),
                     static_cast<unsigned>(s.batch)},
                    {Arg("KNew", k_new.data_ptr()), Arg("VNew", v_new.data_ptr()), Arg("KCache", k_cache.data_ptr()),
                     Arg("VCache", v_cache.data_ptr()), Arg("CacheSeqlens", seqlens.data_ptr()),
                     Arg("BlockTable", table),
                     Arg("stride_nkb", kernel_stride(k_new, 0)), Arg("stride_nks", kernel_stride(k_new, 1)),
                     Arg("stride_nkh", kernel_stride(k_new, 2)),
                     Arg("stride_nvb", kernel_stride(v_new, 0)), Arg("stride_nvs", kernel_stride(v_new, 1)),
                     Arg("stride_nvh", kernel_stride(v_new, 2)),
                     Arg("stride_kb", kernel_stride(k_cache, 0)), Arg("stride_ks", kernel_stride(k_cache, 1)),
                     Arg("stride_kh", kernel_stride(k_cache, 2)),
                     Arg("stride_vb", kernel_stride(v_cache, 0)), Arg("stride_vs", kernel_stride(v_cache, 1)),
                     Arg("stride_vh", kernel_stride(v_cache, 2)),
                     Arg("stride_tb", stride_tb), Arg("page_size", s.page_size), Arg("capacity", s.capacity),
                     Arg("head_dim", s.head_dim)});
  }
  if (out.numel() == 0) return {out, lse};  // no query heads: the append was all there was to do

  // fp32 partials, one [batch, seqlen_q, heads, head_dim] slab (and lse slab) per split.
  Tensor part_out, part_lse;
  if (splits > 1) {
    part_out = torch::stable::new_empty(q, {splits, s.batch, s.seqlen_q, s.heads, s.head_dim}, ScalarType::Float);
    part_lse = torch::stable::new_empty(q, {splits, s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  }
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  // Scores are kept in the log2 domain. With a softcap the kernel computes
  // softcap * log2(e) * tanh(q.k * scale / softcap); otherwise q.k * scale * log2(e).
  const double qk_scale = softcap > 0 ? scale / softcap : scale * M_LOG2E;
  const double softcap_log2 = softcap > 0 ? softcap * M_LOG2E : 0.0;
  runtime::launch(split.target,
                  {static_cast<unsigned>(splits), static_cast<unsigned>(s.kv_heads * row_tiles),
                   static_cast<unsigned>(s.batch)},
                  {Arg("Q", q.data_ptr()), Arg("KCache", k_cache.data_ptr()), Arg("VCache", v_cache.data_ptr()),
                   Arg("CacheSeqlens", seqlens.data_ptr()), Arg("BlockTable", table),
                   Arg("PartOut", splits > 1 ? part_out.data_ptr() : nullptr),
                   Arg("PartLse", splits > 1 ? part_lse.data_ptr() : nullptr),
                   Arg("Out", out.data_ptr()), Arg("Lse", lse.data_ptr()),
                   Arg("stride_qb", kernel_stride(q, 0)), Arg("stride_qs", kernel_stride(q, 1)),
                   Arg("stride_qh", kernel_stride(q, 2)),
                   Arg("stride_kb", kernel_stride(k_cache, 0)), Arg("stride_ks", kernel_stride(k_cache, 1)),
                   Arg("stride_kh", kernel_stride(k_cache, 2)),
                   Arg("stride_vb", kernel_stride(v_cache, 0)), Arg("stride_vs", kernel_stride(v_cache, 1)),
                   Arg("stride_vh", kernel_stride(v_cache, 2)),
                   Arg("stride_tb", stride_tb),
                   Arg("seqlen_q", s.seqlen_q), Arg("num_heads", s.heads), Arg("kv_group_size", s.group()),
                   Arg("head_dim", s.head_dim), Arg("seqlen_new", s.seqlen_new), Arg("capacity", s.capacity),
                   Arg("page_size", s.page_size), Arg("num_splits", splits),
                   Arg("window_left", s.window_left), Arg("window_right", s.window_right),
                   Arg("qk_scale", qk_scale), Arg("softcap_log2", softcap_log2)});
  if (splits > 1) {
    const KernelChoice merge = choose_kernel(kOp, "attn_decode_merge", device, dtype, s.head_dim, {});
    runtime::launch(merge.target,
                    {static_cast<unsigned>(s.seqlen_q), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch)},
                    {Arg("PartOut", part_out.data_ptr()), Arg("PartLse", part_lse.data_ptr()),
                     Arg("Out", out.data_ptr()), Arg("Lse", lse.data_ptr()),
                     Arg("num_rows", s.batch * s.seqlen_q * s.heads), Arg("num_splits", splits),
                     Arg("seqlen_q", s.seqlen_q), Arg("num_heads", s.heads), Arg("head_dim", s.head_dim)});
  }
  return {out, lse};
}

}  // namespace fattn::ops
