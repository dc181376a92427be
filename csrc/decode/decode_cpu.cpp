// fattn::decode on CPU: the plain definition of attention over a (paged) KV cache.
//
// It is the semantic reference of the CUDA split-K kernels: the in-place append,
// the page mapping, the bottom-right causal/window mask and the softcap, computed
// in float64 one row at a time. num_splits only shapes the CUDA launch: checked, then ignored.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_variant.h"
#include "decode/decode_shape.h"
#include "ops.h"

namespace fattn {
namespace {

constexpr const char* kOp = "fattn.decode";

// Writes the new tokens k[b, i], v[b, i] into cache position seqlens[b] + i.
void append_new_tokens(const DecodeShape& s, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                       const int32_t* seqlens, const int32_t* table) {
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seqlen_new; ++i) {
      const auto [page, slot] = s.key_location(table, b, seqlens[b] + i);
      Tensor k_dst = torch::stable::select(torch::stable::select(k_cache, 0, page), 0, slot);
      Tensor v_dst = torch::stable::select(torch::stable::select(v_cache, 0, page), 0, slot);
      torch::stable::copy_(k_dst, torch::stable::select(torch::stable::select(k, 0, b), 0, i));
      torch::stable::copy_(v_dst, torch::stable::select(torch::stable::select(v, 0, b), 0, i));
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> decode_cpu(FATTN_DECODE_ARGS) {
  const DecodeShape s = check_decode_inputs(kOp, q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                            softmax_scale, causal, window_left, window_right, softcap, num_splits,
                                            alibi_slopes, sinks);
  Tensor seqlens_t, table_t;
  const int32_t* seqlens = nullptr;
  const int32_t* table = nullptr;
  if (cache_seqlens) {
    seqlens_t = torch::stable::contiguous(*cache_seqlens);
    seqlens = seqlens_t.const_data_ptr<int32_t>();
  }
  if (block_table) {
    table_t = torch::stable::contiguous(*block_table);
    table = table_t.const_data_ptr<int32_t>();
  }
  check_decode_values(kOp, s, seqlens, table);
  if (k) append_new_tokens(s, k_cache, v_cache, *k, *v, seqlens, table);

  const double scale = resolve_softmax_scale(softmax_scale, s.head_dim);
  Tensor qd = as_double(q), kd = as_double(k_cache), vd = as_double(v_cache);
  Tensor out_d = torch::stable::new_zeros(qd, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  Tensor lse_d = torch::stable::new_empty(qd, {s.batch, s.heads, s.seqlen_q});
  const double* Q = qd.const_data_ptr<double>();
  const double* K = kd.const_data_ptr<double>();
  const double* V = vd.const_data_ptr<double>();
  double* O = out_d.mutable_data_ptr<double>();
  double* L = lse_d.mutable_data_ptr<double>();
  const int64_t D = s.head_dim, H = s.heads, HK = s.kv_heads, slots = k_cache.size(1);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  std::vector<double> scores;
  std::vector<const double*> v_rows;  // the visible keys' value rows
  const std::vector<ScoreMod> mods = score_mods(softcap, alibi_slopes, s.batch, s.heads);
  const std::vector<double> head_sinks = cpu_sinks(sinks);  // joins each row's denominator, no value

  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t seqlen_k = (seqlens ? seqlens[b] : s.capacity) + s.seqlen_new;
    const int64_t diagonal = seqlen_k - s.seqlen_q;  // bottom-right alignment
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();
      const ScoreMod& mod = mods[b * H + h];
      for (int64_t t = 0; t < s.seqlen_q; ++t) {
        const double* qt = Q + ((b * s.seqlen_q + t) * H + h) * D;
        scores.clear();
        v_rows.clear();
        const double sink = head_sinks.empty() ? neg_inf : head_sinks[h];
        double row_max = sink;
        for (int64_t j = 0; j < seqlen_k; ++j) {
          if (s.window_right >= 0 && j > t + diagonal + s.window_right) continue;
          if (s.window_left >= 0 && j < t + diagonal - s.window_left) continue;
          const auto [page, slot] = s.key_location(table, b, j);
          const int64_t row = ((page * slots + slot) * HK + hk) * D;
          double score = 0;
          for (int64_t d = 0; d < D; ++d) score += qt[d] * K[row + d];
          score = mod.score(score * scale, t, j, diagonal);
          scores.push_back(score);
          v_rows.push_back(V + row);
          row_max = std::max(row_max, score);
        }
        double* ot = O + ((b * s.seqlen_q + t) * H + h) * D;
        double* lt = L + (b * H + h) * s.seqlen_q + t;
        if (row_max == neg_inf) {  // no visible key (and no sink): out stays 0, lse is -inf
          *lt = neg_inf;
          continue;
        }
        double sum = head_sinks.empty() ? 0.0 : std::exp(sink - row_max);
        for (double& p : scores) sum += (p = std::exp(p - row_max));
        for (size_t j = 0; j < scores.size(); ++j) {
          for (int64_t d = 0; d < D; ++d) ot[d] += scores[j] / sum * v_rows[j][d];
        }
        *lt = row_max + std::log(sum);
      }
    }
  }
  return {torch::stable::to(out_d, q.scalar_type()), torch::stable::to(lse_d, lse_dtype(q.scalar_type()))};
}

}  // namespace fattn
