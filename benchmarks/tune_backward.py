"""Tile-config search for the backward kernels (dK/dV and dQ), with Triton's JIT on the GPU.

    python benchmarks/tune_backward.py --head-dims 64,128 --out tune_backward.json
    python benchmarks/tune_backward.py --device cpu --quick    # Triton's interpreter, tiny shapes

Like tune_forward.py: an offline step to choose aot_build/configs.json. The kernels are
launched through their specs (triton_src/spec.py); each candidate is checked against
float32 autograd gradients before it is timed. On a CPU the inputs are float32.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, int_list, load_kernels, print_table, require_device, short_error, time_ms  # noqa: E402

DKDV = [(32, 128, 4, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
        (64, 128, 4, 2), (32, 128, 8, 3)]
DQ = [(128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 2),
      (128, 64, 4, 2)]


def problem(b, s, h, d, causal, device, dtype):
    """Inputs of both kernels and the float32 autograd gradients (dq, dk, dv) they must give."""
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, device=device, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    out = (torch.softmax(scores, -1) @ vf).transpose(1, 2)
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, (q, k, v), dout)
    out, dout = out.detach().to(dtype), dout.to(dtype)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    inputs = {"Q": q.detach(), "K": k.detach(), "V": v.detach(), "DO": dout, "Lse": lse.detach().contiguous(),
              "Delta": delta}
    return inputs, want


def run(spec, inputs, causal, cfg):
    """The kernel's gradients: (dk, dv) for attn_bwd_dkdv, (dq,) for attn_bwd_dq."""
    from triton_src.python_launch import Tiles, Variant, backward_dkdv, backward_dq  # after load_kernels

    q, k, v, dout, lse, delta = (inputs[name] for name in ("Q", "K", "V", "DO", "Lse", "Delta"))
    if spec.name == "attn_bwd_dkdv":
        return backward_dkdv(q, k, v, dout, lse, delta, Tiles(*cfg), Variant(causal=causal))
    return (backward_dq(q, k, v, dout, lse, delta, Tiles(*cfg), Variant(causal=causal)),)


def rel_err(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def tune_kernel(spec, candidates, results, args, case, inputs, want):
    # attn_bwd_dkdv gives (dk, dv), attn_bwd_dq gives (dq,): compare with the matching gradients.
    expected = want[1:] if spec.name == "attn_bwd_dkdv" else want[:1]
    for cfg in candidates:
        ms = None
        try:
            err = max(rel_err(g, w) for g, w in zip(run(spec, inputs, case["causal"], cfg), expected))
            error = None if err < 2e-2 else f"WRONG (rel err {err:.3e})"
            if error is None:
                ms = time_ms(lambda: run(spec, inputs, case["causal"], cfg), warmup=3, reps=args.reps,
                             device=args.device)
        except Exception as e:  # noqa: BLE001  (a config that does not fit or compile)
            error = short_error(e, 300)
        if error:
            print(f"{spec.name} d{case['head_dim']} causal={case['causal']} {cfg}: {error}", flush=True)
        results.add(case, spec.name, ms, error, block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, two candidates each: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = parser.parse_args(argv)
    args.dkdv, args.dq = (DKDV[:2], DQ[:2]) if args.quick else (DKDV, DQ)
    if args.quick:
        args.head_dims, args.seqlen, args.tokens, args.hidden, args.reps = "16", 128, 128, 32, 2
    return args


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "tune_backward")
    kernels = load_kernels(args.device)
    results = Results.start("tune_backward", args, args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    s = args.seqlen
    for d in int_list(args.head_dims):
        for causal in (False, True):
            b, h = max(1, args.tokens // s), args.hidden // d
            inputs, want = problem(b, s, h, d, causal, args.device, dtype)
            case = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h}
            tune_kernel(kernels["attn_bwd_dkdv"], args.dkdv, results, args, case, inputs, want)
            tune_kernel(kernels["attn_bwd_dq"], args.dq, results, args, case, inputs, want)
            results.write(args.out)
            del inputs, want
    lines = []
    for (kernel, d, causal) in dict.fromkeys((r["impl"], r["head_dim"], r["causal"]) for r in results.rows):
        ranked = sorted((r for r in results.rows if (r["impl"], r["head_dim"], r["causal"]) == (kernel, d, causal)
                         and r["ms"]), key=lambda r: r["ms"])
        lines += [[kernel, d, str(causal), r["block_m"], r["block_n"], r["num_warps"], r["num_stages"],
                   f"{r['ms']:.3f}"] for r in ranked[:3]]
    print_table(["kernel", "d", "causal", "BM", "BN", "warps", "stages", "ms"], lines,
                title=f"\nfastest backward configs at seqlen {s} (top 3 per kernel, head dim and mask)")
    results.require_timings(["head_dim", "causal"])


if __name__ == "__main__":
    main()
