#include "attention/attention_shape.h"

namespace fattn {

namespace {

// q, k, v as [batch, seqlen, heads, head_dim] (rank 4) or packed [total, heads, head_dim]
// (rank 3): everything but the lengths, which the caller reads for its layout.
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, int64_t rank, const char* layout,
               bool fp8_allowed) {
  const char* names[] = {"q", "k", "v"};
  const Tensor* tensors[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) check_rank(op, names[i], *tensors[i], rank, layout);
  for (int i = 1; i < 3; ++i) {
    if (!same_device(*tensors[i], q)) {
      fail(op, names[i], " is on ", device_name(*tensors[i]), " but q is on ", device_name(q),
           "; q, k and v must be on one device");
    }
  }
  check_attention_dtype(op, "q", q, fp8_allowed);
  for (int i = 1; i < 3; ++i) check_same_dtype(op, names[i], *tensors[i], "q", q);
  const int64_t seq = rank - 3;  // the sequence dim: 1 dense, 0 packed
  if (rank == 4) {
    for (int i = 1; i < 3; ++i) {
      if (tensors[i]->size(0) != q.size(0)) fail(op, names[i], " has batch size ", tensors[i]->size(0), " but q has ", q.size(0));
    }
  }
  if (v.size(seq) != k.size(seq) || v.size(seq + 1) != k.size(seq + 1)) {
    fail(op, "v has shape ", shape_of(v), " but k has ", shape_of(k), "; k and v must agree on seqlen and heads");
  }
  const int64_t head_dim = q.size(rank - 1);
  for (int i = 1; i < 3; ++i) {
    if (tensors[i]->size(rank - 1) != head_dim) {
      fail(op, names[i], " has head_dim ", tensors[i]->size(rank - 1), " but q has ", head_dim,
           "; q, k and v must share one head_dim");
    }
  }
  check_head_dim(op, head_dim);
  check_head_groups(op, q.size(rank - 2), k.size(rank - 2), "k and v");
  for (int i = 0; i < 3; ++i) check_last_dim_contiguous(op, names[i], *tensors[i]);
}

void check_offsets(const char* op, const char* name, const Tensor& t, int64_t length, const Tensor& q) {
  check_index_tensor(op, name, t, 1, q);
  if (t.size(0) != length) fail(op, name, " has shape ", shape_of(t), "; expected [", length, "]");
  if (length > 1 && t.stride(0) != 1) fail(op, name, " must be contiguous; call .contiguous() first");
}

}  // namespace

AttentionShape check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::optional<double> softmax_scale, bool fp8_allowed) {
  check_qkv(op, q, k, v, 4, "[batch, seqlen, heads, head_dim]", fp8_allowed);
  check_softmax_scale(op, softmax_scale);
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
}

AttentionShape check_varlen_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                   int64_t max_seqlen_k, const std::optional<Tensor>& seqused_k,
                                   std::optional<double> softmax_scale, bool fp8_allowed) {
  check_qkv(op, q, k, v, 3, "[total_tokens, heads, head_dim]", fp8_allowed);
  if (cu_seqlens_q.dim() != 1 || cu_seqlens_q.size(0) < 1) {
    fail(op, "cu_seqlens_q has shape ", shape_of(cu_seqlens_q), "; expected [batch + 1] offsets, batch >= 0");
  }
  const int64_t batch = cu_seqlens_q.size(0) - 1;
  check_offsets(op, "cu_seqlens_q", cu_seqlens_q, batch + 1, q);
  check_offsets(op, "cu_seqlens_k", cu_seqlens_k, batch + 1, q);
  if (seqused_k.has_value()) check_offsets(op, "seqused_k", *seqused_k, batch, q);
  if (max_seqlen_q < 0) fail(op, "max_seqlen_q is ", max_seqlen_q, "; expected >= 0");
  if (max_seqlen_k < 0) fail(op, "max_seqlen_k is ", max_seqlen_k, "; expected >= 0");
  check_softmax_scale(op, softmax_scale);
  return {batch, max_seqlen_q, max_seqlen_k, q.size(1), k.size(1), q.size(2)};
}

