"""Tile-config search for the backward kernels (dK/dV and dQ), with Triton's JIT on the GPU.

    python benchmarks/tune_backward.py --head-dims 64,128

Like tune_forward.py: an offline step to choose aot_build/configs.json. Each
candidate is checked against float32 autograd gradients before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import time_ms  # noqa: E402
from triton_src.backward import attn_bwd_dkdv, attn_bwd_dq  # noqa: E402

DKDV = [(32, 128, 4, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
        (64, 128, 4, 2), (32, 128, 8, 3)]
DQ = [(128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2),
      (128, 64, 4, 2)]
LOG2E = 1.4426950408889634


def problem(b, s, h, d, causal):
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    scale = 1 / math.sqrt(d)
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = (torch.softmax(scores, -1) @ vf).transpose(1, 2)
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    out, dout = out.detach().to(torch.bfloat16), dout.to(torch.bfloat16)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    return q.detach(), k.detach(), v.detach(), dout, lse.detach().contiguous(), delta, want, scale


def run_dkdv(p, causal, cfg):
    q, k, v, do, lse, delta, _, scale = p
    bm, bn, w, st = cfg
    b, s, h, d = q.shape
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    attn_bwd_dkdv[(triton_cdiv(s, bn), h, b)](
        q, k, v, do, lse, delta, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
        *dk.stride()[:3], *dv.stride()[:3], s, s, h, 1, d, scale * LOG2E, scale,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, CAUSAL=causal, PAD_D=False, num_warps=w, num_stages=st)
    return dk, dv


def run_dq(p, causal, cfg):
    q, k, v, do, lse, delta, _, scale = p
    bm, bn, w, st = cfg
    b, s, h, d = q.shape
    dq = torch.empty_like(q)
    attn_bwd_dq[(triton_cdiv(s, bm), h, b)](
        q, k, v, do, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
        *dq.stride()[:3], s, s, h, 1, d, scale * LOG2E, scale,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, CAUSAL=causal, PAD_D=False, num_warps=w, num_stages=st)
    return dq


def triton_cdiv(a, b):
    return (a + b - 1) // b


def rel_err(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for d in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            s = args.seqlen
            b, h = 16384 // s, 2048 // d
            p = problem(b, s, h, d, causal)
            fl = 4 * b * h * s * s * d / (2 if causal else 1)
            for name, runner, cands, check in (
                ("dkdv", run_dkdv, DKDV, lambda r: max(rel_err(r[0], p[6][1]), rel_err(r[1], p[6][2]))),
                ("dq", run_dq, DQ, lambda r: rel_err(r, p[6][0])),
            ):
                scores = []
                for cfg in cands:
                    try:
                        err = check(runner(p, causal, cfg))
                        if not err < 2e-2:
                            print(f"{name} d{d} causal={causal} {cfg}: WRONG rel err {err:.3e}", flush=True)
                            continue
                        ms = time_ms(lambda: runner(p, causal, cfg), warmup=3, reps=10)
                        scores.append((ms, cfg))
                    except Exception as e:
                        print(f"{name} d{d} causal={causal} {cfg}: {type(e).__name__} {str(e)[:80]}", flush=True)
                scores.sort()
                for ms, cfg in scores[:3]:
                    print(f"{name} d{d} causal={causal} s{s} BM,BN,w,st={cfg}: {ms:.3f} ms", flush=True)
                results.append({"kernel": name, "d": d, "causal": causal, "seqlen": s,
                                "ranked": [[list(c), ms] for ms, c in scores]})
            del p
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
