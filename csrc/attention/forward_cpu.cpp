// fattn::forward and fattn::varlen_forward on CPU, their arguments already checked
// (attention_ops.cpp): the plain, obviously-correct definition.
//
// It is the semantic reference of the CUDA kernels (same masking, same GQA mapping, same
// lse convention) and lets everything above the kernels run on machines without a GPU.
// It computes in float64 with a two-pass softmax, one sequence at a time (sequence_spans.h
// says where each one's rows are, dense or packed); dropout (dropout.h) drops probabilities
// after the softmax, keeping the row's denominator. float8 inputs (fp8_inputs.h) are their values
// times the descales, and the probabilities reach V rounded to e4m3 against the row's maximum.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_impl.h"
#include "attention/sequence_spans.h"
#include "common/propagating_max.h"

namespace fattn {
namespace {

// out and lse are zero-filled float64 tensors shaped as the op returns them.
// sinks: one logit per head joining every row's denominator (none when empty).
// fp8: each probability reaches V as round_to_fp8(p * scale) / scale in e4m3 for p = exp(score -
// row max), over the unrounded row sum: the kernel's rounding where its running max is already
// the row's (earlier tiles round against a smaller max, which the accuracy rule allows for).
void attend(const AttentionShape& s, const AttentionVariant& variant, const SequenceSpans& spans, double scale,
            const std::vector<double>& sinks, const CpuDescales& descales, bool fp8, const Tensor& qd,
            const Tensor& kd, const Tensor& vd, Tensor& out_d, Tensor& lse_d) {
  const std::vector<ScoreMod> mods = score_mods(variant.softcap, variant.alibi_slopes, s.batch, s.heads);
  const CpuSegments segments = cpu_segments(variant, s);
  const CpuBias bias = cpu_bias(variant.bias);
  const Dropout& dropout = variant.dropout;
  const double* Q = qd.const_data_ptr<double>();
  const double* K = kd.const_data_ptr<double>();
  const double* V = vd.const_data_ptr<double>();
  double* O = out_d.mutable_data_ptr<double>();
  double* L = lse_d.mutable_data_ptr<double>();
  const int64_t D = s.head_dim, H = s.heads, HK = s.kv_heads;
  const double neg_inf = -std::numeric_limits<double>::infinity();

  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t diagonal = spans.diagonal(b), seqlen_k = spans.k_len[b];
    std::vector<double> scores(seqlen_k);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();  // GQA: consecutive q heads share one kv head
      const ScoreMod& mod = mods[b * H + h];
      const double score_scale = scale * descales.q[b * H + h] * descales.k[b * HK + hk];
      const double v_scale = descales.v[b * HK + hk];
      for (int64_t i = 0; i < spans.q_len[b]; ++i) {
        const int64_t row = (spans.q_start[b] + i) * H + h;
        const double sink = sinks.empty() ? neg_inf : sinks[h];
        double row_max = sink;
        for (int64_t j = 0; j < seqlen_k; ++j) {
          scores[j] = neg_inf;  // masked: weight exp(-inf) = 0
          if (!variant.visible(i, j, diagonal) || !segments.same(b, i, j)) continue;
          const double* kj = K + ((spans.k_start[b] + j) * HK + hk) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += Q[row * D + d] * kj[d];
          scores[j] = mod.score(dot * score_scale, i, j, diagonal + variant.alibi_offset) + bias.at(b, h, i, j);
          row_max = propagating_max(row_max, scores[j]);
        }
        double* lse = L + spans.lse_index(b, h, i);
        if (row_max == neg_inf) {  // no visible key (and no sink): out stays 0, lse is -inf
          *lse = neg_inf;
          continue;
        }
        double sum = sinks.empty() ? 0.0 : std::exp(sink - row_max);  // the sink carries no value
        for (int64_t j = 0; j < seqlen_k; ++j) {
          scores[j] = std::exp(scores[j] - row_max);
          sum += scores[j];
        }
        for (int64_t j = 0; j < seqlen_k; ++j) {
          if (scores[j] == 0 || !dropout.keep(b, h, i, j)) continue;
          const double* vj = V + ((spans.k_start[b] + j) * HK + hk) * D;
          const double weight = fp8 ? round_to_fp8(scores[j] * kFp8ProbabilityScale, ScalarType::Float8_e4m3fn) /
                                          kFp8ProbabilityScale
                                    : scores[j];
          const double p = weight / sum * dropout.scale * v_scale;
          for (int64_t d = 0; d < D; ++d) O[row * D + d] += p * vj[d];
        }
        *lse = row_max + std::log(sum);
      }
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> forward_on_cpu(const char* op, const AttentionShape& s, const AttentionVariant& variant,
                                          std::optional<double> softmax_scale, const Tensor& q, const Tensor& k,
                                          const Tensor& v, const std::optional<Tensor>& sinks, const Fp8Inputs& fp8,
                                          const std::optional<Tensor>& cu_seqlens_q,
                                          const std::optional<Tensor>& cu_seqlens_k,
                                          const std::optional<Tensor>& seqused_k) {
  const SequenceSpans spans = sequence_spans(op, s, q, k, cu_seqlens_q, cu_seqlens_k, seqused_k);
  // lse [batch, heads, seqlen_q], or [heads, total_q] packed.
  const std::vector<int64_t> lse_shape = cu_seqlens_q.has_value() ? std::vector<int64_t>{s.heads, q.size(0)}
                                                                  : std::vector<int64_t>{s.batch, s.heads, s.seqlen_q};
  Tensor qd = as_double(q), kd = as_double(k), vd = as_double(v);
  Tensor out_d = torch::stable::new_zeros(qd, sizes_of(q));
  Tensor lse_d = torch::stable::new_zeros(qd, lse_shape);
  attend(s, variant, spans, resolve_softmax_scale(softmax_scale, s.head_dim), cpu_sinks(sinks), cpu_descales(fp8, s),
         fp8.active, qd, kd, vd, out_d, lse_d);
  return {torch::stable::to(out_d, forward_output_dtype(q.scalar_type())),
          torch::stable::to(lse_d, lse_dtype(q.scalar_type()))};
}

}  // namespace fattn
