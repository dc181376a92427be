// Where each sequence's rows lie, for the CPU references: dense [batch, seqlen, ...] inputs
// are packed rows b * seqlen + i, varlen inputs rows cu_seqlens[b] + i. The references
// compute on contiguous float64 copies, row r of head h at (r * heads + h) * head_dim.
#pragma once

#include <optional>
#include <vector>

#include "attention/attention_shape.h"

namespace fattn {

struct SequenceSpans {
  std::vector<int64_t> q_start, q_len, k_start, k_len;
  // lse of query i of sequence b, head h: b * lse_stride_b + h * lse_stride_h + lse_start[b] + i.
  int64_t lse_stride_b = 0, lse_stride_h = 0;
  std::vector<int64_t> lse_start;

  // The bottom-right alignment of sequence b's masks.
  int64_t diagonal(int64_t b) const { return k_len[b] - q_len[b]; }
  int64_t lse_index(int64_t b, int64_t h, int64_t i) const {
    return b * lse_stride_b + h * lse_stride_h + lse_start[b] + i;
  }
};

SequenceSpans dense_spans(const AttentionShape& s);
// From CPU cu_seqlens_q/k (and seqused_k), whose values it checks (check_varlen_values).
SequenceSpans packed_spans(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& k,
                           const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                           const std::optional<Tensor>& seqused_k);
// packed_spans when cu_seqlens_q is given (with cu_seqlens_k), else dense_spans.
SequenceSpans sequence_spans(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& k,
                             const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                             const std::optional<Tensor>& seqused_k);

}  // namespace fattn
