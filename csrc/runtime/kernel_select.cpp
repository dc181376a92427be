#include "runtime/kernel_select.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace fattn::runtime {

int64_t KernelEntry::constant(const char* name) const {
  for (int i = 0; i < num_constants; ++i) {
    if (std::strcmp(constants[i].name, name) == 0) return constants[i].value;
  }
  throw std::runtime_error(std::string("fattn: kernel ") + kernel + " has no constant " + name);
}

const unsigned char* KernelEntry::cubin() const { return kernel_blob() + cubin_offset; }
const char* KernelEntry::ptx() const {
  return reinterpret_cast<const char*>(kernel_blob() + ptx_offset);
}

std::vector<int> built_archs(const char* kernel) {
  std::vector<int> archs;
  for (size_t i = 0; i < kernel_table_size(); ++i) {
    const KernelEntry& e = kernel_table()[i];
    if (std::strcmp(e.kernel, kernel) == 0 &&
        std::find(archs.begin(), archs.end(), e.arch) == archs.end()) {
      archs.push_back(e.arch);
    }
  }
  std::sort(archs.begin(), archs.end());
  return archs;
}

int pick_arch(const std::vector<int>& built, int device_arch) {
  int best = -1;
  for (int arch : built) {
    if (arch == device_arch) return arch;
    if (arch / 10 == device_arch / 10 && arch < device_arch && arch != 90) best = std::max(best, arch);
  }
  return best;
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

const KernelEntry* find_entry(const char* kernel, int arch, const char* dtype,
                              const std::vector<std::pair<const char*, int64_t>>& constants) {
  for (size_t i = 0; i < kernel_table_size(); ++i) {
    const KernelEntry& e = kernel_table()[i];
    if (e.arch != arch || std::strcmp(e.kernel, kernel) != 0 || std::strcmp(e.dtype, dtype) != 0) {
      continue;
    }
    bool match = true;
    for (const auto& [name, value] : constants) {
      if (e.constant(name) != value) {
        match = false;
        break;
      }
    }
    if (match) return &e;
  }
  return nullptr;
}

std::string join_archs(const std::vector<int>& archs) {
  std::string out;
  for (int a : archs) out += (out.empty() ? "sm_" : ", sm_") + std::to_string(a);
  return out.empty() ? "none" : out;
}

}  // namespace fattn::runtime
