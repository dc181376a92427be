#include "attention/sequence_spans.h"

namespace fattn {

SequenceSpans dense_spans(const AttentionShape& s) {
  SequenceSpans spans;
  for (int64_t b = 0; b < s.batch; ++b) {
    spans.q_start.push_back(b * s.seqlen_q);
    spans.q_len.push_back(s.seqlen_q);
    spans.k_start.push_back(b * s.seqlen_k);
    spans.k_len.push_back(s.seqlen_k);
    spans.lse_start.push_back(0);
  }
  spans.lse_stride_b = s.heads * s.seqlen_q;  // lse [batch, heads, seqlen_q]
  spans.lse_stride_h = s.seqlen_q;
  return spans;
}

SequenceSpans packed_spans(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& k,
                           const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                           const std::optional<Tensor>& seqused_k) {
  const int32_t* cu_q = cu_seqlens_q.const_data_ptr<int32_t>();
  const int32_t* cu_k = cu_seqlens_k.const_data_ptr<int32_t>();
  const int32_t* used = seqused_k.has_value() ? seqused_k->const_data_ptr<int32_t>() : nullptr;
  check_varlen_values(op, s, q.size(0), k.size(0), cu_q, cu_k, used);
  SequenceSpans spans;
  for (int64_t b = 0; b < s.batch; ++b) {
    spans.q_start.push_back(cu_q[b]);
    spans.q_len.push_back(cu_q[b + 1] - cu_q[b]);
    spans.k_start.push_back(cu_k[b]);
    spans.k_len.push_back(used != nullptr ? used[b] : cu_k[b + 1] - cu_k[b]);
    spans.lse_start.push_back(cu_q[b]);
  }
  spans.lse_stride_b = 0;  // lse [heads, total_q]
  spans.lse_stride_h = q.size(0);
  return spans;
}

SequenceSpans sequence_spans(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& k,
                             const std::optional<Tensor>& cu_seqlens_q, const std::optional<Tensor>& cu_seqlens_k,
                             const std::optional<Tensor>& seqused_k) {
  if (!cu_seqlens_q.has_value()) return dense_spans(s);
  return packed_spans(op, s, q, k, *cu_seqlens_q, *cu_seqlens_k, seqused_k);
}

}  // namespace fattn
