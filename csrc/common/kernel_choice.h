// Choosing and feeding a compiled variant: what every op's CUDA side shares.
//
// choose<K>() picks the variant of kernel K (a struct of the generated kernel_launchers.h)
// for a call: the arch that serves the device (or FATTN_FORCE_PTX_ARCH), the smallest
// head-dim bucket that holds head_dim and has the op's flags, and those flags; a variant that
// arch lacks comes from the next older arch of its major (configs.json "served_by": sm_89 holds
// only the FP8 variants, sm_86 the rest). It looks at a handful of buckets and allocates nothing
// unless it fails; errors name what the build lacks.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <initializer_list>

#include "common/tensor_checks.h"
#include "kernel_launchers.h"
#include "runtime/kernel_index.h"
#include "runtime/launch.h"

namespace fattn {

struct ArchChoice {
  int arch;
  bool from_ptx;
  int older;  // the next older arch of arch's major with cubins (PTX if from_ptx), else -1
};

// The arch serving `device` for kernel `kernel_id` (named `kernel` in errors).
ArchChoice choose_arch(const char* op, int kernel_id, const char* kernel, int device);
// The smallest head-dim bucket >= head_dim built for a.arch, else for a.older.
int choose_bucket(const char* op, int kernel_id, const char* kernel, const ArchChoice& a, runtime::DType dtype,
                  int64_t head_dim);
runtime::DType kernel_dtype(ScalarType dtype);
[[noreturn]] void fail_no_variant(const char* op, const char* kernel, const ArchChoice& a, runtime::DType dtype,
                                  int bucket);

// The variant of K with `flags` in head_dim's bucket. A head dim that fills its bucket runs the
// exact-dim code (PAD_D off) where the build has it and `exact_dim` allows it, else the padded
// code, which serves every head dim of its bucket (configs.json builds only the padded code of
// the large families).
template <typename K>
const runtime::KernelEntry* find_for_head_dim(int arch, runtime::DType dtype, int bucket, int64_t head_dim,
                                              const typename K::Flags& flags, bool exact_dim) {
  const bool pad = bucket != head_dim || !exact_dim;
  const runtime::KernelEntry* entry = runtime::find_variant(K::kId, arch, dtype, bucket, K::flags_key(flags, pad));
  if (entry == nullptr && !pad) entry = runtime::find_variant(K::kId, arch, dtype, bucket, K::flags_key(flags, true));
  return entry;
}

// The variant of kernel K with the first of `preferences` the build has: for flags that only
// pick a faster code path, which configs.json's "exclude" may leave out on some archs. It comes
// from the smallest bucket holding head_dim that has any of them: a bucket may exist for some
// flags only (attn_fwd's 96 and 192 and attn_bwd_dkdv's 96, in the Hopper kernels alone), and a
// larger one serves its head dims too.
// exact_dim false: the padded code only (a caller whose tensors break the exact-dim code's promises).
template <typename K>
runtime::Variant<K> choose_first(const char* op, int device, ScalarType scalar_type, int64_t head_dim,
                                 std::initializer_list<typename K::Flags> preferences, bool exact_dim = true) {
  const ArchChoice a = choose_arch(op, K::kId, K::kName, device);
  const runtime::DType dtype = kernel_dtype(scalar_type);
  for (int arch : {a.arch, a.older}) {
    for (int bucket : runtime::built_buckets(K::kId, arch, dtype)) {
      if (bucket < head_dim) continue;
      for (const typename K::Flags& flags : preferences) {
        const runtime::KernelEntry* entry = find_for_head_dim<K>(arch, dtype, bucket, head_dim, flags, exact_dim);
        if (entry != nullptr) return {{entry, device, a.from_ptx}};
      }
    }
  }
  // The error: no bucket holds head_dim (choose_bucket says so), or none has the flags.
  fail_no_variant(op, K::kName, a, dtype, choose_bucket(op, K::kId, K::kName, a, dtype, head_dim));
}

// The variant with `flags` if the build has it, else with `fallback` (choose_first).
template <typename K>
runtime::Variant<K> choose_or(const char* op, int device, ScalarType scalar_type, int64_t head_dim,
                              const typename K::Flags& flags, const typename K::Flags& fallback,
                              bool exact_dim = true) {
  return choose_first<K>(op, device, scalar_type, head_dim, {flags, fallback}, exact_dim);
}

template <typename K>
runtime::Variant<K> choose(const char* op, int device, ScalarType scalar_type, int64_t head_dim,
                           const typename K::Flags& flags) {
  return choose_or<K>(op, device, scalar_type, head_dim, flags, flags);
}

// CUDA's launch grid: x up to 2^31 - 1, y and z up to 65535. Ops check every grid they will
// launch before the first launch (or write), naming what each dimension counts.
void check_grid(const char* op, runtime::Grid grid, const char* x_counts, const char* y_counts,
                const char* z_counts);

// Kernels assume 16-byte aligned bases and strides that are multiples of 8 elements
// (16-byte vector loads); a tensor that breaks this (a rare view) is replaced by an
// aligned contiguous copy.
Tensor aligned_for_kernel(const Tensor& t);
// A 16-byte aligned base, a contiguous last dim and the other strides multiples of `multiple`
// elements (the dims of size 1 aside): aligned_for_kernel's rule with 8; TMA and the FP8 kernels'
// 16-byte loads need 16 bytes, 16 FP8 elements.
bool meets_stride_multiple(const Tensor& t, int64_t multiple);

// The stride a kernel sees for dim `d`: 0 for a dim of size 1, which is never stepped and
// whose stride views may leave arbitrary.
inline int64_t kernel_stride(const Tensor& t, int d) { return t.size(d) > 1 ? t.stride(d) : 0; }

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }
inline unsigned dim(int64_t n) { return static_cast<unsigned>(n); }

}  // namespace fattn
