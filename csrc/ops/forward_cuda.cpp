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
#include "runtime/cuda_driver.h"
#include "runtime/kernel_select.h"
#include "runtime/launch.h"

namespace fattn::ops {
namespace {

using torch::headeronly::ScalarType;
constexpr const char* kOp = "fattn.forward";
constexpr const char* kKernel = "attn_fwd";
constexpr int64_t kMaxGridYZ = 65535;

// The kernels are compiled assuming 16-byte aligned bases and strides that are
// multiples of 8 elements (16-byte vector loads). Inputs that break this are
// rare (odd views); they get a contiguous copy instead of a slower kernel.
bool meets_alignment(const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.size(d) > 1 && t.stride(d) % 8 != 0) return false;
  }
  return true;
}

Tensor aligned(const Tensor& t) {
  if (meets_alignment(t)) return t;
  Tensor c = torch::stable::contiguous(t);  // a view's copy starts on a fresh allocation
  return meets_alignment(c) ? c : torch::stable::clone(c);
}

// Stride the kernel sees: a dim of size 1 is never stepped, so its stride
// (which views may leave arbitrary) is passed as 0, keeping the alignment promise.
int64_t kstride(const Tensor& t, int d) { return t.size(d) > 1 ? t.stride(d) : 0; }

struct Choice {
  runtime::LaunchTarget target;
  int64_t block_m;
};

Choice choose_variant(int device, ScalarType dtype, int64_t head_dim, bool causal) {
  const char* dtype_tag = dtype == ScalarType::Half ? "fp16" : "bf16";
  const std::vector<int> built = runtime::built_archs(kKernel);
  int arch = runtime::forced_ptx_arch();
  const bool from_ptx = arch >= 0;
  const int device_arch = cuda::compute_capability(device);
  if (from_ptx) {
    if (std::find(built.begin(), built.end(), arch) == built.end()) {
      throw std::runtime_error(std::string(kOp) + ": FATTN_FORCE_PTX_ARCH=" + std::to_string(arch) +
                               " but this build has PTX for " + runtime::join_archs(built));
    }
    if (arch > device_arch) {
      throw std::runtime_error(std::string(kOp) + ": FATTN_FORCE_PTX_ARCH=" + std::to_string(arch) +
                               " is newer than the GPU (sm_" + std::to_string(device_arch) + ")");
    }
  } else {
    arch = runtime::pick_arch(built, device_arch);
    if (arch < 0) {
      throw std::runtime_error(std::string(kOp) + ": no kernel for this GPU (cuda:" +
                               std::to_string(device) + " is sm_" + std::to_string(device_arch) +
                               "); this build has " + runtime::join_archs(built) +
                               ". Rebuild with FATTN_CUDA_ARCHS including " + std::to_string(device_arch));
    }
  }
  // The smallest compiled head-dim bucket that holds head_dim.
  int64_t bucket = -1;
  std::string buckets;
  for (size_t i = 0; i < runtime::kernel_table_size(); ++i) {
    const runtime::KernelEntry& e = runtime::kernel_table()[i];
    if (std::string(e.kernel) != kKernel || e.arch != arch || std::string(e.dtype) != dtype_tag) continue;
    int64_t b = e.constant("BLOCK_D");
    if (buckets.find(" " + std::to_string(b) + ",") == std::string::npos) {
      buckets += " " + std::to_string(b) + ",";
    }
    if (b >= head_dim && (bucket < 0 || b < bucket)) bucket = b;
  }
  if (bucket < 0) {
    throw std::runtime_error(std::string(kOp) + ": head_dim " + std::to_string(head_dim) +
                             " has no compiled kernel for sm_" + std::to_string(arch) +
                             " (head-dim buckets built:" + (buckets.empty() ? " none" : buckets) +
                             "); rebuild with FATTN_HEAD_DIMS including " + std::to_string(head_dim));
  }
  const runtime::KernelEntry* entry = runtime::find_entry(
      kKernel, arch, dtype_tag,
      {{"BLOCK_D", bucket}, {"CAUSAL", causal ? 1 : 0}, {"PAD_D", bucket != head_dim ? 1 : 0}});
  if (entry == nullptr) {
    throw std::runtime_error(std::string(kOp) + ": the build has no variant for sm_" +
                             std::to_string(arch) + " " + dtype_tag + " head_dim " +
                             std::to_string(head_dim) + (causal ? " causal" : " non-causal"));
  }
  return {{entry, device, from_ptx}, entry->constant("BLOCK_M")};
}

}  // namespace

std::tuple<Tensor, Tensor> forward_cuda(Tensor q, Tensor k, Tensor v,
                                        std::optional<double> softmax_scale, bool causal) {
  const AttentionShape s = check_attention_inputs(kOp, q, k, v, softmax_scale);
  if (s.heads > kMaxGridYZ || s.batch > kMaxGridYZ) {
    throw std::runtime_error(std::string(kOp) + ": batch and heads must each be at most 65535, got batch " +
                             std::to_string(s.batch) + " and heads " + std::to_string(s.heads));
  }
  const int device = q.get_device_index();
  const Choice choice = choose_variant(device, q.scalar_type(), s.head_dim, causal);

  Tensor out = torch::stable::new_empty(q, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse = torch::stable::new_empty(q, {s.batch, s.heads, s.seqlen_q}, ScalarType::Float);
  if (out.numel() == 0) return {out, lse};

  q = aligned(q);
  k = aligned(k);
  v = aligned(v);
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  const runtime::Grid grid{
      static_cast<unsigned>((s.seqlen_q + choice.block_m - 1) / choice.block_m),
      static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch)};
  using runtime::Arg;
  runtime::launch(choice.target, grid, {
      Arg("Q", q.data_ptr()), Arg("K", k.data_ptr()), Arg("V", v.data_ptr()),
      Arg("Out", out.data_ptr()), Arg("Lse", lse.data_ptr()),
      Arg("stride_qb", kstride(q, 0)), Arg("stride_qs", kstride(q, 1)), Arg("stride_qh", kstride(q, 2)),
      Arg("stride_kb", kstride(k, 0)), Arg("stride_ks", kstride(k, 1)), Arg("stride_kh", kstride(k, 2)),
      Arg("stride_vb", kstride(v, 0)), Arg("stride_vs", kstride(v, 1)), Arg("stride_vh", kstride(v, 2)),
      Arg("stride_ob", kstride(out, 0)), Arg("stride_os", kstride(out, 1)), Arg("stride_oh", kstride(out, 2)),
      Arg("seqlen_q", s.seqlen_q), Arg("seqlen_k", s.seqlen_k), Arg("num_heads", s.heads),
      Arg("kv_group_size", s.group()), Arg("head_dim", s.head_dim),
      // log2(e) folded into the scale: the kernel's softmax uses exp2.
      Arg("qk_scale", scale * M_LOG2E),
  });
  return {out, lse};
}

}  // namespace fattn::ops
