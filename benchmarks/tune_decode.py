"""Tile-config and split-count search for the decode kernel, with Triton's JIT on the GPU machine.

    python benchmarks/tune_decode.py --out decode_tune.json

Times candidate (BLOCK_N, num_warps, num_stages) x num_splits of triton_src's
attn_decode_split (+ attn_decode_merge) on the decode benchmark's shapes (bf16, GQA
32/8, d128, one query token), contiguous and paged, each call inside a CUDA graph
(launch overhead would otherwise hide the kernel), rotating over enough cache copies
to defeat L2. Reports GB/s of K+V read and checks every config against SDPA.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from triton_src.decode import attn_decode_merge, attn_decode_split  # noqa: E402

CONFIGS = [(64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (64, 8, 3)]
SPLITS = [8, 12, 16, 24, 32, 48]
HQ, HK, D = 32, 8, 128


def decode(q, kc, vc, seqlens, table, page_size, capacity, splits, cfg):
    bn, warps, stages = cfg
    b = q.shape[0]
    out = torch.empty_like(q)
    lse = torch.empty(b, HQ, 1, device=q.device, dtype=torch.float32)
    po = torch.empty(splits, b, 1, HQ, D, device=q.device, dtype=torch.float32)
    pl = torch.empty(splits, b, HQ, 1, device=q.device, dtype=torch.float32)
    paged = table is not None
    attn_decode_split[(splits, HK, b)](
        q, kc, vc, seqlens, table if paged else seqlens, po, pl, out, lse,
        *q.stride()[:3], *kc.stride()[:3], *vc.stride()[:3], table.stride(0) if paged else 0,
        1, HQ, HQ // HK, D, 0, capacity, page_size, splits, -1, -1, 1 / math.sqrt(D) * 1.4426950408889634, 0.0,
        BLOCK_M=16, BLOCK_N=bn, BLOCK_D=D, PAGED=paged, PAD_D=False, num_warps=warps, num_stages=stages)
    if splits > 1:
        attn_decode_merge[(1, HQ, b)](po, pl, out, lse, b * HQ, splits, 1, HQ, D, BLOCK_S=16, BLOCK_D=D, PAD_D=False,
                                      num_warps=4, num_stages=1)
    return out


def graph_us(fns, reps=20):
    """Microseconds per call of the fns (one per cache copy) captured back to back in a graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000 / len(fns))
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="1x8192,1x131072,8x65536")
    parser.add_argument("--page-size", type=int, default=256)
    parser.add_argument("--configs", default=None, help="BLOCK_N:warps:stages,... (default: CONFIGS)")
    parser.add_argument("--splits", default=None, help="comma list (default: SPLITS)")
    parser.add_argument("--copies", type=int, default=0, help="cache copies to rotate (0: enough to defeat L2)")
    parser.add_argument("--contiguous-only", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    configs = CONFIGS if not args.configs else [tuple(map(int, c.split(":"))) for c in args.configs.split(",")]
    split_list = SPLITS if not args.splits else [int(x) for x in args.splits.split(",")]
    results = []
    for case in args.cases.split(","):
        b, ctx = map(int, case.split("x"))
        nbytes = 2 * b * ctx * HK * D * 2
        copies = args.copies or max(1, min(8, (512 << 20) // nbytes))
        caches = []
        for _ in range(copies):
            kc = torch.randn(b, ctx, HK, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            pages = b * ctx // args.page_size
            perm = torch.randperm(pages, device="cuda")
            table = perm.view(b, ctx // args.page_size).to(torch.int32)
            kp = torch.empty(pages, args.page_size, HK, D, device="cuda", dtype=torch.bfloat16)
            vp = torch.empty_like(kp)
            kp[perm] = kc.reshape(pages, args.page_size, HK, D)
            vp[perm] = vc.reshape(pages, args.page_size, HK, D)
            caches.append((kc, vc, kp, vp, table))
        q = torch.randn(b, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
        kc, vc = caches[0][0], caches[0][1]
        want = F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                              enable_gqa=True).transpose(1, 2).float()
        for paged in (False,) if args.contiguous_only else (False, True):
            for cfg in configs:
                for splits in split_list:
                    def call(c, cfg=cfg, splits=splits, paged=paged):
                        if paged:
                            return decode(q, c[2], c[3], seqlens, c[4], args.page_size, ctx, splits, cfg)
                        return decode(q, c[0], c[1], seqlens, None, ctx, ctx, splits, cfg)
                    try:
                        err = (call(caches[0]).float() - want).abs().max().item()
                        if not err < 2e-2:
                            print(f"{case} paged={paged} {cfg} splits={splits}: WRONG ({err:.3e})", flush=True)
                            continue
                        us = graph_us([lambda c=c: call(c) for c in caches])
                    except Exception as e:  # a config that does not fit or compile
                        print(f"{case} paged={paged} {cfg} splits={splits}: {type(e).__name__} {str(e)[:120]}",
                              flush=True)
                        continue
                    results.append({"batch": b, "context": ctx, "paged": paged, "block_n": cfg[0], "warps": cfg[1],
                                    "stages": cfg[2], "splits": splits, "us": us, "GBps": nbytes / us / 1e3})
            best = sorted((r for r in results if r["context"] == ctx and r["batch"] == b and r["paged"] == paged),
                          key=lambda r: r["us"])[:5]
            for r in best:
                print(f"{case} paged={paged} BN={r['block_n']} w{r['warps']} s{r['stages']} splits={r['splits']}: "
                      f"{r['us']:.1f} us {r['GBps']:.0f} GB/s", flush=True)
        del caches
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
