// A LibTorch program (no Python) that decodes a few tokens through one attention block
// whose attention is fattn, and checks every step against plain LibTorch attention.
//
// The block serves from a preallocated paged KV cache, as an inference server does:
// k_cache/v_cache [num_pages, page_size, kv_heads, head_dim] and a block_table whose rows
// list each sequence's pages, taken in shuffled order from the pool (two pages stay unused).
//   prefill:  the 37-token prompt attends with fattn::forward(q, k, v, causal); then
//             fattn::decode(q_last16, k_cache, v_cache, k, v, {}, {}, cache_seqlens, {}, {},
//             block_table, {}, causal) writes the prompt's k/v into the pages and attends with its last 16
//             queries (the check of the paged path against the prompt's own attention).
//   decode s: fattn::decode(q_step, k_cache, v_cache, k_step, v_step, {}, {}, cache_seqlens,
//             {}, {}, block_table, {}, causal) appends the new token in place and attends over the cache.
// fattn::decode does not advance cache_seqlens: the program adds the appended tokens itself.
// Every call is checked against float64 LibTorch attention over the k/v the program has
// produced so far, and after every append the cache must hold exactly those k/v at the
// pages the block_table names, and zeros everywhere else.
//
// Runs on CUDA in bfloat16 when a GPU is present, else on CPU in float32.
#include <fattn/fattn.h>
// The tensor API, the CUDA query and the seed, not <torch/torch.h>: its modules, optimisers and
// data loaders, which this program does not use, add about 40 % to its compile time.
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace {

constexpr int64_t kBatch = 2, kQHeads = 8, kKvHeads = 2, kHeadDim = 64;
constexpr int64_t kHidden = kQHeads * kHeadDim;
constexpr int64_t kPrompt = 37, kSteps = 5;
// The paged cache: pages of 16 tokens (fattn::decode wants a multiple of 16), enough per
// sequence for the prompt and every step, and a pool with two pages more than that.
constexpr int64_t kPageSize = 16;
constexpr int64_t kPagesPerSeq = (kPrompt + kSteps + kPageSize - 1) / kPageSize;
constexpr int64_t kNumPages = kBatch * kPagesPerSeq + 2;
constexpr int64_t kAppendQueries = 16;  // the prompt's last queries, attending as the prompt is appended

// Plain attention in float64: GQA by repeating k/v heads, causal aligned bottom-right.
// q [b, sq, h, d], k/v [b, sk, hk, d] -> (out [b, sq, h, d], lse [b, h, sq]).
std::tuple<torch::Tensor, torch::Tensor> reference_attention(const torch::Tensor& q,
                                                             const torch::Tensor& k,
                                                             const torch::Tensor& v) {
  const int64_t sq = q.size(1), sk = k.size(1), group = q.size(2) / k.size(2);
  auto qd = q.to(torch::kDouble).transpose(1, 2);  // [b, h, sq, d]
  auto kd = k.to(torch::kDouble).repeat_interleave(group, 2).transpose(1, 2);
  auto vd = v.to(torch::kDouble).repeat_interleave(group, 2).transpose(1, 2);
  auto scores = torch::matmul(qd, kd.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  // Query i sees key j iff j <= i + (sk - sq).
  auto hidden = torch::ones({sq, sk}, torch::dtype(torch::kBool).device(q.device())).triu(sk - sq + 1);
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  auto lse = torch::logsumexp(scores, -1);
  auto out = torch::matmul(torch::softmax(scores, -1), vd).transpose(1, 2);
  return {out, lse};
}

double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want).abs().max().item<double>();
}

// One attention layer: LibTorch projections around fattn, with a paged KV cache.
struct AttentionBlock {
  torch::Tensor wq, wk, wv, wo;  // [hidden, heads * head_dim] / [hidden, hidden]
  torch::Tensor k_cache, v_cache;  // [num_pages, page_size, kv_heads, head_dim], preallocated
  torch::Tensor block_table;       // int32 [batch, pages_per_seq]: sequence b's pages, in order
  torch::Tensor cache_seqlens;     // int32 [batch]: tokens in each sequence's cache
  torch::Tensor k_seen, v_seen;    // [batch, length, kv_heads, head_dim]: the reference's k/v
  int64_t length = 0;              // tokens so far (the same for every sequence here)
  double tolerance;
  bool all_ok = true;

