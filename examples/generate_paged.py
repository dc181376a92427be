"""Greedy generation with a paged KV cache: a one-layer toy decoder whose keys and values live in
pages of a shared pool, read and appended in place by fattn.flash_attn_with_kvcache (block_table
maps each sequence's positions to pages, as a serving engine's allocator would).

    python examples/generate_paged.py                  # CPU, float32, random weights
    python examples/generate_paged.py --device cuda --dtype bfloat16

The prompt runs as one prefill chunk per sequence over the same cache, then one token per step.
"""

import argparse

import torch

import fattn

VOCAB, HEADS, KV_HEADS, HEAD_DIM, PAGE = 100, 4, 2, 32, 16


class ToyDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        width = HEADS * HEAD_DIM
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.qkv = torch.nn.Linear(width, (HEADS + 2 * KV_HEADS) * HEAD_DIM)
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, tokens, k_cache, v_cache, block_table, cache_seqlens):
        """Logits of the last position; the new keys and values are appended to the caches."""
        batch, length = tokens.shape
        q, k, v = self.qkv(self.embed(tokens)).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(batch, length, HEADS, HEAD_DIM)
        k, v = (t.reshape(batch, length, KV_HEADS, HEAD_DIM) for t in (k, v))
        out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens,
                                           block_table=block_table, causal=True)
        return self.head(out[:, -1].flatten(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = ToyDecoder().to(device=args.device, dtype=dtype).eval()
    prompts = torch.randint(0, VOCAB, (3, 9), device=args.device)
    capacity = prompts.shape[1] + args.new_tokens
    pages_per_sequence = -(-capacity // PAGE)
    pool = 3 * pages_per_sequence + 5  # more pages than the sequences use, in shuffled order
    k_cache = torch.zeros(pool, PAGE, KV_HEADS, HEAD_DIM, device=args.device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    block_table = torch.randperm(pool, device=args.device)[:3 * pages_per_sequence].view(3, -1).int()
    lengths = torch.zeros(3, dtype=torch.int32, device=args.device)
    tokens, generated = prompts, []
    with torch.inference_mode():
        for _ in range(args.new_tokens):
            logits = model(tokens, k_cache, v_cache, block_table, lengths)
            lengths += tokens.shape[1]  # the caller advances the lengths, as with flash-attn
            tokens = logits.argmax(-1, keepdim=True)
            generated.append(tokens)
    generated = torch.cat(generated, 1)
    for b in range(3):
        print(f"sequence {b}: prompt {prompts[b].tolist()} -> {generated[b].tolist()}")
    return prompts, generated, model


if __name__ == "__main__":
    main()
