#pragma once
// The running max of a softmax row on the CPU: NaN once any operand is NaN. std::max would skip a
// NaN score (NaN compares false), and a row of NaN scores would then look like a row that sees no
// key (out 0, lse -inf): a NaN input, bias, sink or ALiBi slope must reach out and lse instead.

#include <cmath>
#include <limits>

namespace fattn {

inline double propagating_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? b : a;
}

}  // namespace fattn
