// The inputs of fattn::merge_attention_states: validated once, for CUDA and CPU alike.
#pragma once

#include "common/tensor_checks.h"

namespace fattn {

struct MergeShape {
  int64_t splits, batch, seqlen_q, heads, head_dim;
};

// outs [splits, batch, seqlen_q, heads, head_dim] (float; last dim contiguous; head_dim a
// multiple of 8 up to 256) and lses [splits, batch, heads, seqlen_q] of lse_dtype(outs).
MergeShape check_merge_inputs(const char* op, const Tensor& outs, const Tensor& lses);

}  // namespace fattn
