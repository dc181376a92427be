#include "attention/fp8_inputs.h"

#include <torch/csrc/stable/ops.h>

namespace fattn {

namespace {

// One descale's values per (b, head) for heads [0, count): entry h // (count / columns).
std::vector<double> expand_descale(const std::optional<Tensor>& descale, int64_t batch, int64_t count) {
  std::vector<double> out(batch * count, 1.0);
  if (!descale.has_value()) return out;
  const Tensor d = as_double(*descale);
  const double* p = d.const_data_ptr<double>();
  const int64_t columns = d.size(1), per_entry = count / columns;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < count; ++h) out[b * count + h] = p[b * columns + h / per_entry];
  }
  return out;
}

}  // namespace

Fp8Inputs check_fp8_inputs(const char* op, const AttentionShape& s, const Tensor& q,
                           const AttentionVariant& variant, const std::optional<Tensor>& q_descale,
                           const std::optional<Tensor>& k_descale, const std::optional<Tensor>& v_descale) {
  const char* names[] = {"q_descale", "k_descale", "v_descale"};
  const std::optional<Tensor>* descales[] = {&q_descale, &k_descale, &v_descale};
  if (!is_fp8(q.scalar_type())) {
    for (int i = 0; i < 3; ++i) {
      if (descales[i]->has_value()) {
        fail(op, names[i], " is given but q has dtype ", dtype_name(q.scalar_type()),
             "; descale factors go with float8_e4m3fn or float8_e5m2 q, k and v");
      }
    }
    return {};
  }
  for (int i = 0; i < 3; ++i) check_descale(op, names[i], *descales[i], s.batch, s.kv_heads, i == 0 ? s.heads : 0, q);
  if (variant.bias.has_value()) fail(op, "float8 q, k and v take no bias");
  if (variant.dropout.active()) fail(op, "float8 q, k and v take no dropout (dropout_p must be 0)");
  if (variant.q_segment_ids.has_value()) fail(op, "float8 q, k and v take no segment ids");
  return {true, q_descale, k_descale, v_descale};
}

ScalarType forward_output_dtype(ScalarType q) { return is_fp8(q) ? ScalarType::BFloat16 : q; }

CpuDescales cpu_descales(const Fp8Inputs& fp8, const AttentionShape& s) {
  return {expand_descale(fp8.q_descale, s.batch, s.heads), expand_descale(fp8.k_descale, s.batch, s.kv_heads),
          expand_descale(fp8.v_descale, s.batch, s.kv_heads)};
}

}  // namespace fattn
