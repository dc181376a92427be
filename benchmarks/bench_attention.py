"""Attention throughput, forward or backward: fattn against SDPA (flash, cuDNN), FlexAttention and
FlashAttention-4.

    python benchmarks/bench_attention.py --pass forward --out benchmarks/results/forward_h100.json
    python benchmarks/bench_attention.py --pass backward --out benchmarks/results/backward_h100.json
    python benchmarks/bench_attention.py --device cpu --quick      # smoke run of every code path
    python benchmarks/bench_attention.py --fp8 --no-flex --seqlens 8192 --head-dims 128   # the FP8 bar

Every implementation runs on the same random bf16 data in its own preferred layout
(fattn and FlashAttention-4: [batch, seq, heads, dim]; SDPA/Flex: [batch, heads, seq, dim]) at
hidden size 2048 and 16k tokens per step, so batch = 16384 / seqlen and heads = 2048 / d.
FlashAttention-4 (rows "fa4", the flash-attn-4 package, imported when the run starts) is a peer on
sm_90 and sm_100; elsewhere, or where it is not installed, its rows have no time and say why
(--no-fa4 leaves them out). Its first call of each variant JIT-compiles, which the warm-up absorbs.
Rows carry ms and TFLOP/s; fattn's rows carry ratio = peer ms / fattn ms per peer (1.0 or more:
fattn at least as fast; the form the speed bars take, checked by benchmarks/check_bars.py) and
its inverse ratio_vs.
The backward times only the gradient computation (autograd.grad of a kept graph)
and counts 2.5x the forward's FLOPs, as flash-attn does.
Timing: --calls back-to-back calls between one pair of CUDA events, one synchronize per timed unit,
the median unit over --reps divided by --calls: the GPU's time per call in steady state, the host
enqueueing ahead of it as in a training loop. With --calls 1 each call starts from an idle GPU
and its time includes the host's latency until the first kernel runs (tens of microseconds in
fattn's op path, and up to a hundred and more in a busy process: 0.385 against 0.256 ms at d128 1k
causal, docs/notes/tuning.md T33), which benchmarks/bench_host.py measures on its own.
--fp8 (forward) adds fattn on the same data quantized to e4m3 and e5m2 (fattn.quantize_fp8, one
descale per sequence and head), rows "fattn-fp8-e4m3" / "fattn-fp8-e5m2", whose ratio also holds
"fattn_bf16": bf16 fattn's ms / FP8 fattn's ms (the FP8 speedup bar).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (PeerUnavailable, Results, fa4_peer, fa4_unavailable, int_list, print_table,  # noqa: E402
                    require_device, sdpa_peers, short_error, time_ms)

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
    # fattn reads (q, k, v) = leaves[:3], the peers their [b, h, s, d] copies = leaves[3:]:
    # the other three get no gradient (allow_unused).
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True, allow_unused=True)


def make_flex(causal, device):
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
            masks[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, key, key, device=device)
        return flex(qt, kt, vt, block_mask=masks[key])
    return flex_fn


def make_impls(causal, use_flex, device, use_fa4=False):
    def fattn_fn(q, k, v, qt, kt, vt):
        return fattn.flash_attn_func(q, k, v, causal=causal)

    def sdpa(backend):
        def run(q, k, v, qt, kt, vt):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return run

    impls = {"fattn": fattn_fn, **{name: sdpa(b) for name, b in sdpa_peers(device).items()}}
    if use_flex:
        impls["flex"] = make_flex(causal, device)
    if use_fa4:
        fa4 = fa4_peer(device)
        impls["fa4"] = lambda q, k, v, qt, kt, vt: fa4(q, k, v, causal=causal)
    return impls


def fp8_impls(q, k, v, causal):
    """fattn on q, k, v quantized to each FP8 dtype (the quantization is not timed)."""
    impls = {}
    for tag, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        (q8, qd), (k8, kd), (v8, vd) = (fattn.quantize_fp8(t, dtype, "head") for t in (q, k, v))

        def run(*_, q8=q8, k8=k8, v8=v8, qd=qd, kd=kd, vd=vd):
            return fattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        impls[f"fattn-fp8-{tag}"] = run
    return impls


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass", dest="direction", choices=["forward", "backward"], default="forward")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/<pass>.json)")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compile is slow)")
    parser.add_argument("--no-fa4", action="store_true", help="skip FlashAttention-4 (flash-attn-4)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=8,
                        help="back-to-back calls per timed unit (1: each call from an idle GPU, host latency included)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, few reps, no Flex: a smoke run (fa4 stays, to record why it cannot run)")
    parser.add_argument("--fp8", action="store_true", help="also time FP8 inputs (forward only)")
    args = parser.parse_args(argv)
    if args.fp8 and args.direction != "forward":
        parser.error("--fp8 times the forward only (FP8 attention has no backward)")
    if args.quick:
        args.seqlens, args.head_dims, args.tokens, args.hidden, args.reps, args.calls = "64,128", "64", 256, 256, 3, 1
        args.no_flex = True
    if args.calls < 1:
        parser.error("--calls must be at least 1")
    args.out = args.out or Path(f"benchmarks/results/{args.direction}.json")
    return args


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "bench_attention")
    results = Results.start(args.direction, args, args.device)
    if not args.no_fa4 and fa4_unavailable(args.device):
        print(f"fa4: unavailable, recorded without times: {fa4_unavailable(args.device)}", flush=True)
    dtype = torch.bfloat16
    for d in int_list(args.head_dims):
        for causal in (False, True):
            impls = make_impls(causal, not args.no_flex, args.device, use_fa4=not args.no_fa4)
            for s in int_list(args.seqlens):
                b, h = max(1, args.tokens // s), args.hidden // d
                case = {"head_dim": d, "seqlen": s, "batch": b, "heads": h, "causal": causal, "dtype": "bfloat16"}
                q, k, v = (torch.randn(b, s, h, d, device=args.device, dtype=dtype) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                runs = dict(impls)
                if args.fp8:
                    runs.update(fp8_impls(q, k, v, causal))
                for name, fn in runs.items():
                    try:
                        call = timed_call(fn, args.direction, (q, k, v, qt, kt, vt))
                        ms, error = time_ms([call] * args.calls, reps=args.reps, device=args.device), None
                        del call
                    except Exception as e:  # noqa: BLE001  (a peer without a kernel for this shape)
                        ms, error = None, short_error(e)
                        if not isinstance(e, PeerUnavailable):  # said once, above
                            print(f"  {name} d{d} s{s} causal={causal} failed: {error[:160]}", flush=True)
                    results.add(case, name, ms, error, flops=flops(b, h, s, d, causal, args.direction))
                results.compare(case, peers=[n for n in impls if n != "fattn"])
                if args.fp8:
                    results.compare(case, peers=list(impls), ours=[n for n in runs if n not in impls])
                    for r in results.case_rows(case):  # the FP8 rows' bf16 reference, named as such
                        if r["impl"] not in impls:
                            for key in ("ratio", "ratio_vs"):
                                if "fattn" in r[key]:
                                    r[key]["fattn_bf16"] = r[key].pop("fattn")
                row = results.case_rows(case)[0]
                print(f"d{d} s{s} causal={causal}: fattn {row['tflops'] or 0:.1f} TFLOP/s", flush=True)
                results.write(args.out)  # after every case: a cut-off run keeps what it measured
    print_summary(results)
    print(f"wrote {args.out}")


def print_summary(results):
    rows = results.rows
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    peers = [i for i in impls if i != "fattn"]
    lines = []
    for r in (r for r in rows if r["impl"] == "fattn"):
        case = {k: r[k] for k in ("head_dim", "seqlen", "causal")}
        tf = {x["impl"]: x["tflops"] for x in results.case_rows(case)}
        lines.append([r["head_dim"], r["seqlen"], r["batch"], r["heads"], str(r["causal"])]
                     + [None if tf.get(i) is None else f"{tf[i]:.1f}" for i in impls]
                     + [r["ratio"].get(p) for p in peers])
    print_table(["d", "seqlen", "b", "h", "causal"] + impls + [f"ratio {p}" for p in peers], lines,
                title=f"\n{results.benchmark}: TFLOP/s; ratio = peer ms / fattn ms (>= 1: fattn faster)")


if __name__ == "__main__":
    main()
