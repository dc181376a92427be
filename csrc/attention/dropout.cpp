#include "attention/dropout.h"

#include <algorithm>
#include <cmath>

namespace fattn {
namespace {

struct Words {
  uint32_t w[4];
};

// Philox-4x32 with 10 rounds and Triton's constants (triton/language/random.py).
Words philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p2 = uint64_t{0xCD9E8D57u} * c2;
    c0 = static_cast<uint32_t>(p2 >> 32) ^ c1 ^ k0;
    c2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p2);
    c3 = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

}  // namespace

bool Dropout::keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
  if (!active()) return true;
  // One call serves rows {i, i + 8} x keys {k, k + 1, k + 8, k + 9} (docs/DESIGN.md, rule 11).
  const auto key_group = static_cast<uint32_t>((j / 16) * 4 + (j % 8) / 2);
  const auto row_group = static_cast<uint32_t>((i / 16) * 8 + i % 8);
  const Words r = philox(key_group, row_group, static_cast<uint32_t>(h), static_cast<uint32_t>(b),
                         static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint32_t word = r.w[2 * ((i / 8) % 2) + (j / 8) % 2];
  const uint32_t draw = (word >> (16 * (j % 2))) & 0xFFFFu;
  return draw >= static_cast<uint32_t>(threshold);
}

Dropout check_dropout(const char* op, double dropout_p, const std::optional<Tensor>& dropout_seed, const Tensor& q) {
  if (!(dropout_p >= 0.0 && dropout_p < 1.0)) fail(op, "dropout_p is ", dropout_p, "; expected 0 <= dropout_p < 1");
  Dropout dropout;
  if (dropout_p == 0.0) return dropout;
  if (!dropout_seed.has_value()) fail(op, "dropout_p > 0 needs dropout_seed (an int64 tensor of one element)");
  const Tensor& seed = *dropout_seed;
  if (seed.scalar_type() != ScalarType::Long) {
    fail(op, "dropout_seed has dtype ", dtype_name(seed.scalar_type()), "; expected int64");
  }
  if (seed.numel() != 1) fail(op, "dropout_seed has shape ", shape_of(seed), "; expected one element");
  check_same_device(op, "dropout_seed", seed, "q", q);
  dropout.threshold = std::min<int64_t>(std::llround(dropout_p * 65536.0), 65535);
  dropout.scale = 65536.0 / static_cast<double>(65536 - dropout.threshold);
  if (seed.is_cpu()) dropout.seed = static_cast<uint64_t>(*seed.const_data_ptr<int64_t>());
  return dropout;
}

}  // namespace fattn
