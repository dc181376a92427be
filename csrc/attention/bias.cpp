#include "attention/bias.h"

#include "common/kernel_choice.h"

namespace fattn {

void check_bias(const char* op, const std::optional<Tensor>& bias, const AttentionShape& s, const Tensor& q) {
  if (!bias.has_value()) return;
  const Tensor& b = *bias;
  if (q.dim() != 4) fail(op, "bias takes the dense [batch, seqlen, heads, head_dim] layout");
  if (b.scalar_type() != q.scalar_type()) {
    fail(op, "bias has dtype ", dtype_name(b.scalar_type()), " but q has ", dtype_name(q.scalar_type()),
         "; the bias must have q's dtype");
  }
  const int64_t full[] = {s.batch, s.heads, s.seqlen_q};
  bool fits = b.dim() == 4 && b.size(3) == s.seqlen_k;
  for (int d = 0; fits && d < 3; ++d) fits = b.size(d) == full[d] || b.size(d) == 1;
  if (!fits) {
    fail(op, "bias has shape ", shape_of(b), "; expected [batch or 1, heads or 1, seqlen_q or 1, seqlen_k] = [",
         s.batch, ", ", s.heads, ", ", s.seqlen_q, ", ", s.seqlen_k, "]");
  }
  check_same_device(op, "bias", b, "q", q);
  if (s.seqlen_k > 1 && b.numel() > 0 && b.stride(3) != 1) {  // an empty bias is never read
    fail(op, "bias must have contiguous keys (stride 1 along its last dim); call .contiguous() first");
  }
}

void check_bias_grad(const char* op, const std::optional<Tensor>& bias, bool bias_grad) {
  if (bias_grad && !bias.has_value()) fail(op, "bias_grad=True needs a bias");
}


bool bias_rows_for_tma(const std::optional<Tensor>& bias) {
  if (!bias.has_value()) return false;
  const Tensor& b = *bias;
  const int64_t per_16_bytes = 16 / static_cast<int64_t>(b.element_size());
  const int64_t row = kernel_stride(b, 2);
  return reinterpret_cast<uintptr_t>(b.data_ptr()) % 16 == 0 && row > 0 && row % per_16_bytes == 0 &&
         kernel_stride(b, 0) % per_16_bytes == 0 && kernel_stride(b, 1) % per_16_bytes == 0;
}

CpuBias cpu_bias(const std::optional<Tensor>& bias) {
  CpuBias cpu;
  if (!bias.has_value()) return cpu;
  cpu.values = as_double(*bias);
  const Tensor& v = *cpu.values;
  cpu.data = v.const_data_ptr<double>();
  cpu.stride_b = kernel_stride(v, 0);
  cpu.stride_h = kernel_stride(v, 1);
  cpu.stride_q = kernel_stride(v, 2);
  return cpu;
}

}  // namespace fattn
