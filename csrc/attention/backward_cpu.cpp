// fattn::backward on CPU: the plain definition of the gradients, in float64.
//
// P is recomputed from the saved lse (as the kernels do), so the gradient is that
// of the forward that produced (out, lse). With S = scale * q k^T:
//   dV = P^T dO,  dP = dO V^T,  delta_i = sum_d dO_id O_id - dlse_i,
//   dS = P * (dP - delta),  dQ = scale * dS K,  dK = scale * dS^T Q,
// with dS times the softcap's derivative (ScoreMod::derivative) when there is one.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <vector>

#include "attention/attention_variant.h"
#include "ops.h"

namespace fattn {

std::tuple<Tensor, Tensor, Tensor> backward_cpu(FATTN_BACKWARD_ARGS) {
  (void)deterministic;  // the loops are always ordered
  const char* op = "fattn.backward";
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale);
  check_backward_inputs(op, s, q, dout, out, lse, dlse);
  const AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  const std::vector<ScoreMod> mods = score_mods(variant, s);
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Tensor qd = as_double(q), kd = as_double(k), vd = as_double(v), dod = as_double(dout), od = as_double(out);
  Tensor lsed = as_double(lse);
  Tensor dlsed = dlse.has_value() ? as_double(*dlse) : torch::stable::new_zeros(lsed, {s.batch, s.heads, s.seqlen_q});
  Tensor dq = torch::stable::new_zeros(qd, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor dk = torch::stable::new_zeros(qd, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim});
  Tensor dv = torch::stable::new_zeros(qd, {s.batch, s.seqlen_k, s.kv_heads, s.head_dim});
  const double *Q = qd.const_data_ptr<double>(), *K = kd.const_data_ptr<double>(),
               *V = vd.const_data_ptr<double>(), *DO = dod.const_data_ptr<double>(),
               *O = od.const_data_ptr<double>(), *L = lsed.const_data_ptr<double>(),
               *DL = dlsed.const_data_ptr<double>();
  double *DQ = dq.mutable_data_ptr<double>(), *DK = dk.mutable_data_ptr<double>(),
         *DV = dv.mutable_data_ptr<double>();
  const int64_t D = s.head_dim, H = s.heads, HK = s.kv_heads;
  const int64_t diagonal = s.diagonal();

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();
      const ScoreMod& mod = mods[b * H + h];
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t row = (b * s.seqlen_q + i) * H + h;
        const double lse_i = L[(b * H + h) * s.seqlen_q + i];
        if (std::isinf(lse_i)) continue;  // a row that saw no key has no gradient
        double delta = -DL[(b * H + h) * s.seqlen_q + i];
        for (int64_t d = 0; d < D; ++d) delta += DO[row * D + d] * O[row * D + d];
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          if (!variant.visible(i, j, diagonal)) continue;
          const int64_t kv_row = (b * s.seqlen_k + j) * HK + hk;
          double score = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            score += Q[row * D + d] * K[kv_row * D + d];
            dp += DO[row * D + d] * V[kv_row * D + d];
          }
          const double p = std::exp(mod.score(score * scale, i, j) - lse_i);
          const double ds = p * (dp - delta) * mod.derivative(score * scale);
          for (int64_t d = 0; d < D; ++d) {
            DV[kv_row * D + d] += p * DO[row * D + d];
            DQ[row * D + d] += scale * ds * K[kv_row * D + d];
            DK[kv_row * D + d] += scale * ds * Q[row * D + d];
          }
        }
      }
    }
  }
  const ScalarType dtype = q.scalar_type();
  return {torch::stable::to(dq, dtype), torch::stable::to(dk, dtype), torch::stable::to(dv, dtype)};
}

}  // namespace fattn
