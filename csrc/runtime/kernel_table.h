// The table of precompiled kernels that aot_build generates (build/generated/kernel_table.cpp).
//
// Each entry is one Triton kernel compiled for one arch with fixed constexprs. Ops never
// search it by name: kernel_index.h finds an entry by (kernel id, arch, dtype, head-dim
// bucket, flags key), and the generated launchers (kernel_launchers.h) pass the arguments
// in the kernel's order (Triton's launch ABI: non-constexpr parameters, then the global
// and profile scratch pointers).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fattn::runtime {

enum class DType : uint8_t { F16, BF16, F32 };

struct KernelConstant {
  const char* name;
  int64_t value;
};

// The box of one host-made TMA map a kernel takes (its HOST_MAPS variants), as Triton recorded it
// when it compiled the kernel: box sizes outermost first ([1, rows, 1, columns] over [batch,
// seqlen, heads, head_dim]), and the CUtensorMap swizzle and data type (cuda.h's enum values).
struct MapBox {
  uint32_t box[4];
  int swizzle;
  int data_type;
  int element_bytes;
};

struct KernelEntry {
  const char* kernel;  // Triton function name, e.g. "attn_fwd"
  int kernel_id;       // its index in kernel_launchers.h (fattn::kernels::<kernel>::kId)
  int arch;            // 10 * major + minor of the target
  DType dtype;         // element type of the tensors
  int block_d;         // the head-dim bucket (constant BLOCK_D); 0 for a kernel without buckets
  uint64_t flags_key;  // the flag constants packed as <kernel>::flags_key packs them
  // Every constexpr, sorted by name: <kernel>::Constant indexes this array.
  const KernelConstant* constants;
  int num_constants;
  const char* const* param_names;  // the runtime parameters, for build_info only
  int num_params;
  int num_warps;
  int num_stages;
  int shared_bytes;           // dynamic shared memory at launch
  int global_scratch_size;    // bytes per program; 0 = none
  int global_scratch_align;
  int profile_scratch_size;   // bytes per program; 0 = none
  // The maps the kernel takes in place of its map-able tensors (the spec's map_rows), in the
  // kernel's order; none for a variant that takes them as pointers.
  const MapBox* maps;
  int num_maps;
  size_t cubin_offset, cubin_size;  // into kernel_blob()
  size_t ptx_offset, ptx_size;      // into kernel_blob()
  // Each image is what cuModuleLoadData takes: a compressed fatbinary (the driver
  // decompresses it at first load), or a raw cubin / NUL-terminated PTX.
  const char* function_name;

  const unsigned char* cubin() const;
  const char* ptx() const;
};

// Where a kernel family has programs that loop over query tiles (attn_fwd's TILE_LOOP) and
// one-tile programs in the same bucket, the query rows from which the looping variant ran
// faster, without and with a right edge (causal, a window): measured by the offline tuner
// (tuning/tune_tile_loop.py, aot_build/tuned/sm<arch>.json).
struct TileLoopRows {
  int arch;
  int bucket;
  int64_t from_rows;
  int64_t from_rows_right_edge;
};

const KernelEntry* kernel_table();
size_t kernel_table_size();
const TileLoopRows* tile_loop_rows();
size_t tile_loop_rows_size();
const unsigned char* kernel_blob();
const char* kernel_triton_version();
const char* dtype_tag(DType dtype);  // "fp16", "bf16", "fp32": Triton's names

}  // namespace fattn::runtime
