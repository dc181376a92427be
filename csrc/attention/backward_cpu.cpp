// fattn::backward and fattn::varlen_backward on CPU, their arguments already checked
// (attention_ops.cpp): the plain definition of the gradients, in float64, one sequence at a
// time (sequence_spans.h).
//
// P is recomputed from the saved lse (as the kernels do), so the gradient is that
// of the forward that produced (out, lse). With S = scale * q k^T:
//   dV = P^T dO,  dP = dO V^T,  delta_i = sum_d dO_id O_id - dlse_i,
//   dS = P * (dP - delta),  dQ = scale * dS K,  dK = scale * dS^T Q,
// with dS times the softcap's derivative (ScoreMod::derivative) when there is one. The bias's
// gradient is dS before that factor. With dropout (keep mask Z, scale 1 / keep probability):
// dV = (P * Z * scale)^T dO and dP = (dO V^T) * Z * scale.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <vector>

#include "attention/attention_impl.h"
#include "attention/sequence_spans.h"

namespace fattn {

std::tuple<Tensor, Tensor, Tensor, Tensor> backward_on_cpu(
    const char* op, const AttentionShape& s, const AttentionVariant& variant, std::optional<double> softmax_scale,
    const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const std::optional<Tensor>& dlse, bool bias_grad, const std::optional<Tensor>& cu_seqlens_q,
    const std::optional<Tensor>& cu_seqlens_k, const std::optional<Tensor>& seqused_k) {
  const SequenceSpans spans = sequence_spans(op, s, q, k, cu_seqlens_q, cu_seqlens_k, seqused_k);
  const std::vector<ScoreMod> mods = score_mods(variant.softcap, variant.alibi_slopes, s.batch, s.heads);
  const CpuSegments segments = cpu_segments(variant, s);
  const CpuBias bias = cpu_bias(variant.bias);
  const Dropout& dropout = variant.dropout;
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Tensor qd = as_double(q), kd = as_double(k), vd = as_double(v), dod = as_double(dout), od = as_double(out);
  Tensor lsed = as_double(lse);
  Tensor dlsed = dlse.has_value() ? as_double(*dlse) : torch::stable::new_zeros(lsed, sizes_of(lse));
  // Zero-filled: keys no query sees, and rows outside every sequence, get 0.
  Tensor dq = torch::stable::new_zeros(qd, sizes_of(q));
  Tensor dk = torch::stable::new_zeros(qd, sizes_of(k));
  Tensor dv = torch::stable::new_zeros(qd, sizes_of(v));
  // dS before any broadcast of the bias: [batch, heads, seqlen_q, seqlen_k] (dense layout only).
  Tensor dbias = torch::stable::new_zeros(qd, bias_grad ? std::vector<int64_t>{s.batch, s.heads, s.seqlen_q, s.seqlen_k}
                                                        : std::vector<int64_t>{0});
  double* DB = dbias.mutable_data_ptr<double>();
  const double *Q = qd.const_data_ptr<double>(), *K = kd.const_data_ptr<double>(),
               *V = vd.const_data_ptr<double>(), *DO = dod.const_data_ptr<double>(),
               *O = od.const_data_ptr<double>(), *L = lsed.const_data_ptr<double>(),
               *DL = dlsed.const_data_ptr<double>();
  double *DQ = dq.mutable_data_ptr<double>(), *DK = dk.mutable_data_ptr<double>(),
         *DV = dv.mutable_data_ptr<double>();
  const int64_t D = s.head_dim, H = s.heads, HK = s.kv_heads;

  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t diagonal = spans.diagonal(b);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();
      const ScoreMod& mod = mods[b * H + h];
      for (int64_t i = 0; i < spans.q_len[b]; ++i) {
        const int64_t row = (spans.q_start[b] + i) * H + h;
        const double lse_i = L[spans.lse_index(b, h, i)];
        if (std::isinf(lse_i)) continue;  // a row that saw no key has no gradient
        double delta = -DL[spans.lse_index(b, h, i)];
        for (int64_t d = 0; d < D; ++d) delta += DO[row * D + d] * O[row * D + d];
        for (int64_t j = 0; j < spans.k_len[b]; ++j) {
          if (!variant.visible(i, j, diagonal) || !segments.same(b, i, j)) continue;
          const int64_t kv_row = (spans.k_start[b] + j) * HK + hk;
          double score = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            score += Q[row * D + d] * K[kv_row * D + d];
            dp += DO[row * D + d] * V[kv_row * D + d];
          }
          const double p =
              std::exp(mod.score(score * scale, i, j, diagonal + variant.alibi_offset) + bias.at(b, h, i, j) - lse_i);
          // Dropout: the kept probability reached out scaled, the dropped one not at all.
          const double kept = dropout.keep(b, h, i, j) ? dropout.scale : 0.0;
          const double ds_score = p * (dp * kept - delta);  // d loss / d score
          if (bias_grad) DB[((b * H + h) * s.seqlen_q + i) * s.seqlen_k + j] = ds_score;
          const double ds = ds_score * mod.derivative(score * scale);
          for (int64_t d = 0; d < D; ++d) {
            DV[kv_row * D + d] += p * kept * DO[row * D + d];
            DQ[row * D + d] += scale * ds * K[kv_row * D + d];
            DK[kv_row * D + d] += scale * ds * Q[row * D + d];
          }
        }
      }
    }
  }
  const ScalarType dtype = q.scalar_type();
  return {torch::stable::to(dq, dtype), torch::stable::to(dk, dtype), torch::stable::to(dv, dtype),
          torch::stable::to(dbias, lse_dtype(dtype))};
}

}  // namespace fattn
