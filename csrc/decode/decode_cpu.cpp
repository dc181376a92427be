// fattn::decode on CPU, its arguments already checked (decode_op.cpp): the plain definition of
// attention over a (paged) KV cache.
//
// It is the semantic reference of the CUDA kernels: the rotary embedding, the in-place
// append, the page and row mapping, the left padding, the bottom-right causal/window mask,
// softcap, ALiBi and sinks, computed in float64 one row at a time. num_splits only shapes
// the CUDA launch: checked, then ignored. An FP8 cache is dequantized (each value times its
// sequence's descale) and the new tokens quantized into it (round_to_fp8 of x / descale, the
// rounding the kernels' conversion does).
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_variant.h"
#include "common/fp8.h"
#include "common/propagating_max.h"
#include "decode/decode_impl.h"

namespace fattn {
namespace {

constexpr const char* kOp = "fattn.decode";

// The rotary embedding's tables in float64, [seqlen_ro, rotary_dim / 2] contiguous.
struct RotaryTables {
  Tensor cos_t, sin_t;
  const double* cos = nullptr;
  const double* sin = nullptr;
};

// x[0 : rotary_dim] of a row rotated at `position` in float64 (flash-attn's apply_rotary_emb):
// pairs (x[2i], x[2i+1]) when interleaved (GPT-J), (x[i], x[i + rotary_dim / 2]) otherwise
// (GPT-NeoX), each turned by the angle whose cos/sin are row `position`, column i of the tables.
// The rest of the row is copied.
void rotate(const DecodeShape& s, const RotaryTables& r, int64_t position, const double* x, double* out) {
  const int64_t half = s.rotary_dim / 2;
  for (int64_t d = s.rotary_dim; d < s.head_dim; ++d) out[d] = x[d];
  for (int64_t i = 0; i < half; ++i) {
    const double c = r.cos[position * half + i], sn = r.sin[position * half + i];
    const int64_t a = s.rotary_interleaved ? 2 * i : i;
    const int64_t b = s.rotary_interleaved ? 2 * i + 1 : i + half;
    out[a] = x[a] * c - x[b] * sn;
    out[b] = x[a] * sn + x[b] * c;
  }
}

// An FP8 cache's descale factors in float64, [batch, kv_heads] contiguous; all 1 when not given.
struct Descales {
  Tensor held;
  const double* values = nullptr;
  double at(const DecodeShape& s, int64_t b, int64_t kv_head) const {
    return values != nullptr ? values[b * s.kv_heads + kv_head] : 1.0;
  }
};

Descales host_descales(const std::optional<Tensor>& descale) {
  Descales d;
  if (descale) {
    d.held = torch::stable::contiguous(as_double(*descale));
    d.values = d.held.const_data_ptr<double>();
  }
  return d;
}

// New tokens x [batch, seqlen_new, kv_heads, head_dim] as an FP8 cache stores them, in float64:
// round_to_fp8(x / descale[b, kv_head]), saturated. Each value is one of the format's, so copying
// them into the cache converts exactly.
Tensor quantized(const DecodeShape& s, const Tensor& x, const Descales& descale, ScalarType format) {
  Tensor out = torch::stable::contiguous(as_double(x));
  if (out.data_ptr() == x.data_ptr()) out = torch::stable::clone(out);  // never write the caller's k/v
  double* p = out.mutable_data_ptr<double>();
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seqlen_new; ++i) {
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        double* row = p + ((b * s.seqlen_new + i) * s.kv_heads + h) * s.head_dim;
        for (int64_t d = 0; d < s.head_dim; ++d) row[d] = round_to_fp8(row[d] / descale.at(s, b, h), format);
      }
    }
  }
  return out;
}

// Writes the new tokens k[b, i] (rotated at position seqlens[b] + i when rotary is on) and
// v[b, i] into cache position seqlens[b] + i (quantized, for an FP8 cache).
void append_new_tokens(const DecodeShape& s, Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                       const DecodeIndices& ix, const RotaryTables& rotary, const Descales& k_descale,
                       const Descales& v_descale) {
  Tensor k_new = s.rotary_dim > 0 ? torch::stable::contiguous(as_double(k)) : k;
  Tensor v_new = v;
  if (s.rotary_dim > 0) {
    Tensor rotated = torch::stable::new_empty(k_new, {s.batch, s.seqlen_new, s.kv_heads, s.head_dim});
    const double* src = k_new.const_data_ptr<double>();
    double* dst = rotated.mutable_data_ptr<double>();
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t i = 0; i < s.seqlen_new; ++i) {
        for (int64_t h = 0; h < s.kv_heads; ++h) {
          const int64_t row = ((b * s.seqlen_new + i) * s.kv_heads + h) * s.head_dim;
          rotate(s, rotary, ix.seqlens[b] + i, src + row, dst + row);
        }
      }
    }
    k_new = rotated;
  }
  if (s.kv_fp8 != 0) {
    k_new = quantized(s, k_new, k_descale, k_cache.scalar_type());
    v_new = quantized(s, v, v_descale, v_cache.scalar_type());
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seqlen_new; ++i) {
      const auto [page, slot] = s.key_location(ix.table, ix.batch_idx, b, ix.seqlens[b] + i);
      Tensor k_dst = torch::stable::select(torch::stable::select(k_cache, 0, page), 0, slot);
      Tensor v_dst = torch::stable::select(torch::stable::select(v_cache, 0, page), 0, slot);
      torch::stable::copy_(k_dst, torch::stable::select(torch::stable::select(k_new, 0, b), 0, i));
      torch::stable::copy_(v_dst, torch::stable::select(torch::stable::select(v_new, 0, b), 0, i));
    }
  }
}

