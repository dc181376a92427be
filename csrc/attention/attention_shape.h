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
// scale; throws naming the argument and the expectation. fp8_allowed: the forwards, which also
// take float8 q, k, v (attention/fp8_inputs.h).
AttentionShape check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::optional<double> softmax_scale, bool fp8_allowed = false);

// The same for packed (varlen) inputs: q [total_q, heads, head_dim], k/v [total_k, kv_heads,
// head_dim], cu_seqlens_q/k int32 [batch + 1], seqused_k int32 [batch]. The shape's batch is
// the number of sequences and its seqlen_q/k are max_seqlen_q/k (the grid's extent).
AttentionShape check_varlen_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k, const std::optional<Tensor>& seqused_k,
                                   std::optional<double> softmax_scale, bool fp8_allowed = false);

// The offsets' values (CPU only: on CUDA reading them would stall the stream): each
// cu_seqlens non-decreasing from >= 0 to <= its packed rows, each sequence at most its
// max_seqlen long, seqused_k[b] within sequence b's keys.
void check_varlen_values(const char* op, const AttentionShape& s, int64_t total_q, int64_t total_k,
                         const int32_t* cu_q, const int32_t* cu_k, const int32_t* seqused_k);

// The extra inputs of a backward: dout and out shaped and typed like q, lse (and dlse
// when given) of lse_dtype shaped as the forward returns it ([batch, heads, seqlen_q], or
// [heads, total_q] packed), all on q's device.
void check_backward_inputs(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& dout,
                           const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse);

}  // namespace fattn
