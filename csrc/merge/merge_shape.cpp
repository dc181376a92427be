#include "merge/merge_shape.h"

namespace fattn {

MergeShape check_merge_inputs(const char* op, const Tensor& outs, const Tensor& lses) {
  check_rank(op, "outs", outs, 5, "[splits, batch, seqlen_q, heads, head_dim]");
  MergeShape m{outs.size(0), outs.size(1), outs.size(2), outs.size(3), outs.size(4)};
  if (m.splits < 1) fail(op, "outs must hold at least one partial result (splits >= 1)");
  if (lses.dim() != 4 || lses.size(0) != m.splits || lses.size(1) != m.batch || lses.size(2) != m.heads ||
      lses.size(3) != m.seqlen_q) {
    fail(op, "lses has shape ", shape_of(lses), " but must be [splits, batch, heads, seqlen_q] = [", m.splits, ", ",
         m.batch, ", ", m.heads, ", ", m.seqlen_q, "]");
  }
  check_same_device(op, "lses", lses, "outs", outs);
  const ScalarType t = outs.scalar_type();
  const bool float_out = t == ScalarType::Half || t == ScalarType::BFloat16 || t == ScalarType::Float ||
                         (outs.is_cpu() && t == ScalarType::Double);
  if (!float_out) fail(op, "outs has dtype ", dtype_name(t), "; expected float32, float16 or bfloat16");
  if (lses.scalar_type() != lse_dtype(t)) {
    fail(op, "lses has dtype ", dtype_name(lses.scalar_type()), "; expected ", dtype_name(lse_dtype(t)));
  }
  check_head_dim(op, m.head_dim);
  check_last_dim_contiguous(op, "outs", outs);
  return m;
}

}  // namespace fattn
