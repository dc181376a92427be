#include "common/tensor_checks.h"

#include <torch/csrc/stable/ops.h>

#include <cmath>

namespace fattn {

std::string shape_of(const Tensor& t) {
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
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return torch::headeronly::toString(t);
  }
}

std::string device_name(const Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  if (t.is_cpu()) return "cpu";
  return "a device other than cpu or cuda";
}

void check_rank(const char* op, const char* name, const Tensor& t, int64_t rank, const char* layout) {
  if (t.dim() != rank) fail(op, name, " must be a ", rank, "-D tensor ", layout, ", got shape ", shape_of(t));
  if (!t.is_cuda() && !t.is_cpu()) fail(op, name, " must be a CUDA or CPU tensor");
}

bool same_device(const Tensor& a, const Tensor& b) {
  return a.is_cuda() == b.is_cuda() && a.is_cpu() == b.is_cpu() && a.get_device_index() == b.get_device_index();
}

void check_same_device(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  if (!same_device(t, ref)) {
    fail(op, name, " is on ", device_name(t), " but ", ref_name, " is on ", device_name(ref));
  }
}

void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  if (t.scalar_type() != ref.scalar_type()) {
    fail(op, name, " has dtype ", dtype_name(t.scalar_type()), " but ", ref_name, " has ",
         dtype_name(ref.scalar_type()));
  }
}

void check_last_dim_contiguous(const char* op, const char* name, const Tensor& t) {
  const int64_t stride = t.stride(t.dim() - 1);
  if (stride != 1) {
    fail(op, name, " must have a contiguous last dim (stride 1), got stride ", stride, "; call .contiguous() first");
  }
}

void check_attention_dtype(const char* op, const char* name, const Tensor& t) {
  const ScalarType s = t.scalar_type();
  // The CPU implementation is the semantic reference; it also takes fp32/fp64 so that
  // references and gradcheck can run in full precision.
  const bool ok = s == ScalarType::Half || s == ScalarType::BFloat16 ||
                  (t.is_cpu() && (s == ScalarType::Float || s == ScalarType::Double));
  if (!ok) {
    fail(op, name, " has dtype ", dtype_name(s), "; expected float16 or bfloat16",
         t.is_cpu() ? " (or float32/float64 on CPU)" : "");
  }
}

void check_index_tensor(const char* op, const char* name, const Tensor& t, int64_t rank, const Tensor& ref) {
  if (t.scalar_type() != ScalarType::Int) fail(op, name, " has dtype ", dtype_name(t.scalar_type()), "; expected int32");
  if (t.dim() != rank) fail(op, name, " must be a ", rank, "-D tensor, got shape ", shape_of(t));
  if (!same_device(t, ref)) fail(op, name, " is on ", device_name(t), " but q is on ", device_name(ref));
}

void check_head_dim(const char* op, int64_t head_dim) {
  if (head_dim < 8 || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    fail(op, "head_dim ", head_dim, " is not supported; expected a multiple of 8 from 8 to ", kMaxHeadDim);
  }
}

void check_head_groups(const char* op, int64_t heads, int64_t kv_heads, const char* kv_names) {
  if (kv_heads < 1 || heads % kv_heads != 0) {
    fail(op, "q has ", heads, " heads, which is not a multiple of the ", kv_heads, " heads of ", kv_names,
         " (GQA/MQA needs q heads = group size x kv heads)");
  }
}

void check_softmax_scale(const char* op, std::optional<double> softmax_scale) {
  if (softmax_scale.has_value() && !std::isfinite(*softmax_scale)) {
    fail(op, "softmax_scale must be a finite number, got ", *softmax_scale);
  }
}

double resolve_softmax_scale(std::optional<double> softmax_scale, int64_t head_dim) {
  return softmax_scale.has_value() ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

std::vector<int64_t> sizes_of(const Tensor& t) {
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < t.dim(); ++d) sizes.push_back(t.size(d));
  return sizes;
}

Tensor as_double(const Tensor& t) { return torch::stable::contiguous(torch::stable::to(t, ScalarType::Double)); }

}  // namespace fattn