void check_varlen_values(const char* op, const AttentionShape& s, int64_t total_q, int64_t total_k,
                         const int32_t* cu_q, const int32_t* cu_k, const int32_t* seqused_k) {
  const int32_t* cus[] = {cu_q, cu_k};
  const char* names[] = {"cu_seqlens_q", "cu_seqlens_k"};
  const int64_t totals[] = {total_q, total_k}, maxima[] = {s.seqlen_q, s.seqlen_k};
  const char* max_names[] = {"max_seqlen_q", "max_seqlen_k"};
  for (int t = 0; t < 2; ++t) {
    if (cus[t][0] < 0) fail(op, names[t], "[0] is ", cus[t][0], "; expected >= 0");
    if (cus[t][s.batch] > totals[t]) {
      fail(op, names[t], "[", s.batch, "] is ", cus[t][s.batch], ", past the ", totals[t], " packed rows");
    }
    for (int64_t b = 0; b < s.batch; ++b) {
      const int64_t length = int64_t{cus[t][b + 1]} - cus[t][b];
      if (length < 0) fail(op, names[t], " decreases at ", b, ": ", cus[t][b], " then ", cus[t][b + 1]);
      if (length > maxima[t]) {
        fail(op, "sequence ", b, " has ", length, " rows in ", names[t], ", more than ", max_names[t], " = ",
             maxima[t]);
      }
    }
  }
  for (int64_t b = 0; seqused_k != nullptr && b < s.batch; ++b) {
    if (seqused_k[b] < 0 || seqused_k[b] > cu_k[b + 1] - cu_k[b]) {
      fail(op, "seqused_k[", b, "] is ", seqused_k[b], "; expected 0 to ", cu_k[b + 1] - cu_k[b],
           " (sequence ", b, "'s keys in cu_seqlens_k)");
    }
  }
}

void check_backward_inputs(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& dout,
                           const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse) {
  const char* names[] = {"dout", "out"};
  const Tensor* like_q[] = {&dout, &out};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *like_q[i];
    bool same_shape = t.dim() == q.dim();
    for (int64_t d = 0; same_shape && d < q.dim(); ++d) same_shape = t.size(d) == q.size(d);
    if (!same_shape) fail(op, names[i], " has shape ", shape_of(t), " but must match q's shape ", shape_of(q));
    check_same_device(op, names[i], t, "q", q);
    check_same_dtype(op, names[i], t, "q", q);
  }
  const std::optional<Tensor> stats[] = {lse, dlse};
  const char* stat_names[] = {"lse", "dlse"};
  for (int i = 0; i < 2; ++i) {
    if (!stats[i].has_value()) continue;
    const Tensor& t = *stats[i];
    if (q.dim() == 3) {  // packed: [heads, total_q]
      if (t.dim() != 2 || t.size(0) != s.heads || t.size(1) != q.size(0)) {
        fail(op, stat_names[i], " has shape ", shape_of(t), " but must be [heads, total_q] = [", s.heads, ", ",
             q.size(0), "]");
      }
    } else if (t.dim() != 3 || t.size(0) != s.batch || t.size(1) != s.heads || t.size(2) != s.seqlen_q) {
      fail(op, stat_names[i], " has shape ", shape_of(t), " but must be [batch, heads, seqlen_q] = [", s.batch, ", ",
           s.heads, ", ", s.seqlen_q, "]");
    }
    if (t.scalar_type() != lse_dtype(q.scalar_type())) {
      fail(op, stat_names[i], " has dtype ", dtype_name(t.scalar_type()), "; expected ",
           dtype_name(lse_dtype(q.scalar_type())));
    }
    check_same_device(op, stat_names[i], t, "q", q);
  }
}

}  // namespace fattn
