// FP8 tensors (float8_e4m3fn, float8_e5m2): the kernels' flag for each, the CPU
// implementations' rounding to them, and the checks of the descale factors that come with them.
//
// An FP8 tensor x stands for x * descale, with one float32 descale per (sequence, KV head):
// FlashAttention-3's q_descale / k_descale / v_descale convention, shape [batch, kv_heads]
// (q_descale also [batch, heads], one per query head).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

namespace fattn {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

bool is_fp8(ScalarType t);

// The value of the kernels' FP8 flags (attn_fwd's FP8, the decode kernels' KV_FP8): 0 for a
// 16-bit tensor, 1 for float8_e4m3fn, 2 for float8_e5m2. The kernels reinterpret the 16-bit
// pointer of their variant as the FP8 type the flag names.
int64_t fp8_flag(ScalarType t);

// The largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2).
double fp8_max(ScalarType format);

// x rounded to the nearest value of `format`, ties to even, saturated to +-fp8_max: what the
// GPU's cvt.rn.satfinite conversion gives, so that the CPU implementations round as the kernels do.
double round_to_fp8(double x, ScalarType format);

// The probabilities' scale in the FP8 forward: P is multiplied by it before its rounding to
// e4m3 for the second product (P V on FP8 tensor cores), and the product divided by it after.
// 2^8 keeps probabilities down to 2^-17 from flushing to zero (e4m3's smallest subnormal is
// 2^-9) and the largest, 1, well under e4m3's 448; a power of two, so the scaling is exact (and
// the Hopper kernel folds it into exp2's argument as its exponent, forward_sm90._attend_tile).
// The kernel takes it as an argument: this is its one definition.
constexpr double kFp8ProbabilityScale = 256.0;
static_assert(kFp8ProbabilityScale >= 1 &&
                  static_cast<double>(static_cast<uint64_t>(kFp8ProbabilityScale)) == kFp8ProbabilityScale &&
                  (static_cast<uint64_t>(kFp8ProbabilityScale) & (static_cast<uint64_t>(kFp8ProbabilityScale) - 1)) == 0,
              "the FP8 probability scale must be a power of two");

// An optional descale factor: float32, [batch, heads] (heads: kv_heads, or also the query heads
// where `query_heads` is nonzero, for a q_descale per query head), on ref's device, any strides.
// Names the argument in every error.
void check_descale(const char* op, const char* name, const std::optional<Tensor>& descale, int64_t batch,
                   int64_t kv_heads, int64_t query_heads, const Tensor& ref);

}  // namespace fattn
