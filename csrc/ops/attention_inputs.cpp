#include "ops/attention_inputs.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <stdexcept>

namespace fattn::ops {

using torch::headeronly::ScalarType;

bool attention_dtype_supported(const torch::stable::Tensor& t) {
  ScalarType s = t.scalar_type();
  if (s == ScalarType::Half || s == ScalarType::BFloat16) return true;
  // The CPU implementation is the semantic reference; it also takes fp32/fp64
  // so that references and gradcheck can run in full precision.
  return t.is_cpu() && (s == ScalarType::Float || s == ScalarType::Double);
}

std::string shape_of(const torch::stable::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Short: return "int16";
    case ScalarType::Char: return "int8";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Bool: return "bool";
    default: return torch::headeronly::toString(t);
  }
}

std::string device_name(const torch::stable::Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return "cpu";
  return "a device other than cpu or cuda";
}

AttentionShape check_attention_inputs(const char* op, const torch::stable::Tensor& q,
                                      const torch::stable::Tensor& k,
                                      const torch::stable::Tensor& v,
                                      std::optional<double> softmax_scale) {
  const char* names[] = {"q", "k", "v"};
  const torch::stable::Tensor* tensors[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    const auto& t = *tensors[i];
    if (t.dim() != 4) {
      fail(op, names[i], " must be a 4-D tensor [batch, seqlen, heads, head_dim], got shape ",
           shape_of(t));
    }
    if (!t.is_cuda() && !t.is_cpu()) fail(op, names[i], " must be a CUDA or CPU tensor");
  }
  for (int i = 1; i < 3; ++i) {
    const auto& t = *tensors[i];
    if (device_name(t) != device_name(q)) {
      fail(op, names[i], " is on ", device_name(t), " but q is on ", device_name(q),
           "; q, k and v must be on one device");
    }
  }
  if (!attention_dtype_supported(q)) {
    fail(op, "q has dtype ", dtype_name(q.scalar_type()), "; expected float16 or bfloat16",
         q.is_cpu() ? " (or float32/float64 on CPU)" : "");
  }
  for (int i = 1; i < 3; ++i) {
    const auto& t = *tensors[i];
    if (t.scalar_type() != q.scalar_type()) {
      fail(op, names[i], " has dtype ", dtype_name(t.scalar_type()), " but q has ",
           dtype_name(q.scalar_type()), "; q, k and v must share one dtype");
    }
  }
  AttentionShape s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3)};
  for (int i = 1; i < 3; ++i) {
    if (tensors[i]->size(0) != s.batch) {
      fail(op, names[i], " has batch size ", tensors[i]->size(0), " but q has ", s.batch);
    }
  }
  if (v.size(1) != k.size(1) || v.size(2) != k.size(2)) {
    fail(op, "v has shape ", shape_of(v), " but k has ", shape_of(k),
         "; k and v must agree on seqlen and heads");
  }
  for (int i = 1; i < 3; ++i) {
    if (tensors[i]->size(3) != s.head_dim) {
      fail(op, names[i], " has head_dim ", tensors[i]->size(3), " but q has ", s.head_dim,
           "; q, k and v must share one head_dim");
    }
  }
  if (s.head_dim < 8 || s.head_dim > kMaxHeadDim || s.head_dim % 8 != 0) {
    fail(op, "head_dim ", s.head_dim, " is not supported; expected a multiple of 8 from 8 to ",
         kMaxHeadDim);
  }
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) {
    fail(op, "q has ", s.heads, " heads, which is not a multiple of the ", s.kv_heads,
         " heads of k and v (GQA/MQA needs q heads = group size x kv heads)");
  }
  for (int i = 0; i < 3; ++i) {
    const auto& t = *tensors[i];
    if (t.stride(3) != 1) {
      fail(op, names[i], " must have a contiguous last dim (stride 1), got stride ", t.stride(3),
           "; call .contiguous() first");
    }
  }
  if (softmax_scale.has_value() && !std::isfinite(*softmax_scale)) {
    fail(op, "softmax_scale must be a finite number, got ", *softmax_scale);
  }
  return s;
}

