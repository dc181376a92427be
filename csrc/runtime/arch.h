// Which compiled arch serves a device: the rule every op and `python -m fattn info` share.
#pragma once

#include <string>
#include <vector>

namespace fattn::runtime {

// The arch whose cubins run on a device of compute capability `device_arch`
// (10 * major + minor): the exact arch if built, else the newest built arch of the
// same major that is not newer than the device (a cubin runs on later minors of its
// major). Returns -1 if none. sm_90 cubins use sm_90a features and run on 9.0 only,
// so they never serve another minor.
int pick_arch(const std::vector<int>& built, int device_arch);

// The newest of `archs` older than `arch` in its major (never sm_90): what a GPU of `arch` runs
// for a variant the build holds for an older minor only (configs.json "served_by": sm_89 builds
// only what sm_86 lacks). -1 if none.
int next_older_arch(const std::vector<int>& archs, int arch);

// What serves a device: the cubins of pick_arch, or, when none does and the GPU is newer than
// an arch of `with_ptx` (the archs whose PTX the build embeds), the PTX of the newest such arch,
// which the driver JIT-compiles for the GPU (sm_90's PTX uses sm_90a features and is never used
// elsewhere). `older`: the next older arch of the same code (cubins, or PTX), which serves the
// variants `arch` lacks (next_older_arch), or -1. {-1, false, -1} when nothing can.
struct ArchPath {
  int arch;
  bool ptx;
  int older;
};
ArchPath pick_path(const std::vector<int>& built, const std::vector<int>& with_ptx, int device_arch);

// Arch override for testing older code paths on a newer GPU: FATTN_FORCE_PTX_ARCH=80
// makes launches use the PTX of the sm_80 variants, JIT-compiled by the driver. Read at
// every call (tests set it per case); returns -1 when unset; throws on a malformed value.
int forced_ptx_arch();

std::string join_archs(const std::vector<int>& archs);

}  // namespace fattn::runtime
