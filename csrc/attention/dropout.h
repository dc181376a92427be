// Dropout on the attention probabilities, as flash-attn applies it: after the softmax, each
// probability is kept with probability 1 - p and the kept ones are scaled by 1 / (1 - p); lse
// is the softmax's, unaffected.
//
// The keep-mask is a function of (seed, batch, head, query row, key) only, never of the
// tiling, so the forward, the backward and this CPU implementation draw the same mask:
// Philox-4x32-10 (Triton's tl.philox) keyed by the 64-bit seed, low word first, at counter
// ((key / 16) * 4 + (key % 8) / 2, (row / 16) * 8 + row % 8, head, batch); its four 32-bit
// words hold the eight 16-bit draws of rows {i, i + 8} x keys {k, k + 1, k + 8, k + 9}, row
// i + 8a and key k + 8b + s taking bits [16 s, 16 s + 16) of word 2a + b (docs/DESIGN.md, rule
// 11); a key is kept when its draw >= threshold =
// round(p * 2**16) (at most 2**16 - 1). p is therefore rounded to a multiple of 2**-16, and the
// scale is 2**16 / (2**16 - threshold), the exact inverse of the keep probability.
// triton_src/dropout.py's dropout_keep is the kernels' side.
#pragma once

#include <cstdint>
#include <optional>

#include "common/tensor_checks.h"

namespace fattn {

struct Dropout {
  int64_t threshold = 0;  // 0: no dropout
  double scale = 1.0;     // 1 / keep probability
  uint64_t seed = 0;      // read on CPU only (the kernels read it on the device)
  bool active() const { return threshold > 0; }
  // Whether the probability of (batch b, head h, query row i, key j) is kept.
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const;
};

// dropout_p in [0, 1); dropout_seed an int64 tensor of one element on q's device, required when
// dropout_p > 0 (torch's generator draws it, on the device, so CUDA graphs replay with a fresh
// seed). On CPU the seed's value is read.
Dropout check_dropout(const char* op, double dropout_p, const std::optional<Tensor>& dropout_seed, const Tensor& q);


}  // namespace fattn
