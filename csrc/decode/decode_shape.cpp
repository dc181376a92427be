#include "decode/decode_shape.h"

#include <torch/csrc/stable/ops.h>

#include "attention/attention_variant.h"
#include "common/fp8.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

namespace fattn {
namespace {

void check_query(const char* op, const Tensor& q, DecodeShape& s) {
  check_rank(op, "q", q, 4, "[batch, seqlen_q, heads, head_dim]");
  check_attention_dtype(op, "q", q);
  s.batch = q.size(0);
  s.seqlen_q = q.size(1);
  s.heads = q.size(2);
  s.head_dim = q.size(3);
  if (s.seqlen_q < 1) fail(op, "q has seqlen ", s.seqlen_q, "; expected at least one query token per sequence");
  check_head_dim(op, s.head_dim);
  check_last_dim_contiguous(op, "q", q);
}

void check_caches(const char* op, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, DecodeShape& s) {
  const char* names[] = {"k_cache", "v_cache"};
  const Tensor* caches[] = {&k_cache, &v_cache};
  for (int i = 0; i < 2; ++i) {
    const Tensor& c = *caches[i];
    if (c.dim() != 4) {
      fail(op, names[i], " must be a 4-D tensor [batch, capacity, kv_heads, head_dim] (or [num_pages, ",
           "page_size, kv_heads, head_dim] with block_table), got shape ", shape_of(c));
    }
    check_same_device(op, names[i], c, "q", q);
    if (!is_fp8(k_cache.scalar_type()) && !is_fp8(v_cache.scalar_type())) check_same_dtype(op, names[i], c, "q", q);
    if (c.size(3) != s.head_dim) fail(op, names[i], " has head_dim ", c.size(3), " but q has ", s.head_dim);
    check_last_dim_contiguous(op, names[i], c);
  }
  if (v_cache.size(0) != k_cache.size(0) || v_cache.size(1) != k_cache.size(1) || v_cache.size(2) != k_cache.size(2)) {
    fail(op, "v_cache has shape ", shape_of(v_cache), " but k_cache has ", shape_of(k_cache),
         "; they must have the same shape");
  }
  s.kv_heads = k_cache.size(2);
  check_head_groups(op, s.heads, s.kv_heads, "k_cache and v_cache");
}

// An FP8 KV cache: both caches in one FP8 format (q and the new tokens keep their 16-bit dtype),
// and the descale factors only with it.
void check_fp8_caches(const char* op, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      const std::optional<Tensor>& k_descale, const std::optional<Tensor>& v_descale,
                      DecodeShape& s) {
  const ScalarType kt = k_cache.scalar_type(), vt = v_cache.scalar_type();
  if ((is_fp8(kt) || is_fp8(vt)) && kt != vt) {
    fail(op, "k_cache has dtype ", dtype_name(kt), " but v_cache has ", dtype_name(vt),
         "; an FP8 KV cache has both caches in the same FP8 dtype (float8_e4m3fn or float8_e5m2)");
  }
  s.kv_fp8 = fp8_flag(kt);
  const char* names[] = {"k_descale", "v_descale"};
  const std::optional<Tensor>* given[] = {&k_descale, &v_descale};
  for (int i = 0; i < 2; ++i) {
    if (given[i]->has_value() && s.kv_fp8 == 0) {
      fail(op, names[i], " is given but the caches have dtype ", dtype_name(kt), "; descale factors go with an FP8 ",
           "KV cache (float8_e4m3fn or float8_e5m2)");
    }
    check_descale(op, names[i], *given[i], s.batch, s.kv_heads, 0, q);
  }
}

// cache_batch_idx and cache_leftpad: int32 [batch] on q's device.
void check_row_indices(const char* op, const Tensor& q, const std::optional<Tensor>& cache_batch_idx,
                       const std::optional<Tensor>& cache_leftpad, const std::optional<Tensor>& block_table,
                       DecodeShape& s) {
  const char* names[] = {"cache_batch_idx", "cache_leftpad"};
  const std::optional<Tensor>* given[] = {&cache_batch_idx, &cache_leftpad};
  for (int i = 0; i < 2; ++i) {
    if (!given[i]->has_value()) continue;
    check_index_tensor(op, names[i], **given[i], 1, q);
    if ((*given[i])->size(0) != s.batch) {
      fail(op, names[i], " has shape ", shape_of(**given[i]), "; expected [batch] = [", s.batch, "]");
    }
  }
  s.batch_idx = cache_batch_idx.has_value();
  s.leftpad = cache_leftpad.has_value();
  if (s.batch_idx && block_table.has_value()) {
    fail(op, "cache_batch_idx and block_table are both given; cache_batch_idx picks rows of a contiguous cache, ",
         "with a paged cache block_table already says where each sequence lives");
  }
}

void check_pages(const char* op, const Tensor& q, const Tensor& k_cache, const std::optional<Tensor>& block_table,
                 DecodeShape& s) {
  s.paged = block_table.has_value();
  if (!s.paged) {
    if (!s.batch_idx && k_cache.size(0) != s.batch) {
      fail(op, "k_cache has batch size ", k_cache.size(0), " but q has ", s.batch,
           " (a paged cache needs block_table; a cache with other rows, cache_batch_idx)");
    }
    if (s.batch_idx && k_cache.size(0) == 0 && s.batch > 0) fail(op, "k_cache has no rows for cache_batch_idx to pick");
    s.capacity = k_cache.size(1);
    s.page_size = s.capacity;
    s.num_pages = k_cache.size(0);
    s.pages_per_seq = 1;
    return;
  }
  const Tensor& t = *block_table;
  check_index_tensor(op, "block_table", t, 2, q);
  if (t.size(0) != s.batch) {
    fail(op, "block_table has shape ", shape_of(t), "; expected [batch, pages_per_seq] with batch ", s.batch);
  }
  if (t.stride(1) != 1) fail(op, "block_table must have a contiguous last dim (stride 1)");
  s.num_pages = k_cache.size(0);
  s.page_size = k_cache.size(1);
  s.pages_per_seq = t.size(1);
  if (s.page_size < 16 || s.page_size % 16 != 0) {
    fail(op, "page_size (k_cache.size(1) with block_table) is ", s.page_size, "; expected a multiple of 16");
  }
  s.capacity = s.pages_per_seq * s.page_size;
}

void check_new_tokens(const char* op, const Tensor& q, const std::optional<Tensor>& k, const std::optional<Tensor>& v,
                      const std::optional<Tensor>& cache_seqlens, DecodeShape& s) {
  if (k.has_value() != v.has_value()) {
    fail(op, k.has_value() ? "k is given but v is not" : "v is given but k is not",
         "; pass both new keys and new values, or neither");
  }
  if (k.has_value()) {
    const char* names[] = {"k", "v"};
    const Tensor* news[] = {&*k, &*v};
    for (int i = 0; i < 2; ++i) {
      const Tensor& t = *news[i];
      if (t.dim() != 4 || t.size(0) != s.batch || t.size(2) != s.kv_heads || t.size(3) != s.head_dim) {
        fail(op, names[i], " has shape ", shape_of(t), "; expected [batch, seqlen_new, kv_heads, head_dim] = [",
             s.batch, ", seqlen_new, ", s.kv_heads, ", ", s.head_dim, "]");
      }
      check_same_device(op, names[i], t, "q", q);
      check_same_dtype(op, names[i], t, "q", q);
      check_last_dim_contiguous(op, names[i], t);
    }
    if (v->size(1) != k->size(1)) fail(op, "v has ", v->size(1), " new tokens but k has ", k->size(1));
    s.seqlen_new = k->size(1);
    if (s.seqlen_new > s.capacity) {
      fail(op, "k has ", s.seqlen_new, " new tokens, more than the cache holds (capacity ", s.capacity, ")");
    }
    if (!cache_seqlens.has_value()) fail(op, "k and v are given but cache_seqlens is not: it says where the new tokens go");
  }
  if (cache_seqlens.has_value()) {
    check_index_tensor(op, "cache_seqlens", *cache_seqlens, 1, q);
    if (cache_seqlens->size(0) != s.batch) {
      fail(op, "cache_seqlens has shape ", shape_of(*cache_seqlens), "; expected [batch] = [", s.batch, "]");
    }
  }
}

// rotary_cos/sin [seqlen_ro, rotary_dim / 2] in q's dtype, covering the cache (flash-attn's rule),
// applied to q and to the new keys, so the new keys are required.
void check_rotary(const char* op, const Tensor& q, const std::optional<Tensor>& rotary_cos,
                  const std::optional<Tensor>& rotary_sin, const std::optional<Tensor>& k, bool rotary_interleaved,
                  DecodeShape& s) {
  s.rotary_dim = 0;
  s.seqlen_ro = 0;
  s.rotary_interleaved = rotary_interleaved;
  if (rotary_cos.has_value() != rotary_sin.has_value()) {
    fail(op, rotary_cos.has_value() ? "rotary_cos is given but rotary_sin is not"
                                    : "rotary_sin is given but rotary_cos is not",
         "; pass both, or neither");
  }
  if (!rotary_cos.has_value()) return;
  const char* names[] = {"rotary_cos", "rotary_sin"};
  const Tensor* tables[] = {&*rotary_cos, &*rotary_sin};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *tables[i];
    check_rank(op, names[i], t, 2, "[seqlen_ro, rotary_dim / 2]");
    check_same_device(op, names[i], t, "q", q);
    check_same_dtype(op, names[i], t, "q", q);
    check_last_dim_contiguous(op, names[i], t);
  }
  if (rotary_sin->size(0) != rotary_cos->size(0) || rotary_sin->size(1) != rotary_cos->size(1)) {
    fail(op, "rotary_sin has shape ", shape_of(*rotary_sin), " but rotary_cos has ", shape_of(*rotary_cos),
         "; they must have the same shape");
  }
  s.rotary_dim = 2 * rotary_cos->size(1);
  s.seqlen_ro = rotary_cos->size(0);
  if (s.rotary_dim < 2 || s.rotary_dim > s.head_dim) {
    fail(op, "rotary_cos has shape ", shape_of(*rotary_cos), "; expected [seqlen_ro, rotary_dim / 2] with 2 <= ",
         "rotary_dim <= head_dim = ", s.head_dim);
  }
  if (s.seqlen_ro < s.capacity) {
    fail(op, "rotary_cos has ", s.seqlen_ro, " positions but the cache holds ", s.capacity,
         " keys per sequence; expected at least as many positions as the cache's capacity");
  }
  if (!k.has_value()) {
    fail(op, "rotary_cos/rotary_sin are given but k/v are not; the rotary embedding is applied to q and to ",
         "the new keys as they are appended, so pass the new k and v");
  }
}

// The append writes each cache row once; a cache whose rows alias (an expanded view, stride 0
// along a dim of size > 1) would be written through several positions at once.
void check_writable_caches(const char* op, const Tensor& k_cache, const Tensor& v_cache) {
  const char* names[] = {"k_cache", "v_cache"};
  const Tensor* caches[] = {&k_cache, &v_cache};
  for (int i = 0; i < 2; ++i) {
    for (int64_t d = 0; d < caches[i]->dim(); ++d) {
      if (caches[i]->size(d) > 1 && caches[i]->stride(d) == 0) {
        fail(op, names[i], " is an expanded view (stride 0 along dim ", d, "): its rows alias, so the new ",
             "tokens cannot be appended in place; pass a cache with its own memory");
      }
    }
  }
}

// Pages holding keys [0, keys) of a sequence.
int64_t pages_used(const DecodeShape& s, int64_t keys) { return (keys + s.page_size - 1) / s.page_size; }

// cache_seqlens[b] (+ the new tokens) past what sequence b can hold: with a paged cache the bound
// is block_table's width, which is what the caller resizes (flash-attn's message names it too).
[[noreturn]] void fail_over_capacity(const char* op, const DecodeShape& s, int64_t b, int64_t cached) {
  const int64_t keys = cached + s.seqlen_new;
  std::string need = "cache_seqlens[" + to_text(b) + "] = " + to_text(cached);
  if (s.seqlen_new > 0) need += " plus " + to_text(s.seqlen_new) + " new tokens (= " + to_text(keys) + " keys)";
  const char* what = s.seqlen_new > 0 ? "cache too small for the append: " : "cache too small: ";
  if (s.paged) {
    fail(op, "paged KV ", what, need, " exceeds the capacity addressable by block_table (", s.pages_per_seq,
         s.pages_per_seq == 1 ? " column" : " columns", " x page_size ", s.page_size, " = ", s.capacity,
         " keys per sequence); allocate more columns in block_table (at least ", pages_used(s, keys),
         " for this sequence)");
  }
  fail(op, what, need, " exceeds k_cache's capacity of ", s.capacity, " keys per sequence (k_cache.size(1))",
       s.seqlen_new > 0 ? "; allocate a longer cache" : "; cache_seqlens counts the keys already cached, at most that");
}

// With an append, a page that a sequence writes its new tokens into must be no other sequence's:
// that one would read (or, appending too, overwrite) keys that are not its own. Pages shared only
// for reading (a common prefix) are fine. The appended pages are few (about seqlen_new /
// page_size + 1 per sequence), so they go in a hash map, and every page each sequence reads is
// looked up once: O(batch * pages_per_seq), nothing sized by num_pages. The block_table entries
// were range-checked before.
void check_appended_pages(const char* op, const DecodeShape& s, const DecodeIndices& ix) {
  struct Writer {
    int64_t b, column;
  };
  std::unordered_map<int32_t, Writer> writers;
  writers.reserve(static_cast<size_t>(s.batch * (s.seqlen_new / s.page_size + 2)));
  const char* hint = "; sequences that append need pages of their own (pages shared for reading, a common prefix, "
                     "must not be appended into)";
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t cached = ix.seqlens[b];
    for (int64_t p = cached / s.page_size; p < pages_used(s, cached + s.seqlen_new); ++p) {
      const int32_t page = ix.table[b * s.pages_per_seq + p];
      const auto [it, inserted] = writers.try_emplace(page, Writer{b, p});
      if (!inserted && it->second.b != b) {
        fail(op, "sequences ", it->second.b, " and ", b, " both append into page ", page, " (block_table[",
             it->second.b, ", ", it->second.column, "] and block_table[", b, ", ", p, "])", hint);
      }
    }
  }
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t p = 0; p < pages_used(s, ix.seqlens[b] + s.seqlen_new); ++p) {
      const int32_t page = ix.table[b * s.pages_per_seq + p];
      const auto it = writers.find(page);
      if (it != writers.end() && it->second.b != b) {
        fail(op, "sequence ", it->second.b, " appends into page ", page, " (block_table[", it->second.b, ", ",
             it->second.column, "]), which sequence ", b, " also reads (block_table[", b, ", ", p, "])", hint);
      }
    }
  }
}

}  // namespace