  AttentionBlock(torch::TensorOptions opts, double tol) : tolerance(tol) {
    const double s = 1.0 / std::sqrt(double(kHidden));
    wq = torch::randn({kHidden, kQHeads * kHeadDim}, opts) * s;
    wk = torch::randn({kHidden, kKvHeads * kHeadDim}, opts) * s;
    wv = torch::randn({kHidden, kKvHeads * kHeadDim}, opts) * s;
    wo = torch::randn({kHidden, kHidden}, opts) * s;
    k_cache = torch::zeros({kNumPages, kPageSize, kKvHeads, kHeadDim}, opts);
    v_cache = torch::zeros_like(k_cache);
    const auto int_opts = torch::dtype(torch::kInt).device(opts.device());
    block_table = torch::randperm(kNumPages, int_opts).narrow(0, 0, kBatch * kPagesPerSeq)
                      .view({kBatch, kPagesPerSeq});
    cache_seqlens = torch::zeros({kBatch}, int_opts);
    k_seen = torch::empty({kBatch, 0, kKvHeads, kHeadDim}, opts);
    v_seen = torch::empty_like(k_seen);
  }

  std::string describe_cache() const {
    std::string rows;
    auto table = block_table.cpu();
    for (int64_t b = 0; b < kBatch; ++b) {
      rows += b ? ", [" : "[";
      for (int64_t p = 0; p < kPagesPerSeq; ++p) {
        rows += (p ? ", " : "") + std::to_string(table[b][p].item<int32_t>());
      }
      rows += "]";
    }
    return "paged KV cache: " + std::to_string(kNumPages) + " pages of " + std::to_string(kPageSize) +
           " tokens, block_table [" + rows + "]";
  }

  // The cache as it must be after the appends: k_seen/v_seen at the block_table's pages,
  // zeros in the unused slots and pages. Compared exactly: an append is a copy.
  bool cache_holds_what_was_appended() const {
    auto pos = torch::arange(length, torch::dtype(torch::kLong).device(k_cache.device()));
    auto pages = block_table.to(torch::kLong).index_select(1, torch::div(pos, kPageSize, "floor"));
    auto rows = (pages * kPageSize + pos.remainder(kPageSize)).flatten();  // [batch * length]
    bool same = true;
    for (const auto& [cache, seen] : {std::pair{k_cache, k_seen}, std::pair{v_cache, v_seen}}) {
      auto expected = torch::zeros_like(cache);
      expected.view({kNumPages * kPageSize, kKvHeads, kHeadDim})
          .index_copy_(0, rows, seen.reshape({kBatch * length, kKvHeads, kHeadDim}));
      same = same && torch::equal(cache, expected);
    }
    return same;
  }

  // Checks (out, lse) of q against the reference over every k/v so far, and prints a line.
  void check(const char* label, const torch::Tensor& q, const torch::Tensor& out, const torch::Tensor& lse,
             bool cache_ok = true) {
    auto [out_ref, lse_ref] = reference_attention(q, k_seen, v_seen);
    const double out_err = max_error(out, out_ref), lse_err = max_error(lse, lse_ref);
    const bool ok = out_err <= tolerance && lse_err <= tolerance && cache_ok;
    all_ok = all_ok && ok;
    std::printf("%-9s q_len=%-3lld kv_len=%-3lld max|out-ref|=%.3e max|lse-ref|=%.3e %s\n", label,
                (long long)q.size(1), (long long)length, out_err, lse_err, ok ? "ok" : "MISMATCH");
    if (!cache_ok) std::printf("  MISMATCH: the KV cache does not hold the k/v appended so far\n");
  }