void check_backward_inputs(const char* op, const AttentionShape& s, const torch::stable::Tensor& q,
                           const torch::stable::Tensor& dout, const torch::stable::Tensor& out,
                           const torch::stable::Tensor& lse,
                           const std::optional<torch::stable::Tensor>& dlse) {
  const char* names[] = {"dout", "out"};
  const torch::stable::Tensor* like_q[] = {&dout, &out};
  for (int i = 0; i < 2; ++i) {
    const auto& t = *like_q[i];
    if (t.dim() != 4 || t.size(0) != s.batch || t.size(1) != s.seqlen_q || t.size(2) != s.heads ||
        t.size(3) != s.head_dim) {
      fail(op, names[i], " has shape ", shape_of(t), " but must match q's shape ", shape_of(q));
    }
    if (device_name(t) != device_name(q)) {
      fail(op, names[i], " is on ", device_name(t), " but q is on ", device_name(q));
    }
    if (t.scalar_type() != q.scalar_type()) {
      fail(op, names[i], " has dtype ", dtype_name(t.scalar_type()), " but q has ",
           dtype_name(q.scalar_type()));
    }
  }
  std::optional<torch::stable::Tensor> stats[] = {lse, dlse};
  const char* stat_names[] = {"lse", "dlse"};
  for (int i = 0; i < 2; ++i) {
    if (!stats[i].has_value()) continue;
    const auto& t = *stats[i];
    if (t.dim() != 3 || t.size(0) != s.batch || t.size(1) != s.heads || t.size(2) != s.seqlen_q) {
      fail(op, stat_names[i], " has shape ", shape_of(t), " but must be [batch, heads, seqlen_q] = [",
           s.batch, ", ", s.heads, ", ", s.seqlen_q, "]");
    }
    if (t.scalar_type() != lse_dtype(q.scalar_type())) {
      fail(op, stat_names[i], " has dtype ", dtype_name(t.scalar_type()), "; expected ",
           dtype_name(lse_dtype(q.scalar_type())));
    }
    if (device_name(t) != device_name(q)) {
      fail(op, stat_names[i], " is on ", device_name(t), " but q is on ", device_name(q));
    }
  }
}

MergeShape check_merge_inputs(const char* op, const torch::stable::Tensor& outs,
                              const torch::stable::Tensor& lses) {
  if (outs.dim() != 5) {
    fail(op, "outs must be a 5-D tensor [splits, batch, seqlen_q, heads, head_dim], got shape ", shape_of(outs));
  }
  MergeShape m{outs.size(0), outs.size(1), outs.size(2), outs.size(3), outs.size(4)};
  if (m.splits < 1) fail(op, "outs must hold at least one partial result (splits >= 1)");
  if (lses.dim() != 4 || lses.size(0) != m.splits || lses.size(1) != m.batch || lses.size(2) != m.heads ||
      lses.size(3) != m.seqlen_q) {
    fail(op, "lses has shape ", shape_of(lses), " but must be [splits, batch, heads, seqlen_q] = [", m.splits,
         ", ", m.batch, ", ", m.heads, ", ", m.seqlen_q, "]");
  }
  if (device_name(lses) != device_name(outs)) {
    fail(op, "lses is on ", device_name(lses), " but outs is on ", device_name(outs));
  }
  const ScalarType t = outs.scalar_type();
  const bool float_out = t == ScalarType::Half || t == ScalarType::BFloat16 || t == ScalarType::Float ||
                         (outs.is_cpu() && t == ScalarType::Double);
  if (!float_out) fail(op, "outs has dtype ", dtype_name(t), "; expected float32, float16 or bfloat16");
  if (lses.scalar_type() != lse_dtype(t)) {
    fail(op, "lses has dtype ", dtype_name(lses.scalar_type()), "; expected ", dtype_name(lse_dtype(t)));
  }
  if (m.head_dim < 8 || m.head_dim > kMaxHeadDim || m.head_dim % 8 != 0) {
    fail(op, "head_dim ", m.head_dim, " is not supported; expected a multiple of 8 from 8 to ", kMaxHeadDim);
  }
  if (outs.stride(4) != 1) fail(op, "outs must have a contiguous last dim (stride 1), got stride ", outs.stride(4));
  return m;
}

torch::stable::Tensor as_double(const torch::stable::Tensor& t) {
  return torch::stable::contiguous(torch::stable::to(t, ScalarType::Double));
}

double resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim) {
  return softmax_scale.has_value() ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace fattn::ops
