#include "common/fp8.h"

#include <algorithm>
#include <cmath>

#include "common/tensor_checks.h"

namespace fattn {

namespace {

struct Fp8Format {
  int mantissa_bits;
  int min_exponent;  // of the smallest normal value
  double max;
};

Fp8Format format_of(ScalarType t) {
  // e4m3fn: 3 mantissa bits, normals from 2^-6, largest 448 (no infinity); e5m2: 2 bits, 2^-14, 57344.
  return t == ScalarType::Float8_e4m3fn ? Fp8Format{3, -6, 448.0} : Fp8Format{2, -14, 57344.0};
}

}  // namespace

bool is_fp8(ScalarType t) { return t == ScalarType::Float8_e4m3fn || t == ScalarType::Float8_e5m2; }

int64_t fp8_flag(ScalarType t) {
  return t == ScalarType::Float8_e4m3fn ? 1 : t == ScalarType::Float8_e5m2 ? 2 : 0;
}

double fp8_max(ScalarType format) { return format_of(format).max; }

double round_to_fp8(double x, ScalarType format) {
  const Fp8Format f = format_of(format);
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return std::copysign(f.max, x);  // saturated, as cvt.rn.satfinite does
  if (x == 0) return x;
  // The spacing of representable values around |x|: 2^(exponent - mantissa bits), the
  // subnormals' below the smallest normal exponent.
  const int exponent = std::max(static_cast<int>(std::floor(std::log2(std::fabs(x)))), f.min_exponent);
  const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);
  const double rounded = std::nearbyint(x / quantum) * quantum;  // the default mode rounds ties to even
  return std::fmax(-f.max, std::fmin(f.max, rounded));
}

void check_descale(const char* op, const char* name, const std::optional<Tensor>& descale, int64_t batch,
                   int64_t kv_heads, int64_t query_heads, const Tensor& ref) {
  if (!descale.has_value()) return;
  const Tensor& t = *descale;
  check_same_device(op, name, t, "q", ref);
  if (t.scalar_type() != ScalarType::Float) {
    fail(op, name, " has dtype ", dtype_name(t.scalar_type()), "; expected float32");
  }
  const bool heads_ok = t.dim() == 2 && (t.size(1) == kv_heads || (query_heads != 0 && t.size(1) == query_heads));
  if (t.dim() != 2 || t.size(0) != batch || !heads_ok) {
    if (query_heads != 0 && query_heads != kv_heads) {
      fail(op, name, " has shape ", shape_of(t), "; expected [batch, kv_heads] = [", batch, ", ", kv_heads,
           "] or [batch, heads] = [", batch, ", ", query_heads, "]");
    }
    fail(op, name, " has shape ", shape_of(t), "; expected [batch, kv_heads] = [", batch, ", ", kv_heads, "]");
  }
}

}  // namespace fattn
