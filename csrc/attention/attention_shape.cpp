#include "attention/attention_shape.h"

namespace fattn {

AttentionShape check_attention_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                      std::optional<double> softmax_scale) {
  const char* names[] = {"q", "k", "v"};
  const Tensor* tensors[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) check_rank(op, names[i], *tensors[i], 4, "[batch, seqlen, heads, head_dim]");
  for (int i = 1; i < 3; ++i) {
    if (!same_device(*tensors[i], q)) {
      fail(op, names[i], " is on ", device_name(*tensors[i]), " but q is on ", device_name(q),
           "; q, k and v must be on one device");
    }
  }
  check_attention_dtype(op, "q", q);
  for (int i = 1; i < 3; ++i) check_same_dtype(op, names[i], *tensors[i], "q", q);
  AttentionShape s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  for (int i = 1; i < 3; ++i) {
    if (tensors[i]->size(0) != s.batch) fail(op, names[i], " has batch size ", tensors[i]->size(0), " but q has ", s.batch);
  }
  if (v.size(1) != k.size(1) || v.size(2) != k.size(2)) {
    fail(op, "v has shape ", shape_of(v), " but k has ", shape_of(k), "; k and v must agree on seqlen and heads");
  }
  for (int i = 1; i < 3; ++i) {
    if (tensors[i]->size(3) != s.head_dim) {
      fail(op, names[i], " has head_dim ", tensors[i]->size(3), " but q has ", s.head_dim,
           "; q, k and v must share one head_dim");
    }
  }
  check_head_dim(op, s.head_dim);
  check_head_groups(op, s.heads, s.kv_heads, "k and v");
  for (int i = 0; i < 3; ++i) check_last_dim_contiguous(op, names[i], *tensors[i]);
  check_softmax_scale(op, softmax_scale);
  return s;
}

void check_backward_inputs(const char* op, const AttentionShape& s, const Tensor& q, const Tensor& dout,
                           const Tensor& out, const Tensor& lse, const std::optional<Tensor>& dlse) {
  const char* names[] = {"dout", "out"};
  const Tensor* like_q[] = {&dout, &out};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *like_q[i];
    if (t.dim() != 4 || t.size(0) != s.batch || t.size(1) != s.seqlen_q || t.size(2) != s.heads ||
        t.size(3) != s.head_dim) {
      fail(op, names[i], " has shape ", shape_of(t), " but must match q's shape ", shape_of(q));
    }
    check_same_device(op, names[i], t, "q", q);
    check_same_dtype(op, names[i], t, "q", q);
  }
  const std::optional<Tensor> stats[] = {lse, dlse};
  const char* stat_names[] = {"lse", "dlse"};
  for (int i = 0; i < 2; ++i) {
    if (!stats[i].has_value()) continue;
    const Tensor& t = *stats[i];
    if (t.dim() != 3 || t.size(0) != s.batch || t.size(1) != s.heads || t.size(2) != s.seqlen_q) {
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
