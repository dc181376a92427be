"""Where a paged KV cache loses time against a contiguous one in decoding: the same keys read
through the library's op from a contiguous cache, from pages in shuffled order and from pages in
order (the contiguous cache's own layout behind a block table), and through Triton's JIT of the
same kernel source (tuning/launch.py's decode, whose times also hold its NaN fills of the outputs).

    python benchmarks/studies/paged_decode_gap.py [--rounds 12] [--out FILE]

Each way is captured once in a CUDA graph of 20 calls; the graphs replay in turn --rounds times,
each sample one replay after an untimed one. Rows: per call, the median, fastest and slowest
sample; the spread says how steady a way is, which the bench CLI's medians alone do not.
Shapes: bf16, GQA 32/8, d128, one query token, pages of 256, the op's split counts (batch 1 /
128k also with 8 splits, 64 programs: each program then waits on its own loads). Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fattn  # noqa: E402
from common import paginate, write_ab_rows  # noqa: E402
from tuning.launch import DecodeTiles, decode  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 256
# The sm_90 build's decoding tile for 16-bit caches (aot_build/configs.json).
TILES = DecodeTiles(block_m=16, block_n=64, block_s=16, num_warps=8, num_stages=3)
CASES = [(1, 131072, 32), (1, 131072, 8), (8, 32768, 4), (8, 65536, 4)]
CALLS = 20


def ways(b, ctx, splits):
    torch.manual_seed(0)
    q = torch.randn(b, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, b, ctx, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    shuffled, table = paginate(kv, PAGE)
    in_order, in_order_table = paginate(kv, PAGE, shuffle=False)

    def op(k, v, t):
        return lambda: fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, block_table=t, num_splits=splits)

    def jit(k, v, t):
        return lambda: decode(q, k, v, seqlens, t, splits, TILES)[0]

    return {
        "op contiguous": op(kv[0], kv[1], None),
        "op paged shuffled": op(shuffled[0], shuffled[1], table),
        "op paged in order": op(in_order[0], in_order[1], in_order_table),
        "jit contiguous": jit(kv[0], kv[1], None),
        "jit paged shuffled": jit(shuffled[0], shuffled[1], table),
    }


def sample_us(graph):
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", type=Path, default=Path("paged_decode_gap.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("paged_decode_gap needs a CUDA GPU")
    rows = []
    for b, ctx, splits in CASES:
        fns = ways(b, ctx, splits)
        want = fns["op contiguous"]().float()
        graphs = {}
        for name, fn in fns.items():
            err = (fn().float() - want).abs().max().item()
            assert err < 2e-2, f"b{b} {ctx}: {name} differs from the op's contiguous output by {err}"
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(CALLS):
                    fn()
            graphs[name] = graph
        samples = {name: [] for name in graphs}
        for _ in range(args.rounds):
            for name, graph in graphs.items():
                samples[name].append(sample_us(graph))
        for name, xs in samples.items():
            row = dict(batch=b, context=ctx, splits=splits, way=name, median_us=statistics.median(xs),
                       min_us=min(xs), max_us=max(xs))
            rows.append(row)
            print(f"b{b} {ctx // 1024}k n={splits} {name:<20} median {row['median_us']:7.1f} us"
                  f"  [{row['min_us']:.1f}, {row['max_us']:.1f}]", flush=True)
        del graphs, fns
        torch.cuda.empty_cache()
    write_ab_rows(args.out, rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
