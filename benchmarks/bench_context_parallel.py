"""Context parallelism over packed documents: the ring and the all-to-all (Ulysses) against one
GPU's share of the same work, under torchrun.

    torchrun --nproc-per-node=2 benchmarks/bench_context_parallel.py --out benchmarks/results/context_parallel_h200x2.json
    torchrun --nproc-per-node=2 benchmarks/bench_context_parallel.py --device cpu --quick   # gloo smoke run

Forward + backward, causal, bf16: a packed batch of --documents documents of mixed lengths
(fixed fractions of the batch, from a fifth of it down to a few hundred rows) holding world x
--tokens rows, every document zigzag-split over the ranks (fattn.shard_varlen). Rows per
--kv-heads (results schema of common.py, written by rank 0):

  fattn_ring_varlen      fattn.ring_flash_attn_varlen_func on each rank's shard
  fattn_ulysses_varlen   fattn.ulysses_flash_attn_varlen_func on the same shards
  fattn_single_gpu       fattn.flash_attn_varlen_func over the whole batch on one GPU (every
                         rank runs it on its own GPU, in the same run)

tflops is per GPU: the FLOPs of the visible (query, key) pairs of every document (forward + 2.5x
for the backward) over the world size (the single GPU: the whole batch's on one). Each
context-parallel row carries efficiency_vs_single_gpu: its TFLOP/s per GPU over the single GPU's,
which is the single GPU's time over world x its time (1.0: the ranks split the work with no cost).
Each rep starts after a barrier; the slowest rank's median counts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ring import end_group, fwd_bwd, leave, start_group, timed  # noqa: E402  (torchrun group, timing, a step)
from common import Results, int_list, print_table, short_error  # noqa: E402

import fattn  # noqa: E402

# Shares of the batch, largest first when sorted: long and short documents side by side.
FRACTIONS = (0.22, 0.03, 0.17, 0.08, 0.2, 0.01, 0.14, 0.15)


def document_lengths(total: int, documents: int) -> list[int]:
    """`documents` lengths summing to `total`, in FRACTIONS' proportions (cycled, renormalised)."""
    shares = [FRACTIONS[i % len(FRACTIONS)] for i in range(documents)]
    lengths = [max(1, int(total * s / sum(shares))) for s in shares]
    lengths[0] += total - sum(lengths)
    return lengths


def flops(lengths, heads, head_dim):
    return sum(3.5 * 4 * heads * n * (n + 1) // 2 * head_dim for n in lengths)  # causal; fwd 4*d a pair, bwd 2.5x


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32768, help="rows of the packed batch per GPU")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int_list, default=[32, 8], help="comma-separated: one case each")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, float32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.heads, args.kv_heads, args.head_dim = 64, 4, [2], 16
    return args


def main(argv=None):
    args = parse_args(argv)
    device = args.device
    rank, world, dtype = start_group(device)
    h, d = args.heads, args.head_dim
    lengths = document_lengths(world * args.tokens, args.documents)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    cu_host = torch.tensor(cu, dtype=torch.int32)
    cu_device = cu_host.to(device)
    longest = max(lengths)
    total_flops = flops(lengths, h, d)

    results = Results.start("context_parallel", args, device)
    summary = []
    for kv_heads in args.kv_heads:
        g = torch.Generator(device=device).manual_seed(0)  # the same batch on every rank
        q = torch.randn(cu[-1], h, d, device=device, dtype=dtype, generator=g)
        k, v = (torch.randn(cu[-1], kv_heads, d, device=device, dtype=dtype, generator=g) for _ in range(2))
        dout = torch.randn_like(q)
        local = [fattn.shard_varlen(t, cu, world, rank) for t in (q, k, v, dout)]
        case = {"world": world, "tokens_per_gpu": args.tokens, "documents": lengths, "heads": h, "kv_heads": kv_heads,
                "head_dim": d, "causal": True, "dtype": str(dtype).removeprefix("torch.")}
        single = fwd_bwd(lambda q, k, v: fattn.flash_attn_varlen_func(q, k, v, cu_device, cu_device, longest, longest,
                                                                       causal=True), q, k, v, dout)
        single_row = results.add(case, "fattn_single_gpu", timed(single, device), flops=total_flops)
        schemes = {"fattn_ring_varlen": lambda q, k, v: fattn.ring_flash_attn_varlen_func(q, k, v, cu_host,
                                                                                           causal=True),
                   "fattn_ulysses_varlen": lambda q, k, v: fattn.ulysses_flash_attn_varlen_func(q, k, v, cu,
                                                                                                 causal=True)}
        line = []
        for impl, fn in schemes.items():
            try:  # every rank raises alike (the shapes are the same everywhere), so none is left waiting
                ms, error = timed(fwd_bwd(fn, *local), device), None
            except Exception as e:  # noqa: BLE001  (report, don't hide)
                ms, error = None, short_error(e, 300)
            row = results.add(case, impl, ms, error, flops=total_flops / world)
            row["efficiency_vs_single_gpu"] = row["tflops"] / single_row["tflops"] if ms else None
            line.append(f"{impl.removeprefix('fattn_')} {row['efficiency_vs_single_gpu'] or 0:.2f}")
        summary.append(f"kv_heads {kv_heads}: " + ", ".join(line))
        if rank == 0:
            results.write(args.out)
    if rank == 0:
        print_table(["impl", "kv_heads", "ms", "TFLOP/s per GPU", "vs one GPU", "error"],
                    [[r["impl"], r["kv_heads"], r["ms"], r["tflops"], r.get("efficiency_vs_single_gpu"), r["error"]]
                     for r in results.rows],
                    title=f"context parallelism, {world} ranks x {args.tokens} rows, {len(lengths)} documents "
                          f"{lengths}, causal fwd+bwd; efficiency vs one GPU: " + "; ".join(summary))
    end_group()


if __name__ == "__main__":
    main()
    leave()
