#include "runtime/arch.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace fattn::runtime {

int next_older_arch(const std::vector<int>& archs, int arch) {
  int best = -1;
  for (int a : archs) {
    if (a / 10 == arch / 10 && a < arch && a != 90) best = std::max(best, a);
  }
  return best;
}

int pick_arch(const std::vector<int>& built, int device_arch) {
  if (std::find(built.begin(), built.end(), device_arch) != built.end()) return device_arch;
  return next_older_arch(built, device_arch);
}

ArchPath pick_path(const std::vector<int>& built, const std::vector<int>& with_ptx, int device_arch) {
  const int cubin = pick_arch(built, device_arch);
  if (cubin >= 0) return {cubin, false, next_older_arch(built, cubin)};
  int ptx = -1;
  for (int arch : with_ptx) {
    if (arch < device_arch && arch != 90) ptx = std::max(ptx, arch);
  }
  return {ptx, ptx >= 0, ptx >= 0 ? next_older_arch(with_ptx, ptx) : -1};
}

int forced_ptx_arch() {
  const char* text = std::getenv("FATTN_FORCE_PTX_ARCH");
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  long arch = std::strtol(text, &end, 10);
  if (*end != '\0' || arch < 50 || arch > 200) {
    throw std::runtime_error(std::string("fattn: FATTN_FORCE_PTX_ARCH=") + text +
                             " is not an arch like 75 or 80");
  }
  return static_cast<int>(arch);
}

std::string join_archs(const std::vector<int>& archs) {
  std::string out;
  for (int a : archs) out += (out.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return out.empty() ? "none" : out;
}

}  // namespace fattn::runtime