DecodeShape check_decode_inputs(const char* op, const DecodeInputs& in) {
  const Tensor& q = in.q;
  DecodeShape s{};
  check_query(op, q, s);
  check_caches(op, q, in.k_cache, in.v_cache, s);
  check_fp8_caches(op, q, in.k_cache, in.v_cache, in.k_descale, in.v_descale, s);
  check_row_indices(op, q, in.cache_batch_idx, in.cache_leftpad, in.block_table, s);
  check_pages(op, q, in.k_cache, in.block_table, s);
  check_new_tokens(op, q, in.k, in.v, in.cache_seqlens, s);
  check_rotary(op, q, in.rotary_cos, in.rotary_sin, in.k, in.rotary_interleaved, s);
  if (in.k.has_value()) check_writable_caches(op, in.k_cache, in.v_cache);
  check_softmax_scale(op, in.softmax_scale);
  check_window(op, in.window_left, in.window_right);
  check_softcap(op, in.softcap);
  if (in.alibi_slopes.has_value()) check_alibi_slopes(op, *in.alibi_slopes, q, s.batch, s.heads);
  check_sinks(op, in.sinks, q, s.heads);
  if (in.num_splits < 0 || in.num_splits > kMaxDecodeSplits) {
    fail(op, "num_splits is ", in.num_splits, "; expected 0 (automatic) or 1 to ", kMaxDecodeSplits);
  }
  // A window side of capacity + seqlen_q keys or more hides nothing: it is stored as
  // unbounded, which also keeps it within the kernels' 32-bit bounds.
  s.window_left = bounded_window(in.window_left, s.capacity + s.seqlen_q);
  s.window_right = in.causal ? 0 : bounded_window(in.window_right, s.capacity + s.seqlen_q);
  // flash-attn's rule: a window side is local when it is below the cache's capacity.
  s.rotary_per_token = in.causal || (in.window_left >= 0 && in.window_left < s.capacity) ||
                       (in.window_right >= 0 && in.window_right < s.capacity);
  return s;
}

