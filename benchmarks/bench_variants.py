"""What the attention variants cost, forward and backward: fattn against FlexAttention (the one
peer with a fused sliding window and softcap) and against fattn's own plain attention.

    python benchmarks/bench_variants.py --out benchmarks/results/variants_h100.json
    python benchmarks/bench_variants.py --device cpu --quick      # smoke run of every code path

Two studies on bf16, [batch, seq, heads, dim] for fattn, [batch, heads, seq, dim] for Flex:
- window: at --window-seqlen tokens (batch 1), a bottom-right sliding window of each of
  --windows keys to the left (right edge 0, as causal) and full causal attention; time should
  grow with the window, not the sequence. FLOPs count the visible (query, key) pairs.
- score_mod: at --mod-seqlen tokens, plain attention, softcap 30, ALiBi, and both, each also
  causal; fattn's rows carry ratio_vs against fattn's plain run of the same shape
  ("fattn-plain") and against Flex with the same modification.
Hidden size --hidden over head dim --head-dim heads; --tokens per step for the score_mod study.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, int_list, print_table, require_device, short_error, time_ms  # noqa: E402

import fattn  # noqa: E402


def visible_pairs(seqlen, left):
    """(query, key) pairs a bottom-right window (left, 0) shows on a square problem; left < 0: causal."""
    if left < 0 or left >= seqlen:
        return seqlen * (seqlen + 1) // 2
    return (left + 1) * seqlen - left * (left + 1) // 2


def timed(fn, direction, inputs):
    if direction == "forward":
        return lambda: fn(*inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    dout = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def alibi_slopes(heads, device):
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device, dtype=torch.float32) / heads)


class Flex:
    """FlexAttention compiled once per mask/score_mod kind (shapes are static per study)."""

    def __init__(self, device):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        torch._dynamo.config.recompile_limit = 1024
        torch._dynamo.config.accumulated_recompile_limit = 4096
        self.create_block_mask = create_block_mask
        self.flex = torch.compile(flex_attention, dynamic=False)
        self.device = device

    def window(self, seqlen, left):
        def visible(b, h, qi, ki):
            return (qi >= ki) & ((qi - ki <= left) if left >= 0 else (qi >= 0))
        mask = self.create_block_mask(visible, None, None, seqlen, seqlen, device=self.device)
        return lambda qt, kt, vt: self.flex(qt, kt, vt, block_mask=mask)

    def modified(self, seqlen, causal, softcap, slopes):
        def score_mod(score, b, h, qi, ki):
            if softcap:
                score = softcap * torch.tanh(score / softcap)
            if slopes is not None:
                score = score - slopes[h] * (qi - ki).abs()
            return score
        mask = None
        if causal:
            mask = self.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen,
                                          device=self.device)
        return lambda qt, kt, vt: self.flex(qt, kt, vt, score_mod=score_mod, block_mask=mask)


def measure(results, case, impls, direction, inputs, flops, reps):
    for name, fn in impls.items():
        try:
            call = timed(fn, direction, inputs[name])
            ms, error = time_ms(call, reps=reps, device=results.config["device"]), None
            del call
        except Exception as e:  # noqa: BLE001  (a peer without a kernel for this shape)
            ms, error = None, short_error(e)
            print(f"  {name} {case} failed: {error[:160]}", flush=True)
        results.add(case, name, ms, error, flops=flops)


def window_study(results, args, flex, direction):
    d, s = args.head_dim, args.window_seqlen
    h = args.hidden // d
    q, k, v = (torch.randn(1, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    for left in [*int_list(args.windows), -1]:
        case = {"study": "window", "pass": direction, "head_dim": d, "seqlen": s, "heads": h, "window_left": left}
        impls = {"fattn": lambda q, k, v, left=left: fattn.flash_attn_func(q, k, v, causal=True,
                                                                           window_size=(left, 0))}
        inputs = {"fattn": (q, k, v)}
        if flex:
            impls["flex"] = flex.window(s, left)
            inputs["flex"] = (qt, kt, vt)
        flops = 4 * h * visible_pairs(s, left) * d * (2.5 if direction == "backward" else 1)
        measure(results, case, impls, direction, inputs, flops, args.reps)
        results.compare(case, peers=["flex"])
        results.write(args.out)


def score_mod_study(results, args, flex, direction):
    d, s = args.head_dim, args.mod_seqlen
    h, b = args.hidden // d, max(1, args.tokens // args.mod_seqlen)
    q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=torch.bfloat16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    slopes = alibi_slopes(h, args.device)
    for causal in (False, True):
        plain_case = None
        for mod, softcap, alibi in (("plain", 0.0, None), ("softcap", 30.0, None), ("alibi", 0.0, slopes),
                                    ("softcap+alibi", 30.0, slopes)):
            case = {"study": "score_mod", "pass": direction, "head_dim": d, "seqlen": s, "batch": b, "heads": h,
                    "causal": causal, "mod": mod}
            impls = {"fattn": lambda q, k, v, c=causal, cap=softcap, a=alibi: fattn.flash_attn_func(
                q, k, v, causal=c, softcap=cap, alibi_slopes=a)}
            inputs = {"fattn": (q, k, v)}
            if flex:
                impls["flex"] = flex.modified(s, causal, softcap, alibi)
                inputs["flex"] = (qt, kt, vt)
            flops = 4 * b * h * s * s * d / (2 if causal else 1) * (2.5 if direction == "backward" else 1)
            measure(results, case, impls, direction, inputs, flops, args.reps)
            if plain_case is None:
                plain_case = case
            else:  # the cost of the modification over fattn's own plain attention
                plain_ms = results.case_rows(plain_case)[0]["ms"]
                row = results.case_rows(case)[0]
                if plain_ms and row["ms"]:
                    row["vs_plain"] = row["ms"] / plain_ms
            results.compare(case, peers=["flex"])
            results.write(args.out)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/variants.json"))
    parser.add_argument("--passes", default="forward,backward")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--window-seqlen", type=int, default=16384)
    parser.add_argument("--windows", default="1024,4096")
    parser.add_argument("--mod-seqlen", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few reps, no Flex: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.head_dim, args.hidden, args.window_seqlen, args.windows = 64, 128, 256, "16,64"
        args.mod_seqlen, args.tokens, args.reps, args.no_flex = 128, 256, 2, True
    return args


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "bench_variants")
    results = Results.start("variants", args, args.device)
    flex = None if args.no_flex else Flex(args.device)
    for direction in args.passes.split(","):
        window_study(results, args, flex, direction)
        score_mod_study(results, args, flex, direction)
    print_summary(results)
    print(f"wrote {args.out}")


def print_summary(results):
    lines = []
    for r in (r for r in results.rows if r["impl"] == "fattn"):
        what = f"window {r['window_left']}" if r["study"] == "window" else f"{r['mod']} causal={r['causal']}"
        lines.append([r["pass"], r["seqlen"], what, r["ms"], r["tflops"] and f"{r['tflops']:.1f}",
                      r.get("vs_plain"), r["ratio_vs"].get("flex")])
    print_table(["pass", "seqlen", "variant", "fattn ms", "TFLOP/s", "vs plain", "fattn/flex"], lines,
                title="\nvariants: fattn/flex = time ratio (< 1: fattn faster); vs plain = time over fattn's plain run")


if __name__ == "__main__":
    main()
