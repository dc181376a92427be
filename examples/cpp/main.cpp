// A LibTorch program (no Python) that decodes a few tokens through one attention block
// whose attention is fattn, and checks every step against plain LibTorch attention.
//
// The block holds a KV cache: the prompt is processed at once with causal attention,
// then each decode step projects one new token, appends its k/v to the cache and attends
// with fattn::forward(q_step [b, 1, h, d], k_cache[:, :len], v_cache[:, :len], causal).
// The cache slices are views (strided in batch), as a real server would pass them.
//
// Runs on CUDA in bfloat16 when a GPU is present, else on CPU in float32.
#include <fattn/fattn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>

namespace {

constexpr int64_t kBatch = 2, kQHeads = 8, kKvHeads = 2, kHeadDim = 64;
constexpr int64_t kHidden = kQHeads * kHeadDim;
constexpr int64_t kPrompt = 37, kSteps = 5;

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

// One attention layer: LibTorch projections around fattn, with a KV cache.
struct AttentionBlock {
  torch::Tensor wq, wk, wv, wo;  // [hidden, heads * head_dim] / [hidden, hidden]
  torch::Tensor k_cache, v_cache;  // [batch, capacity, kv_heads, head_dim]
  int64_t length = 0;              // tokens in the cache
  double tolerance;
  bool all_ok = true;

  AttentionBlock(torch::TensorOptions opts, double tol) : tolerance(tol) {
    const double s = 1.0 / std::sqrt(double(kHidden));
    wq = torch::randn({kHidden, kQHeads * kHeadDim}, opts) * s;
    wk = torch::randn({kHidden, kKvHeads * kHeadDim}, opts) * s;
    wv = torch::randn({kHidden, kKvHeads * kHeadDim}, opts) * s;
    wo = torch::randn({kHidden, kHidden}, opts) * s;
    k_cache = torch::zeros({kBatch, kPrompt + kSteps, kKvHeads, kHeadDim}, opts);
    v_cache = torch::zeros_like(k_cache);
  }

  // x [batch, n, hidden]: appends the n tokens to the cache, returns [batch, n, hidden].
  torch::Tensor step(const torch::Tensor& x, const char* label) {
    const int64_t n = x.size(1);
    auto q = torch::matmul(x, wq).view({kBatch, n, kQHeads, kHeadDim});
    k_cache.narrow(1, length, n).copy_(torch::matmul(x, wk).view({kBatch, n, kKvHeads, kHeadDim}));
    v_cache.narrow(1, length, n).copy_(torch::matmul(x, wv).view({kBatch, n, kKvHeads, kHeadDim}));
    length += n;
    auto k = k_cache.narrow(1, 0, length), v = v_cache.narrow(1, 0, length);

    auto [out, lse] = fattn::forward(q, k, v, std::nullopt, /*causal=*/true);

    auto [out_ref, lse_ref] = reference_attention(q, k, v);
    const double out_err = max_error(out, out_ref), lse_err = max_error(lse, lse_ref);
    const bool ok = out_err <= tolerance && lse_err <= tolerance;
    all_ok = all_ok && ok;
    std::printf("%-9s q_len=%-3lld kv_len=%-3lld max|out-ref|=%.3e max|lse-ref|=%.3e %s\n", label,
                (long long)n, (long long)length, out_err, lse_err, ok ? "ok" : "MISMATCH");
    return torch::matmul(out.reshape({kBatch, n, kHidden}), wo);
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
  auto y = block.step(torch::randn({kBatch, kPrompt, kHidden}, opts), "prefill");
  for (int64_t s = 1; s <= kSteps; ++s) {
    // Greedy-decode stand-in: the next token's input is the last output, normalized.
    auto x = torch::layer_norm(y.narrow(1, y.size(1) - 1, 1), {kHidden});
    char label[16];
    std::snprintf(label, sizeof label, "decode %lld", (long long)s);
    y = block.step(x, label);
  }
  std::printf("%s\n", block.all_ok ? "all steps match the LibTorch reference"
                                   : "MISMATCH against the LibTorch reference");
  return block.all_ok ? 0 : 1;
}