void check_decode_values(const char* op, const DecodeShape& s, const DecodeIndices& ix) {
  std::vector<bool> row_taken(s.batch_idx ? s.num_pages : 0, false);
  for (int64_t b = 0; b < s.batch; ++b) {
    int64_t cached = s.capacity;
    if (ix.seqlens != nullptr) {
      cached = ix.seqlens[b];
      if (cached < 0) fail(op, "cache_seqlens[", b, "] is ", cached, "; expected >= 0");
      if (cached + s.seqlen_new > s.capacity) fail_over_capacity(op, s, b, cached);
    }
    const int64_t keys = cached + s.seqlen_new;
    if (ix.batch_idx != nullptr) {
      const int32_t row = ix.batch_idx[b];
      if (row < 0 || row >= s.num_pages) {
        fail(op, "cache_batch_idx[", b, "] is ", row, "; expected a row of k_cache in [0, ", s.num_pages, ")");
      }
      if (s.seqlen_new > 0 && row_taken[row]) {
        fail(op, "cache_batch_idx[", b, "] is ", row, ", a row another sequence appends to as well; the rows of ",
             "sequences that append must be distinct");
      }
      row_taken[row] = true;
    }
    if (ix.leftpad != nullptr && (ix.leftpad[b] < 0 || ix.leftpad[b] > s.capacity)) {
      fail(op, "cache_leftpad[", b, "] is ", ix.leftpad[b], "; expected a key index in [0, ", s.capacity, "]");
    }
    if (s.rotary_dim > 0) {
      const int64_t last = std::max(keys - 1, s.query_position(cached, s.seqlen_q - 1));
      if (last >= s.seqlen_ro) {
        fail(op, "sequence ", b, " needs the rotary position ", last, " but rotary_cos has ", s.seqlen_ro,
             " positions");
      }
    }
    // Only the pages that hold the sequence's keys are read: the rest of its row may be padding.
    for (int64_t p = 0; ix.table != nullptr && p < pages_used(s, keys); ++p) {
      const int32_t page = ix.table[b * s.pages_per_seq + p];
      if (page < 0 || page >= s.num_pages) {
        fail(op, "block_table[", b, ", ", p, "] is ", page, "; expected a page index in [0, ", s.num_pages, ")");
      }
    }
  }
  if (s.paged && s.seqlen_new > 0 && ix.table != nullptr && ix.seqlens != nullptr) check_appended_pages(op, s, ix);
}

HostDecodeIndices host_decode_indices(const DecodeInputs& in) {
  HostDecodeIndices host;
  auto on_host = [&host](const std::optional<Tensor>& t, int i) -> const int32_t* {
    if (!t) return nullptr;
    const torch::stable::Device cpu(torch::headeronly::DeviceType::CPU);
    host.held[i] = torch::stable::contiguous(torch::stable::to(*t, cpu));
    return host.held[i].const_data_ptr<int32_t>();
  };
  host.indices = {on_host(in.cache_seqlens, 0), on_host(in.cache_batch_idx, 1), on_host(in.cache_leftpad, 2),
                  on_host(in.block_table, 3)};
  return host;
}

}  // namespace fattn
