"""Tile-config search for the forward kernel, run with Triton's JIT on the GPU machine.

    python benchmarks/tune_forward.py --head-dims 64,128

The shipped library is compiled ahead of time, so choosing its configs
(aot_build/configs.json) is an offline step: this script times candidate
(BLOCK_M, BLOCK_N, num_warps, num_stages) on the benchmark's shapes through the
same triton_src kernel, checks each against a bf16 SDPA result (warp-specialised
and pipelined configs can be wrong), and prints the best per head dim and mask.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402
from triton_src.forward import attn_fwd  # noqa: E402

CANDIDATES = [(128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
              (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 2), (64, 128, 4, 3), (256, 64, 8, 2)]


def run(q, k, v, causal, cfg):
    bm, bn, warps, stages = cfg
    b, s, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
    grid = (triton_cdiv(s, bm), h, b)
    attn_fwd[grid](q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                   s, k.shape[1], h, h // k.shape[2], d, 1 / math.sqrt(d) * 1.4426950408889634,
                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, CAUSAL=causal, PAD_D=False,
                   num_warps=warps, num_stages=stages)
    return out


def triton_cdiv(a, b):
    return (a + b - 1) // b


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for d in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            scores = {}
            for s in map(int, args.seqlens.split(",")):
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal).transpose(1, 2)
                fl = 4 * b * h * s * s * d / (2 if causal else 1)
                for cfg in CANDIDATES:
                    try:
                        got = run(q, k, v, causal, cfg)
                        err = (got.float() - want.float()).abs().max().item()
                        if not err < 0.05:
                            print(f"d{d} causal={causal} s{s} {cfg}: WRONG (max err {err})", flush=True)
                            scores.setdefault(cfg, []).append(0.0)
                            continue
                        ms = time_ms(lambda: run(q, k, v, causal, cfg), warmup=3, reps=15)
                        scores.setdefault(cfg, []).append(fl / ms / 1e9)
                    except Exception as e:
                        print(f"d{d} causal={causal} {cfg}: {type(e).__name__} {str(e)[:100]}", flush=True)
                        scores.setdefault(cfg, []).append(0.0)
            ranked = sorted(scores.items(), key=lambda kv: -sum(kv[1]))
            for cfg, tf in ranked[:4]:
                print(f"d{d} causal={causal} BM,BN,warps,stages={cfg}: " + " ".join(f"{x:6.1f}" for x in tf), flush=True)
            results.append({"d": d, "causal": causal, "ranked": [[list(c), t] for c, t in ranked]})
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
