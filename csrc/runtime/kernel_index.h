// Finding table entries without scanning the table: an index built once, at first use.
//
// Every lookup on a call's path is a hash probe or a walk over a handful of values
// (built archs, head-dim buckets); nothing is allocated.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernel_table.h"

namespace fattn::runtime {

// The archs the table holds for a kernel, ascending (empty for an unknown id).
const std::vector<int>& built_archs(int kernel_id);

// The archs whose variants of a kernel embed their PTX, ascending (FATTN_PTX_ARCHS at build
// time; by default the newest arch other than sm_90).
const std::vector<int>& ptx_archs(int kernel_id);

// The head-dim buckets (BLOCK_D) built for (kernel, arch, dtype), ascending.
const std::vector<int>& built_buckets(int kernel_id, int arch, DType dtype);

// The entry of (kernel, arch, dtype, bucket, flags key); nullptr if the build has none.
const KernelEntry* find_variant(int kernel_id, int arch, DType dtype, int block_d, uint64_t flags_key);

// The kernel id of a Triton function name, or -1 (for tools; not on a call's path).
int kernel_id_of(const char* kernel);

}  // namespace fattn::runtime
