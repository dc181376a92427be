// fattn::decode on CUDA, its arguments already checked (decode_op.cpp): append the new tokens,
// attend split-K, merge the splits.
//
// Up to four launches, all sized from shapes alone (never from cache_seqlens, which stays
// on the device), so a decode step can be captured in a CUDA graph and replayed with new
// lengths: kv_append (when k/v are given), rotate_queries (with a rotary embedding),
// attn_decode_split, and attn_decode_merge (when there is more than one split). Query chunks
// longer than kDecodeQueriesPerNarrowTile tokens (chunked prefill) take attn_decode_split's
// wide row tile.
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention/attention_variant.h"
#include "attention/kernel_args.h"
#include "common/fp8.h"
#include "common/kernel_choice.h"
#include "decode/decode_impl.h"
#include "runtime/cuda_driver.h"

namespace fattn {
namespace {

using kernels::attn_decode_merge;
using kernels::attn_decode_split;
using kernels::kv_append;
using kernels::rotate_queries;
constexpr const char* kOp = "fattn.decode";
// The automatic split count: two programs per SM where its shared memory holds two and each
// program still reads kKeysForTwoPerSm keys, else one per SM; rounded down to a power of two.
// In the H200 sweeps of benchmarks/bench_decode.py --num-splits (GQA 32/8, d128; docs/notes/decode.md
// D15, D16) the fastest count gave 256 programs on 132 SMs at every batch from 8k keys up (32 splits
// at batch 1, 4 at batch 8), 1.05-1.20x one program per SM; 24 and 48 splits ran slower than their
// power-of-two neighbours. Below that, programs of a few tiles each ran faster one per SM: at batch
// 1, 16 splits against 32 took 0.81x the time at 1k keys, 0.90x at 4k, 0.97x at 8k, 1.02x at 16k.
// A split holds at least one key tile.
constexpr int64_t kProgramsPerSm = 2;
constexpr int64_t kKeysForTwoPerSm = 512;
constexpr int64_t kMaxAutoSplits = 64;

// Programs of the split kernel an SM holds at once (1 KB of shared memory reserved per program):
// its shared memory binds before its warps or registers do.
int64_t resident_programs(const runtime::KernelEntry& split, int device) {
  return std::max<int64_t>(1, cuda::shared_memory_per_multiprocessor(device) / (split.shared_bytes + 1024));
}

int64_t floor_pow2(int64_t n) {
  int64_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int64_t auto_num_splits(int64_t programs, int64_t capacity, const runtime::KernelEntry& split, int device) {
  const int64_t block_n = split.constants[attn_decode_split::BLOCK_N].value;
  const int64_t sms = cuda::multiprocessor_count(device);
  const int64_t per_sm = std::min(kProgramsPerSm, resident_programs(split, device));
  int64_t splits = floor_pow2(std::max<int64_t>(1, sms * per_sm / programs));
  if (per_sm > 1 && capacity / splits < kKeysForTwoPerSm) splits = floor_pow2(std::max<int64_t>(1, sms / programs));
  const int64_t shortest = std::max<int64_t>(1, capacity / block_n);
  return std::clamp<int64_t>(std::min(splits, shortest), 1, kMaxAutoSplits);
}

// FP8 caches: the split kernel converts every K and V value, and one program per SM leaves the
// loads short of the bandwidth. In the H200 sweep of tuning/tune_decode.py --kv-dtype e4m3
// (docs/notes/decode.md D13) the fastest counts filled every SM with as many programs as its shared memory
// holds, in whole waves, with chunks of about kFp8KeysPerSplit keys: 32 splits at batch 1 / 128k
// (48 ran 31 % slower: a partial second wave), 16 at batch 8 / 64k (where the bf16 rule gives 4).
constexpr int64_t kFp8KeysPerSplit = 4096;
constexpr int64_t kFp8MinTilesPerSplit = 2;

int64_t fp8_num_splits(int64_t programs, int64_t capacity, const runtime::KernelEntry& split, int device) {
  const int64_t block_n = split.constants[attn_decode_split::BLOCK_N].value;
  const int64_t slots = cuda::multiprocessor_count(device) * resident_programs(split, device);
  const int64_t wanted = std::max<int64_t>(1, capacity / kFp8KeysPerSplit);
  const int64_t waves = (wanted * programs + slots - 1) / slots;
  const int64_t shortest = std::max<int64_t>(1, capacity / (kFp8MinTilesPerSplit * block_n));
  return std::clamp<int64_t>(std::min(waves * slots / programs, shortest), 1, kMaxAutoSplits);
}

// An FP8 cache read by the split kernel's exact-dim code (PAD_D 0) promises strides that are
// multiples of 16 elements (16 bytes: its K rows load 16 FP8 values at a time, triton_src/decode.py
// _wide_fp8_stride); every other cache, aligned_for_kernel's 8 (meets_stride_multiple).

// The kernels write the cache in place, so it cannot be swapped for an aligned copy the way
// read-only inputs are (aligned_for_kernel); without an append it can.
Tensor cache_for_kernel(const char* name, const Tensor& cache, bool written, int64_t stride_multiple) {
  Tensor aligned = aligned_for_kernel(cache);
  if (!meets_stride_multiple(aligned, stride_multiple)) aligned = torch::stable::clone(torch::stable::contiguous(cache));
  if (written && aligned.data_ptr() != cache.data_ptr()) {
    std::string strides;
    for (int64_t d = 0; d < cache.dim(); ++d) strides += (d ? ", " : "") + std::to_string(cache.stride(d));
    fail(kOp, name, " must start 16-byte aligned with strides that are multiples of ", stride_multiple,
         " elements to be appended to in place; got strides [", strides, "]");
  }
  return aligned;
}

// An FP8 KV cache: the kernels are built for sm_89 and sm_90 only (aot_build/configs.json), whose
// FP8 conversions they use. Checked before any write, naming the GPU and the code serving it.
void check_fp8_arch(int device, ScalarType cache_dtype) {
  const ArchChoice a = choose_arch(kOp, attn_decode_split::kId, attn_decode_split::kName, device);
  if (a.arch == 89 || a.arch == 90) return;
  const int device_arch = cuda::compute_capability(device);
  if (device_arch == 89 || device_arch == 90) {
    fail(kOp, "an FP8 KV cache (", dtype_name(cache_dtype), ") needs sm_89 or sm_90 kernels; cuda:", device,
         " is sm_", device_arch, " but this build serves it with sm_", a.arch, " code. Rebuild with ",
         "FATTN_CUDA_ARCHS including ", device_arch);
  }
  fail(kOp, "an FP8 KV cache (", dtype_name(cache_dtype), ") needs sm_89 or sm_90; this GPU (cuda:", device,
       ") is sm_", device_arch);
}

// Whether the split kernel may look a paged cache up once per key tile (PAGE_TILES): its pages
// hold whole key tiles, and a page's keys lie within 32-bit offsets of the page's start (the
// decoding tile forms slot * slot stride + feature in 32 bits). The kernel may read a contiguous
// copy of the cache (cache_for_kernel), whose slot stride is kv_heads * head_dim.
bool page_tiles_fit(const DecodeShape& s, const Tensor& k_cache, const Tensor& v_cache, int64_t block_n) {
  const int64_t slot_stride = std::max({k_cache.stride(1), v_cache.stride(1), s.kv_heads * s.head_dim});
  return s.page_size % block_n == 0 && s.page_size * slot_stride + s.head_dim <= INT32_MAX;
}

// Where the cache's rows are: the tensors the kernels read, the block table's view and the
// optional row indirection.
struct CacheView {
  Tensor k, v, seqlens;
  const void* table;
  int64_t stride_tb;
  const void* batch_idx;  // int32 [batch] (contiguous, like cache_seqlens), or a placeholder
};

// The rotary tables as the kernels read them (a placeholder pointer when there are none).
struct RotaryArgs {
  const void* cos;
  const void* sin;
  int64_t stride;
};

void append(const runtime::Variant<kv_append>& kernel, runtime::Grid grid, const DecodeShape& s, const CacheView& c,
            const RotaryArgs& r, const Tensor& k, const Tensor& v, const kernels::CacheDescalesArgs& descales) {
  const Tensor k_new = aligned_for_kernel(k), v_new = aligned_for_kernel(v);
  kernels::launch_kv_append(kernel, grid, {
      .KNew = k_new.data_ptr(), .VNew = v_new.data_ptr(), .KCache = c.k.data_ptr(), .VCache = c.v.data_ptr(),
      .CacheSeqlens = c.seqlens.data_ptr(), .BlockTable = c.table, .CacheBatchIdx = c.batch_idx,
      .RotaryCos = r.cos, .RotarySin = r.sin,
      .stride_nkb = kernel_stride(k_new, 0), .stride_nks = kernel_stride(k_new, 1), .stride_nkh = kernel_stride(k_new, 2),
      .stride_nvb = kernel_stride(v_new, 0), .stride_nvs = kernel_stride(v_new, 1), .stride_nvh = kernel_stride(v_new, 2),
      .stride_kb = kernel_stride(c.k, 0), .stride_ks = kernel_stride(c.k, 1), .stride_kh = kernel_stride(c.k, 2),
      .stride_vb = kernel_stride(c.v, 0), .stride_vs = kernel_stride(c.v, 1), .stride_vh = kernel_stride(c.v, 2),
      .stride_tb = c.stride_tb, .page_size = s.page_size, .capacity = s.capacity, .head_dim = s.head_dim,
      .use_batch_idx = s.batch_idx ? 1 : 0, .stride_ro = r.stride, .seqlen_ro = s.seqlen_ro,
      .rotary_dim = s.rotary_dim, .rotary_interleaved = s.rotary_interleaved ? 1 : 0,
      .cache_descales = descales});
}

// FATTN_DEBUG_CHECKS=1 (read per call, so a test or a debugging session can flip it): the
// device's values (lengths, rows, padding, page table) are copied to the host and checked as
// the CPU implementation checks them, before any write or launch. A host sync per call.
bool debug_checks() {
  const char* text = std::getenv("FATTN_DEBUG_CHECKS");
  return text != nullptr && std::string(text) == "1";
}

}  // namespace

std::tuple<Tensor, Tensor> launch_decode(const DecodeShape& s, const DecodeInputs& in) {
  Tensor q = in.q;
  const Tensor &k_cache = in.k_cache, &v_cache = in.v_cache;
  const std::optional<Tensor>&k = in.k, &v = in.v, &rotary_cos = in.rotary_cos, &rotary_sin = in.rotary_sin,
                             &cache_seqlens = in.cache_seqlens, &cache_batch_idx = in.cache_batch_idx,
                             &cache_leftpad = in.cache_leftpad, &block_table = in.block_table,
                             &alibi_slopes = in.alibi_slopes, &sinks = in.sinks, &k_descale = in.k_descale,
                             &v_descale = in.v_descale;
  const std::optional<double> softmax_scale = in.softmax_scale;
  const double softcap = in.softcap;
  const int64_t num_splits = in.num_splits;
  // The kernels' limits: they index the cache and the rotary tables in 32 bits (the CPU
  // implementation has no such limit).
  if (s.capacity > INT32_MAX || s.num_pages > INT32_MAX || s.seqlen_ro > INT32_MAX) {
    fail(kOp, "the cache holds ", s.capacity, " keys per sequence and rotary_cos ", s.seqlen_ro,
         " positions; at most 2^31 - 1 are supported");
  }
  if (debug_checks()) check_decode_values(kOp, s, host_decode_indices(in).indices);
  const int device = q.get_device_index();
  // The kernels' element type is q's; an FP8 cache is reinterpreted by the KV_FP8 variants.
  const ScalarType dtype = q.scalar_type();
  const int64_t fp8 = s.kv_fp8;
  if (fp8 != 0) check_fp8_arch(device, k_cache.scalar_type());
  // The row tile: narrow for decoding (0); wide for longer query chunks, with the softcap and
  // ALiBi code only when one of them is on (2), else without (1). The narrow tile serves any
  // length, and does where the build has no wide tile (sm_75, and FP8 caches: configs.json "exclude").
  const int64_t wide =
      s.seqlen_q <= kDecodeQueriesPerNarrowTile || fp8 != 0 ? 0 : (softcap > 0 || alibi_slopes) ? 2 : 1;
  // The FP8 exact-dim code promises 16-element cache strides; a cache without them (a fused or
  // padded view) runs the padded code rather than a copy of the whole cache per call.
  const bool exact_dim = fp8 == 0 || (meets_stride_multiple(k_cache, 16) && meets_stride_multiple(v_cache, 16));
  // Preferences, best first: this row tile looking a paged cache's pages up once per key tile
  // (1.04-1.12x as fast as the per-key lookups for decoding on the H200, 1.34-1.39x for query
  // chunks, docs/notes/decode.md D16-D17; the build has it for 16-bit caches, configs.json), the
  // same tile with per-key lookups, then the decoding tile, with page tiles before without. Each
  // step down is taken only where the build lacks the one above, so a missing variant never
  // silently trades the wide tile for the narrow one (sm_75 builds no wide tile).
  const attn_decode_split::Flags tiled{.PAGED = s.paged, .WIDE = wide, .KV_FP8 = fp8, .PAGE_TILES = s.paged};
  const attn_decode_split::Flags per_key{.PAGED = s.paged, .WIDE = wide, .KV_FP8 = fp8, .PAGE_TILES = false};
  const attn_decode_split::Flags narrow_tiled{.PAGED = s.paged, .WIDE = 0, .KV_FP8 = fp8, .PAGE_TILES = s.paged};
  const attn_decode_split::Flags narrow{.PAGED = s.paged, .WIDE = 0, .KV_FP8 = fp8, .PAGE_TILES = false};
  auto split = choose_first<attn_decode_split>(kOp, device, dtype, s.head_dim, {tiled, per_key, narrow_tiled, narrow},
                                               exact_dim);
  if (split.constant(attn_decode_split::PAGE_TILES) != 0 &&
      !page_tiles_fit(s, k_cache, v_cache, split.constant(attn_decode_split::BLOCK_N))) {
    split = choose_first<attn_decode_split>(kOp, device, dtype, s.head_dim, {per_key, narrow}, exact_dim);
  }
  const auto merge = choose<attn_decode_merge>(kOp, device, dtype, s.head_dim, {});
  const auto kv = choose<kv_append>(kOp, device, dtype, s.head_dim, {.PAGED = s.paged, .KV_FP8 = fp8});
  const int64_t cache_stride_multiple = fp8 != 0 && split.constant(attn_decode_split::PAD_D) == 0 ? 16 : 8;
  const auto rotate = choose<rotate_queries>(kOp, device, dtype, s.head_dim, {});
  const int64_t block_m = split.constant(attn_decode_split::BLOCK_M);
  const int64_t row_tiles = (s.seqlen_q * s.group() + block_m - 1) / block_m;
  const int64_t programs = std::max<int64_t>(1, s.batch * s.kv_heads * row_tiles);  // batch 0 returns below
  const int64_t splits = num_splits > 0 ? num_splits
                         : fp8 != 0     ? fp8_num_splits(programs, s.capacity, *split.target.entry, device)
                                        : auto_num_splits(programs, s.capacity, *split.target.entry, device);
  const runtime::Grid split_grid{dim(splits), dim(s.kv_heads * row_tiles), dim(s.batch)};
  const runtime::Grid merge_grid{dim(s.seqlen_q), dim(s.heads), dim(s.batch)};
  const runtime::Grid append_grid{dim(s.seqlen_new), dim(s.kv_heads), dim(s.batch)};
  const runtime::Grid rotate_grid{dim(s.seqlen_q), dim(s.heads), dim(s.batch)};
  check_grid(kOp, split_grid, "splits", "kv_heads x query tiles", "batch");
  check_grid(kOp, merge_grid, "query tokens", "heads", "batch");
  check_grid(kOp, append_grid, "new tokens", "kv heads", "batch");
  check_grid(kOp, rotate_grid, "query tokens", "heads", "batch");

  Tensor out = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse = torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (s.batch == 0) return {out, lse};

  q = aligned_for_kernel(q);
  CacheView c{cache_for_kernel("k_cache", k_cache, k.has_value(), cache_stride_multiple),
              cache_for_kernel("v_cache", v_cache, k.has_value(), cache_stride_multiple),
              Tensor(), block_table ? block_table->data_ptr() : nullptr, block_table ? block_table->stride(0) : 0,
              nullptr};
  if (cache_seqlens) {
    c.seqlens = torch::stable::contiguous(*cache_seqlens);
  } else {  // every sequence fills its cache
    c.seqlens = torch::stable::new_empty(q, {s.batch}, ScalarType::Int);
    torch::stable::fill_(c.seqlens, static_cast<double>(s.capacity));
  }
  // Optional int32 [batch] vectors are made contiguous (cache_seqlens' layout); absent ones are
  // pointed at cache_seqlens and never read.
  const Tensor batch_idx = cache_batch_idx ? torch::stable::contiguous(*cache_batch_idx) : c.seqlens;
  const Tensor leftpad = cache_leftpad ? torch::stable::contiguous(*cache_leftpad) : c.seqlens;
  c.batch_idx = batch_idx.data_ptr();
  // The kernels index both rotary tables with one row stride: contiguous ones share it.
  const Tensor cos = rotary_cos ? torch::stable::contiguous(*rotary_cos) : q;
  const Tensor sin = rotary_sin ? torch::stable::contiguous(*rotary_sin) : q;
  const RotaryArgs rotary{cos.data_ptr(), sin.data_ptr(), rotary_cos ? cos.stride(0) : 0};
  // Pointers the call does not use point at lse (float32, never read: use 0).
  LaunchScope scope(lse);
  const kernels::CacheDescalesArgs descales = cache_descales_args(scope, k_descale, v_descale);
  if (k && s.seqlen_new > 0) append(kv, append_grid, s, c, rotary, *k, *v, descales);
  if (out.numel() == 0) return {out, lse};  // no query heads: the append was all there was to do
  if (s.rotary_dim > 0) {  // q rotated into a contiguous copy, which the split kernel then reads
    Tensor q_rot = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
    kernels::launch_rotate_queries(rotate, rotate_grid, {
        .Q = q.data_ptr(), .QRot = q_rot.data_ptr(), .CacheSeqlens = c.seqlens.data_ptr(), .RotaryCos = rotary.cos,
        .RotarySin = rotary.sin, .stride_qb = kernel_stride(q, 0), .stride_qs = kernel_stride(q, 1),
        .stride_qh = kernel_stride(q, 2), .seqlen_q = s.seqlen_q, .num_heads = s.heads, .head_dim = s.head_dim,
        .stride_ro = rotary.stride, .seqlen_ro = s.seqlen_ro, .rotary_dim = s.rotary_dim,
        .rotary_interleaved = s.rotary_interleaved ? 1 : 0, .rotary_per_token = s.rotary_per_token ? 1 : 0});
    q = q_rot;
  }

  // fp32 partials, one [batch, seqlen_q, heads, head_dim] slab (and lse slab) per split.
  Tensor part_out, part_lse;
  if (splits > 1) {
    part_out = torch::stable::new_empty(q, {splits, s.batch, s.seqlen_q, s.heads, s.head_dim}, ScalarType::Float);
    part_lse = torch::stable::new_empty(q, {splits, s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  }
  kernels::launch_attn_decode_split(split, split_grid, {
      .Q = q.data_ptr(), .KCache = c.k.data_ptr(), .VCache = c.v.data_ptr(), .CacheSeqlens = c.seqlens.data_ptr(),
      .BlockTable = c.table, .CacheBatchIdx = c.batch_idx, .CacheLeftpad = leftpad.data_ptr(),
      .PartOut = splits > 1 ? part_out.data_ptr() : nullptr,
      .PartLse = splits > 1 ? part_lse.data_ptr() : nullptr, .Out = out.data_ptr(), .Lse = lse.data_ptr(),
      .stride_qb = kernel_stride(q, 0), .stride_qs = kernel_stride(q, 1), .stride_qh = kernel_stride(q, 2),
      .stride_kb = kernel_stride(c.k, 0), .stride_ks = kernel_stride(c.k, 1), .stride_kh = kernel_stride(c.k, 2),
      .stride_vb = kernel_stride(c.v, 0), .stride_vs = kernel_stride(c.v, 1), .stride_vh = kernel_stride(c.v, 2),
      .stride_tb = c.stride_tb, .seqlen_q = s.seqlen_q, .num_heads = s.heads, .kv_group_size = s.group(),
      .head_dim = s.head_dim, .seqlen_new = s.seqlen_new, .capacity = s.capacity, .page_size = s.page_size,
      .num_splits = splits, .window = window_args(s.window_left, s.window_right),
      .Alibi = scope.address_of(alibi_slopes), .stride_alibib = alibi_stride_b(alibi_slopes),
      .stride_alibih = alibi_stride_h(alibi_slopes), .use_alibi = alibi_slopes ? 1 : 0,
      .scores = scores_args(resolve_softmax_scale(softmax_scale, s.head_dim), softcap),
      .sinks = sinks_args(scope, sinks), .use_batch_idx = s.batch_idx ? 1 : 0, .use_leftpad = s.leftpad ? 1 : 0,
      .cache_descales = descales});
  if (splits > 1) {
    kernels::launch_attn_decode_merge(merge, merge_grid, {
        .PartOut = part_out.data_ptr(), .PartLse = part_lse.data_ptr(), .Out = out.data_ptr(), .Lse = lse.data_ptr(),
        .num_rows = s.batch * s.seqlen_q * s.heads, .num_splits = splits, .seqlen_q = s.seqlen_q,
        .num_heads = s.heads, .head_dim = s.head_dim});
  }
  return {out, lse};
}

}  // namespace fattn
