// FP8 q, k, v in fattn::forward and fattn::varlen_forward: what such a call may combine, the
// dtype of its output, and the descale factors as the CPU definition and the kernel take them
// (common/fp8.h says what an FP8 tensor and its descale stand for).
#pragma once

#include <optional>
#include <vector>

#include "attention/attention_shape.h"
#include "attention/attention_variant.h"
#include "common/fp8.h"

namespace fattn {

struct Fp8Inputs {
  bool active = false;  // q, k and v hold float8 values
  // float32 [batch, kv_heads] (q_descale also [batch, heads]); none stands for 1.
  std::optional<Tensor> q_descale, k_descale, v_descale;
};

// Descales go with float8 q, k, v only; float8 inputs take no bias, dropout or segment ids (and
// have no backward). Checked after the variant, before anything is allocated.
Fp8Inputs check_fp8_inputs(const char* op, const AttentionShape& s, const Tensor& q,
                           const AttentionVariant& variant, const std::optional<Tensor>& q_descale,
                           const std::optional<Tensor>& k_descale, const std::optional<Tensor>& v_descale);

// The forward's output dtype: bfloat16 for float8 inputs (FlashAttention-3's), q's otherwise.
ScalarType forward_output_dtype(ScalarType q);

// The descales as the CPU definition multiplies them in: q's per (b, h), k's and v's per (b, hk),
// flattened row-major over [batch, heads] and [batch, kv_heads]; all 1 without FP8.
struct CpuDescales {
  std::vector<double> q, k, v;
};
CpuDescales cpu_descales(const Fp8Inputs& fp8, const AttentionShape& s);


}  // namespace fattn