// q [batch, seqlen_q, heads, head_dim] (float64, contiguous) with each query rotated at its
// position, then rounded to q's own dtype: the rotated queries are operands in that dtype, as
// the rotated keys are stored in the cache's.
Tensor rotated_queries(const DecodeShape& s, const RotaryTables& rotary, const Tensor& qd, const DecodeIndices& ix,
                       ScalarType dtype) {
  Tensor out = torch::stable::new_empty(qd, {s.batch, s.seqlen_q, s.heads, s.head_dim});
  const double* src = qd.const_data_ptr<double>();
  double* dst = out.mutable_data_ptr<double>();
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t cached = ix.seqlens ? ix.seqlens[b] : s.capacity;
    for (int64_t t = 0; t < s.seqlen_q; ++t) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t row = ((b * s.seqlen_q + t) * s.heads + h) * s.head_dim;
        rotate(s, rotary, s.query_position(cached, t), src + row, dst + row);
      }
    }
  }
  return torch::stable::to(torch::stable::to(out, dtype), ScalarType::Double);
}

}  // namespace

std::tuple<Tensor, Tensor> decode_on_cpu(const DecodeShape& s, const DecodeInputs& in) {
  // The device values are checked here, where reading them costs nothing (decode_shape.h).
  const HostDecodeIndices host = host_decode_indices(in);
  const DecodeIndices& ix = host.indices;
  check_decode_values(kOp, s, ix);
  RotaryTables rotary;
  if (s.rotary_dim > 0) {
    rotary.cos_t = torch::stable::contiguous(as_double(*in.rotary_cos));
    rotary.sin_t = torch::stable::contiguous(as_double(*in.rotary_sin));
    rotary.cos = rotary.cos_t.const_data_ptr<double>();
    rotary.sin = rotary.sin_t.const_data_ptr<double>();
  }
  Tensor k_cache = in.k_cache, v_cache = in.v_cache;  // written in place by the append
  const Descales k_scale = host_descales(in.k_descale), v_scale = host_descales(in.v_descale);
  if (in.k) append_new_tokens(s, k_cache, v_cache, *in.k, *in.v, ix, rotary, k_scale, v_scale);

  const Tensor& q = in.q;
  const double scale = resolve_softmax_scale(in.softmax_scale, s.head_dim);
  Tensor qd = torch::stable::contiguous(as_double(q)), kd = as_double(k_cache), vd = as_double(v_cache);
  if (s.rotary_dim > 0) qd = rotated_queries(s, rotary, qd, ix, q.scalar_type());
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
  const std::vector<ScoreMod> mods = score_mods(in.softcap, in.alibi_slopes, s.batch, s.heads);
  const std::vector<double> head_sinks = cpu_sinks(in.sinks);  // joins each row's denominator, no value

  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t cached = ix.seqlens ? ix.seqlens[b] : s.capacity;
    const int64_t seqlen_k = cached + s.seqlen_new;
    // Left padding hides the keys before it; the masks and ALiBi keep their positions (the
    // diagonal is the same whether keys are counted from 0 or from the padding).
    const int64_t first_key = ix.leftpad ? ix.leftpad[b] : 0;
    const int64_t diagonal = seqlen_k - s.seqlen_q;  // bottom-right alignment
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / s.group();
      const ScoreMod& mod = mods[b * H + h];
      // The cache's values stand for x * descale (1 for a 16-bit cache): per sequence and KV head.
      const double k_factor = k_scale.at(s, b, hk), v_factor = v_scale.at(s, b, hk);
      for (int64_t t = 0; t < s.seqlen_q; ++t) {
        const double* qt = Q + ((b * s.seqlen_q + t) * H + h) * D;
        scores.clear();
        v_rows.clear();
        const double sink = head_sinks.empty() ? neg_inf : head_sinks[h];
        double row_max = sink;
        for (int64_t j = first_key; j < seqlen_k; ++j) {
          if (s.window_right >= 0 && j > t + diagonal + s.window_right) continue;
          if (s.window_left >= 0 && j < t + diagonal - s.window_left) continue;
          const auto [page, slot] = s.key_location(ix.table, ix.batch_idx, b, j);
          const int64_t row = ((page * slots + slot) * HK + hk) * D;
          double score = 0;
          for (int64_t d = 0; d < D; ++d) score += qt[d] * (K[row + d] * k_factor);
          score = mod.score(score * scale, t, j, diagonal);
          scores.push_back(score);
          v_rows.push_back(V + row);
          row_max = propagating_max(row_max, score);
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
          for (int64_t d = 0; d < D; ++d) ot[d] += scores[j] / sum * (v_rows[j][d] * v_factor);
        }
        *lt = row_max + std::log(sum);
      }
    }
  }
  return {torch::stable::to(out_d, q.scalar_type()), torch::stable::to(lse_d, lse_dtype(q.scalar_type()))};
}

}  // namespace fattn