  // Projections of x [batch, n, hidden] into q [batch, n, heads, head_dim], k and v.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project(const torch::Tensor& x) const {
    const int64_t n = x.size(1);
    return {torch::matmul(x, wq).view({kBatch, n, kQHeads, kHeadDim}),
            torch::matmul(x, wk).view({kBatch, n, kKvHeads, kHeadDim}),
            torch::matmul(x, wv).view({kBatch, n, kKvHeads, kHeadDim})};
  }

  // fattn::decode: appends k, v [batch, n, kv_heads, head_dim] to the paged cache in place and
  // attends with q; the program then advances cache_seqlens by n.
  std::tuple<torch::Tensor, torch::Tensor> decode_and_append(const torch::Tensor& q, const torch::Tensor& k,
                                                             const torch::Tensor& v) {
    auto result = fattn::decode(q, k_cache, v_cache, k, v, /*rotary_cos=*/std::nullopt, /*rotary_sin=*/std::nullopt,
                                cache_seqlens, /*cache_batch_idx=*/std::nullopt, /*cache_leftpad=*/std::nullopt,
                                block_table, /*softmax_scale=*/std::nullopt, /*causal=*/true);
    cache_seqlens.add_(k.size(1));
    k_seen = torch::cat({k_seen, k}, 1);
    v_seen = torch::cat({v_seen, v}, 1);
    length += k.size(1);
    return result;
  }

  // The prompt x [batch, n, hidden]: returns the block's output [batch, n, hidden].
  torch::Tensor prefill(const torch::Tensor& x) {
    const int64_t n = x.size(1);
    auto [q, k, v] = project(x);
    // Prefill attention over the prompt itself (the cache is still empty).
    auto [out, lse] = fattn::forward(q, k, v, std::nullopt, /*causal=*/true);
    // The prompt into the paged cache, attending with its last queries on the way.
    auto q_last = q.narrow(1, n - kAppendQueries, kAppendQueries);
    auto [out_last, lse_last] = decode_and_append(q_last, k, v);
    // k_seen/v_seen now hold the prompt's k/v: the reference of both calls.
    check("prefill", q, out, lse);
    check("append", q_last, out_last, lse_last, cache_holds_what_was_appended());
    return torch::matmul(out.reshape({kBatch, n, kHidden}), wo);
  }

  // One new token x [batch, 1, hidden]: returns [batch, 1, hidden].
  torch::Tensor decode(const torch::Tensor& x, const char* label) {
    auto [q, k, v] = project(x);
    auto [out, lse] = decode_and_append(q, k, v);
    check(label, q, out, lse, cache_holds_what_was_appended());
    return torch::matmul(out.reshape({kBatch, 1, kHidden}), wo);
  }
};

}  // namespace

int main() {
  c10::InferenceMode inference;
  torch::manual_seed(0);
  const bool cuda = torch::cuda::is_available();
  const auto opts = torch::TensorOptions()
                        .device(cuda ? torch::kCUDA : torch::kCPU)
                        .dtype(cuda ? torch::kBFloat16 : torch::kFloat32);
  // bf16 rounds the output to 8 bits of mantissa; the CPU path is exact up to fp32.
  const double tolerance = cuda ? 2e-2 : 1e-5;
  std::printf("fattn decode example on %s (%s): batch %lld, %lld q heads, %lld kv heads, head_dim %lld\n",
              cuda ? "cuda" : "cpu", cuda ? "bfloat16" : "float32", (long long)kBatch,
              (long long)kQHeads, (long long)kKvHeads, (long long)kHeadDim);

  AttentionBlock block(opts, tolerance);
  std::printf("%s\n", block.describe_cache().c_str());
  auto y = block.prefill(torch::randn({kBatch, kPrompt, kHidden}, opts));
  for (int64_t s = 1; s <= kSteps; ++s) {
    // Greedy-decode stand-in: the next token's input is the last output, normalized.
    auto x = torch::layer_norm(y.narrow(1, y.size(1) - 1, 1), {kHidden});
    char label[16];
    std::snprintf(label, sizeof label, "decode %lld", (long long)s);
    y = block.decode(x, label);
  }
  std::printf("%s\n", block.all_ok ? "all steps match the LibTorch reference"
                                   : "MISMATCH against the LibTorch reference");
  return block.all_ok ? 0 : 1;
}
