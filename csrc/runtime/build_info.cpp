// C entry points for tools that inspect a built library without calling an op:
// `python -m fattn info` reads them through ctypes.
#include <string>

#include "runtime/arch.h"
#include "runtime/kernel_index.h"
#include "runtime/kernel_table.h"
#include "runtime/module_cache.h"

// Which toolchain linked the library (setup.py defines it: zig is the portable one, gcc
// ties it to its build machine's glibc and libstdc++); a CMake build is the caller's own.
#ifndef FATTN_TOOLCHAIN
#define FATTN_TOOLCHAIN "cmake"
#endif

namespace {

std::string describe_entry(const fattn::runtime::KernelEntry& e) {
  std::string out = "{\"kernel\": \"" + std::string(e.kernel) + "\", \"arch\": " + std::to_string(e.arch) +
                    ", \"dtype\": \"" + fattn::runtime::dtype_tag(e.dtype) + "\", \"block_d\": " +
                    std::to_string(e.block_d) + ", \"flags_key\": " + std::to_string(e.flags_key) +
                    ", \"function\": \"" +
                    e.function_name + "\", \"num_warps\": " + std::to_string(e.num_warps) +
                    ", \"num_stages\": " + std::to_string(e.num_stages) +
                    ", \"shared\": " + std::to_string(e.shared_bytes) +
                    ", \"global_scratch_size\": " + std::to_string(e.global_scratch_size) +
                    ", \"cubin_size\": " + std::to_string(e.cubin_size) +
                    ", \"ptx_size\": " + std::to_string(e.ptx_size) + ", \"constants\": {";
  for (int c = 0; c < e.num_constants; ++c) {
    out += (c ? ", \"" : "\"") + std::string(e.constants[c].name) + "\": " + std::to_string(e.constants[c].value);
  }
  out += "}, \"params\": [";
  for (int p = 0; p < e.num_params; ++p) out += (p ? ", \"" : "\"") + std::string(e.param_names[p]) + "\"";
  return out + "]}";
}

std::string describe_table() {
  using namespace fattn::runtime;
  std::string out = "{\"triton_version\": \"" + std::string(kernel_triton_version()) +
                    "\", \"toolchain\": \"" FATTN_TOOLCHAIN "\", \"kernels\": [";
  for (size_t i = 0; i < kernel_table_size(); ++i) out += (i ? ", " : "") + describe_entry(kernel_table()[i]);
  out += "], \"tile_loop\": [";
  for (size_t i = 0; i < tile_loop_rows_size(); ++i) {
    const TileLoopRows& r = tile_loop_rows()[i];
    out += (i ? ", " : "") + std::string("{\"arch\": ") + std::to_string(r.arch) +
           ", \"bucket\": " + std::to_string(r.bucket) + ", \"from_rows\": " + std::to_string(r.from_rows) +
           ", \"from_rows_right_edge\": " + std::to_string(r.from_rows_right_edge) + "}";
  }
  return out + "]}";
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const char* fattn_build_info_json() {
  static const std::string info = describe_table();
  return info.c_str();
}

// The arch whose code serves a device of compute capability `device_arch` for `kernel`, by
// the rule the ops use (pick_path); -1 if none. *ptx is set to 1 when that is the arch's PTX
// (a GPU newer than every cubin), else 0; *older to the arch serving the variants that one
// lacks (pick_path's: sm_86 for sm_89, which holds only the FP8 variants), else -1.
extern "C" __attribute__((visibility("default"))) int fattn_pick_arch(const char* kernel, int device_arch, int* ptx,
                                                                      int* older) {
  using namespace fattn::runtime;
  const int id = kernel_id_of(kernel);
  const ArchPath path = pick_path(built_archs(id), ptx_archs(id), device_arch);
  *ptx = path.ptx ? 1 : 0;
  *older = path.older;
  return path.arch;
}

// Module loads started in this process (failed ones included); *functions is set to the
// number of kernel functions loaded and cached. Equal numbers mean every module loaded once.
extern "C" __attribute__((visibility("default"))) int64_t fattn_module_loads(int64_t* functions) {
  const fattn::runtime::ModuleStats stats = fattn::runtime::module_stats();
  *functions = stats.functions;
  return stats.load_attempts;
}
