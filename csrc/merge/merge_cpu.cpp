// fattn::merge_attention_states on CPU, its arguments already checked (merge_op.cpp): the plain
// definition, in float64.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>

#include "common/propagating_max.h"
#include "merge/merge_impl.h"

namespace fattn {

std::tuple<Tensor, Tensor> merge_on_cpu(const MergeShape& m, const Tensor& outs, const Tensor& lses) {
  Tensor od = as_double(outs), ld = as_double(lses);
  Tensor out = torch::stable::new_zeros(od, {m.batch, m.seqlen_q, m.heads, m.head_dim});
  Tensor lse = torch::stable::new_empty(od, {m.batch, m.heads, m.seqlen_q});
  const double *O = od.const_data_ptr<double>(), *L = ld.const_data_ptr<double>();
  double *R = out.mutable_data_ptr<double>(), *RL = lse.mutable_data_ptr<double>();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t rows = m.batch * m.heads * m.seqlen_q;  // lse rows, [batch, heads, seqlen_q]
  for (int64_t b = 0; b < m.batch; ++b) {
    for (int64_t h = 0; h < m.heads; ++h) {
      for (int64_t i = 0; i < m.seqlen_q; ++i) {
        const int64_t row = (b * m.heads + h) * m.seqlen_q + i;
        double row_max = neg_inf;
        bool nan = false;  // a NaN lse poisons the row: it must not pass for "no key"
        for (int64_t s = 0; s < m.splits; ++s) {
          nan = nan || std::isnan(L[s * rows + row]);
          row_max = propagating_max(row_max, L[s * rows + row]);
        }
        double* r = R + ((b * m.seqlen_q + i) * m.heads + h) * m.head_dim;
        if (nan) {
          for (int64_t d = 0; d < m.head_dim; ++d) r[d] = std::numeric_limits<double>::quiet_NaN();
          RL[row] = std::numeric_limits<double>::quiet_NaN();
          continue;
        }
        if (row_max == neg_inf) {  // no part saw a key: out stays 0
          RL[row] = neg_inf;
          continue;
        }
        double denom = 0;
        for (int64_t s = 0; s < m.splits; ++s) {
          const double w = std::exp(L[s * rows + row] - row_max);
          if (w == 0) continue;  // a -inf part may hold anything in its out
          const double* o = O + (((s * m.batch + b) * m.seqlen_q + i) * m.heads + h) * m.head_dim;
          for (int64_t d = 0; d < m.head_dim; ++d) r[d] += w * o[d];
          denom += w;
        }
        for (int64_t d = 0; d < m.head_dim; ++d) r[d] /= denom;
        RL[row] = row_max + std::log(denom);
      }
    }
  }
  const auto dtype = outs.scalar_type();
  return {torch::stable::to(out, dtype), torch::stable::to(lse, lse_dtype(dtype))};
}

}  // namespace fattn
