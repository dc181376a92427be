// fattn::forward on CPU: the plain, obviously-correct definition of the operator.
//
// It is the semantic reference of the CUDA kernels (same masking, same GQA mapping, same
// lse convention) and lets everything above the kernels run on machines without a GPU.
// It computes in float64 with a two-pass softmax.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_variant.h"
#include "ops.h"

namespace fattn {

std::tuple<Tensor, Tensor> forward_cpu(FATTN_FORWARD_ARGS) {
  (void)deterministic;
  constexpr const char* op = "fattn.forward";
  const AttentionShape s = check_attention_inputs(op, q, k, v, softmax_scale);
  const AttentionVariant variant =
      check_attention_variant(op, s, q, causal, window_left, window_right, softcap, alibi_slopes);
  const std::vector<ScoreMod> mods = score_mods(variant, s);
  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Tensor qd = as_double(q), kd = as_double(k), vd = as_double(v);
  Tensor out_d = torch::stable::new_zeros(qd, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse_d = torch::stable::new_empty(qd, {s.batch, s.heads, s.seqlen_q});
  const double* Q = qd.const_data_ptr<double>();
  const double* K = kd.const_data_ptr<double>();
  const double* V = vd.const_data_ptr<double>();
  double* O = out_d.mutable_data_ptr<double>();
  double* L = lse_d.mutable_data_ptr<double>();
  const int64_t D = s.head_dim, H = s.heads, HK = s.kv_heads;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> scores(s.seqlen_k);

  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();  // GQA: consecutive q heads share one kv head
      const ScoreMod& mod = mods[b * H + h];
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const double* qi = Q + ((b * s.seqlen_q + i) * H + h) * D;
        double row_max = neg_inf;
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          scores[j] = neg_inf;  // masked: weight exp(-inf) = 0
          if (!variant.visible(i, j, s.diagonal())) continue;
          const double* kj = K + ((b * s.seqlen_k + j) * HK + hk) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
          scores[j] = mod.score(dot * scale, i, j);
          row_max = std::max(row_max, scores[j]);
        }
        double* oi = O + ((b * s.seqlen_q + i) * H + h) * D;
        double* li = L + (b * H + h) * s.seqlen_q + i;
        if (row_max == neg_inf) {  // no visible key: out stays 0, lse is -inf
          *li = neg_inf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          scores[j] = std::exp(scores[j] - row_max);
          sum += scores[j];
        }
        for (int64_t j = 0; j < s.seqlen_k; ++j) {
          if (scores[j] == 0) continue;
          const double* vj = V + ((b * s.seqlen_k + j) * HK + hk) * D;
          const double p = scores[j] / sum;
          for (int64_t d = 0; d < D; ++d) oi[d] += p * vj[d];
        }
        *li = row_max + std::log(sum);
      }
    }
  }
  return {torch::stable::to(out_d, q.scalar_type()), torch::stable::to(lse_d, lse_dtype(q.scalar_type()))};
}

}  // namespace fattn
