#include "runtime/kernel_index.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace fattn::runtime {
namespace {

// (kernel id, arch, dtype) in one word; the flags key and the bucket get their own word.
uint64_t group_key(int kernel_id, int arch, DType dtype) {
  return (uint64_t(kernel_id) << 24) | (uint64_t(arch) << 8) | uint64_t(dtype);
}

struct VariantKey {
  uint64_t group, bucket_and_flags;
  bool operator==(const VariantKey& o) const { return group == o.group && bucket_and_flags == o.bucket_and_flags; }
};

struct VariantKeyHash {
  size_t operator()(const VariantKey& k) const { return std::hash<uint64_t>()(k.group * 0x9E3779B97F4A7C15ull ^ k.bucket_and_flags); }
};

VariantKey variant_key(int kernel_id, int arch, DType dtype, int block_d, uint64_t flags_key) {
  // Flags keys use at most a few bytes (aot_build/launchers.py packs one byte per flag).
  return {group_key(kernel_id, arch, dtype), (uint64_t(block_d) << 48) ^ flags_key};
}

struct Index {
  std::vector<std::vector<int>> archs;                           // by kernel id
  std::vector<std::vector<int>> ptx_archs;                       // by kernel id: archs with PTX images
  std::unordered_map<uint64_t, std::vector<int>> buckets;        // by group key
  std::unordered_map<VariantKey, const KernelEntry*, VariantKeyHash> variants;
};

const Index& index() {
  static const Index built = [] {
    Index ix;
    for (size_t i = 0; i < kernel_table_size(); ++i) {
      const KernelEntry& e = kernel_table()[i];
      if (e.kernel_id >= static_cast<int>(ix.archs.size())) ix.archs.resize(e.kernel_id + 1);
      auto& archs = ix.archs[e.kernel_id];
      if (std::find(archs.begin(), archs.end(), e.arch) == archs.end()) archs.push_back(e.arch);
      if (e.kernel_id >= static_cast<int>(ix.ptx_archs.size())) ix.ptx_archs.resize(e.kernel_id + 1);
      auto& with_ptx = ix.ptx_archs[e.kernel_id];
      if (e.ptx_size > 0 && std::find(with_ptx.begin(), with_ptx.end(), e.arch) == with_ptx.end()) {
        with_ptx.push_back(e.arch);
      }
      auto& buckets = ix.buckets[group_key(e.kernel_id, e.arch, e.dtype)];
      if (std::find(buckets.begin(), buckets.end(), e.block_d) == buckets.end()) buckets.push_back(e.block_d);
      // The first entry wins, as a scan of the table would find it.
      ix.variants.emplace(variant_key(e.kernel_id, e.arch, e.dtype, e.block_d, e.flags_key), &e);
    }
    for (auto& archs : ix.archs) std::sort(archs.begin(), archs.end());
    for (auto& archs : ix.ptx_archs) std::sort(archs.begin(), archs.end());
    for (auto& [key, buckets] : ix.buckets) std::sort(buckets.begin(), buckets.end());
    return ix;
  }();
  return built;
}

const std::vector<int> kNone;

}  // namespace

const std::vector<int>& built_archs(int kernel_id) {
  const Index& ix = index();
  return kernel_id >= 0 && kernel_id < static_cast<int>(ix.archs.size()) ? ix.archs[kernel_id] : kNone;
}

const std::vector<int>& ptx_archs(int kernel_id) {
  const Index& ix = index();
  return kernel_id >= 0 && kernel_id < static_cast<int>(ix.ptx_archs.size()) ? ix.ptx_archs[kernel_id] : kNone;
}

const std::vector<int>& built_buckets(int kernel_id, int arch, DType dtype) {
  const Index& ix = index();
  auto it = ix.buckets.find(group_key(kernel_id, arch, dtype));
  return it == ix.buckets.end() ? kNone : it->second;
}

const KernelEntry* find_variant(int kernel_id, int arch, DType dtype, int block_d, uint64_t flags_key) {
  const Index& ix = index();
  auto it = ix.variants.find(variant_key(kernel_id, arch, dtype, block_d, flags_key));
  return it == ix.variants.end() ? nullptr : it->second;
}

int kernel_id_of(const char* kernel) {
  for (size_t i = 0; i < kernel_table_size(); ++i) {
    if (std::strcmp(kernel_table()[i].kernel, kernel) == 0) return kernel_table()[i].kernel_id;
  }
  return -1;
}

}  // namespace fattn::runtime
