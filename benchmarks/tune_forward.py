"""Tile-config search for the forward kernel, run with Triton's JIT on the GPU machine.

    python benchmarks/tune_forward.py --head-dims 64,128 --out tune_forward.json
    python benchmarks/tune_forward.py --device cpu --quick     # Triton's interpreter, tiny shapes

The shipped library is compiled ahead of time, so choosing its configs
(aot_build/configs.json) is an offline step: this script times candidate
(BLOCK_M, BLOCK_N, num_warps, num_stages) on the benchmark's shapes through the
same triton_src kernel, launched through its spec (triton_src/spec.py), checks each
against SDPA (warp-specialised and pipelined configs can be wrong), and prints the
best per head dim and mask. On a CPU the inputs are float32 (the interpreter runs numpy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, int_list, load_kernels, print_table, require_device, short_error, time_ms  # noqa: E402

CANDIDATES = [(128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3),
              (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 2), (64, 128, 4, 3), (256, 64, 8, 2)]


def run(q, k, v, causal, cfg):
    from triton_src.python_launch import Tiles, Variant, forward  # after load_kernels: the JIT or the interpreter

    return forward(q, k, v, Tiles(*cfg), Variant(causal=causal))[0]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, two candidates: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = parser.parse_args(argv)
    args.candidates = CANDIDATES[:2] if args.quick else CANDIDATES
    if args.quick:
        args.head_dims, args.seqlens, args.tokens, args.hidden, args.reps = "16", "128", 128, 32, 2
    return args


def tune_case(spec, results, args, d, causal, s):
    b, h = max(1, args.tokens // s), args.hidden // d
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=dtype) for _ in range(3))
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal).transpose(1, 2)
    case = {"head_dim": d, "causal": causal, "seqlen": s, "batch": b, "heads": h}
    for cfg in args.candidates:
        ms = None
        try:
            err = (run(q, k, v, causal, cfg).float() - want.float()).abs().max().item()
            error = None if err < 0.05 else f"WRONG (max err {err:.3g})"
            if error is None:
                ms = time_ms(lambda: run(q, k, v, causal, cfg), warmup=3, reps=args.reps, device=args.device)
        except Exception as e:  # noqa: BLE001  (a config that does not fit or compile)
            error = short_error(e, 300)
        if error:
            print(f"d{d} causal={causal} s{s} {cfg}: {error}", flush=True)
        results.add(case, spec.name, ms, error, flops=4 * b * h * s * s * d / (2 if causal else 1),
                    block_m=cfg[0], block_n=cfg[1], num_warps=cfg[2], num_stages=cfg[3])


def print_ranking(results, seqlens, top=4):
    """Per head dim and mask, the configs with the highest TFLOP/s summed over the sequence lengths."""
    lines = []
    for d, causal in dict.fromkeys((r["head_dim"], r["causal"]) for r in results.rows):
        scores = {}
        for r in results.rows:
            if r["head_dim"] == d and r["causal"] == causal:
                scores.setdefault((r["block_m"], r["block_n"], r["num_warps"], r["num_stages"]), {})[r["seqlen"]] = r
        ranked = sorted(scores.items(), key=lambda kv: -sum(r["tflops"] or 0 for r in kv[1].values()))
        for cfg, by_s in ranked[:top]:
            lines.append([d, str(causal), *cfg] + [by_s.get(s, {}).get("tflops") for s in seqlens])
    print_table(["d", "causal", "BM", "BN", "warps", "stages"] + [f"s{s} TFLOP/s" for s in seqlens], lines,
                title=f"\nbest forward configs (top {top} per head dim and mask)")


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "tune_forward")
    spec = load_kernels(args.device)["attn_fwd"]
    results = Results.start("tune_forward", args, args.device)
    for d in int_list(args.head_dims):
        for causal in (False, True):
            for s in int_list(args.seqlens):
                tune_case(spec, results, args, d, causal, s)
                results.write(args.out)
    print_ranking(results, int_list(args.seqlens))
    results.require_timings(["head_dim", "causal", "seqlen"])


if __name__ == "__main__":
    main()
