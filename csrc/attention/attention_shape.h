// The inputs of fattn::forward and fattn::backward: validated once, for CUDA and CPU alike.
#pragma once

#include <optional>

#include "common/tensor_checks.h"

namespace fattn {

struct AttentionShape {
  int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  int64_t group() const { return heads / kv_heads; }
  // Causal masks are aligned to the bottom-right corner: row i sees key j iff j <= i + diagonal().
  int64_t diagonal() const { return seqlen_k - seqlen_q; }
};

// Rank, device, dtype, shapes, head dim and strides of q, k, v and the optional softmax
// scale; throws naming the argument and the expectation.
AttentionShape check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::optional<double> softmax_scale);

// The extra inputs of a backward: dout and out shaped and typed like q, lse (and dlse
// when given) [batch, heads, seqlen_q] of lse_dtype, all on q's device.
void check_backward_inputs(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& dout,
                           const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse);

}  // namespace fattn
