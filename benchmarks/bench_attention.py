"""Attention throughput, forward or backward: fattn against SDPA (flash, cuDNN) and FlexAttention.

    python benchmarks/bench_attention.py --pass forward --out benchmarks/results/forward_h100.json
    python benchmarks/bench_attention.py --pass backward --out benchmarks/results/backward_h100.json

Every implementation runs on the same random bf16 data in its own preferred layout
(fattn: [batch, seq, heads, dim]; SDPA/Flex: [batch, heads, seq, dim]) at hidden
size 2048 and 16k tokens per step, so batch = 16384 / seqlen and heads = 2048 / d.
Prints TFLOP/s and fattn's ratio to each peer; writes every number as JSON.
The backward times only the gradient computation (autograd.grad of a kept graph)
and counts 2.5x the forward's FLOPs, as flash-attn does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, time_ms, write_json  # noqa: E402

import fattn  # noqa: E402


def flops(batch, heads, seqlen, head_dim, causal, direction):
    full = 4 * batch * heads * seqlen * seqlen * head_dim  # two matmuls of 2*s*s*d each
    full = full / 2 if causal else full
    return 2.5 * full if direction == "backward" else full


def timed_call(fn, direction, inputs):
    """The callable to time: the forward itself, or the backward of one kept forward graph."""
    if direction == "forward":
        return lambda: fn(*inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    dout = torch.randn_like(out)
    # fattn uses (q, k, v) = leaves[:3]; peers use their [b, h, s, d] copies = leaves[3:].
    used = [t for t in leaves if t.requires_grad]
    return lambda: torch.autograd.grad(out, used, dout, retain_graph=True, allow_unused=True)


def make_impls(causal, use_flex):
    def fattn_fn(q, k, v, qt, kt, vt):
        return fattn.flash_attn_func(q, k, v, causal=causal)

    def sdpa(backend):
        def run(q, k, v, qt, kt, vt):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return run

    impls = {"fattn": fattn_fn, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    if use_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # One compiled kernel per shape: lift dynamo's limit, or it falls back to the
        # unfused eager path after 8 shapes and the numbers mean nothing.
        torch._dynamo.config.recompile_limit = 1024
        torch._dynamo.config.accumulated_recompile_limit = 4096
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        flex = torch.compile(flex_attention, dynamic=False)
        masks = {}

        def flex_fn(q, k, v, qt, kt, vt):
            if not causal:
                return flex(qt, kt, vt)
            key = qt.shape[2]
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, key, key, device="cuda")
            return flex(qt, kt, vt, block_mask=masks[key])
        impls["flex"] = flex_fn
    return impls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass", dest="direction", choices=["forward", "backward"], default="forward")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile is slow)")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_attention needs a CUDA GPU")
    args.out = args.out or Path(f"benchmarks/results/{args.direction}.json")

    rows = []
    payload = {"benchmark": args.direction, "dtype": "bfloat16", "env": environment(), "rows": rows}
    header = f"{'d':>4} {'seqlen':>6} {'b':>3} {'h':>3} {'causal':>6} | " + " ".join(
        f"{n:>11}" for n in ["fattn", "sdpa_flash", "sdpa_cudnn", "flex"]) + " | fattn/flash fattn/cudnn fattn/flex"
    print("TFLOP/s (median of", args.reps, "runs)")
    print(header)
    for d in map(int, args.head_dims.split(",")):
        for causal in (False, True):
            impls = make_impls(causal, not args.no_flex)
            for s in map(int, args.seqlens.split(",")):
                b, h = max(1, args.tokens // s), args.hidden // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                result = {}
                for name, fn in impls.items():
                    try:
                        call = timed_call(fn, args.direction, (q, k, v, qt, kt, vt))
                        ms = time_ms(call, reps=args.reps)
                        result[name] = flops(b, h, s, d, causal, args.direction) / ms / 1e9
                        del call
                    except Exception as e:  # a peer without a kernel for this shape
                        print(f"  {name} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                        result[name] = None
                row = {"d": d, "s": s, "b": b, "h": h, "causal": causal, "tflops": result}
                row["ratio"] = {peer: (result["fattn"] / result[peer]) if result.get(peer) and result["fattn"] else None
                                for peer in impls if peer != "fattn"}
                rows.append(row)
                cell = lambda x: f"{x:11.1f}" if x else f"{'-':>11}"
                ratio = lambda p: f"{row['ratio'].get(p):11.2f}" if row["ratio"].get(p) else f"{'-':>11}"
                print(f"{d:>4} {s:>6} {b:>3} {h:>3} {str(causal):>6} | " +
                      " ".join(cell(result.get(n)) for n in ["fattn", "sdpa_flash", "sdpa_cudnn", "flex"]) +
                      " | " + " ".join(ratio(p) for p in ["sdpa_flash", "sdpa_cudnn", "flex"]), flush=True)
                write_json(args.out, payload)  # after every row: a cut-off run keeps what it measured
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
