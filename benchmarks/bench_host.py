"""Eager host cost per call at tiny shapes: fattn against SDPA (flash, cuDNN) in the same run.

    python benchmarks/bench_host.py --out benchmarks/results/host_h100.json
    python benchmarks/bench_host.py --device cpu --quick      # smoke run of every code path

At these sizes a kernel takes a few microseconds, so a call costs what the host spends
issuing it: Python, the dispatcher, checks, allocations, launches. Each entry is timed as
wall time per call: time.perf_counter around a loop of --calls calls ending in one
synchronize (common.time_ms with wall=True); the median of --repeats repeats counts.

  forward           fattn:    fattn.flash_attn_func(q, k, v), q/k/v [b, s, h, d]
                    fattn_op: torch.ops.fattn.forward.default(q, k, v, None, False, False)
                    peers:    F.scaled_dot_product_attention on [b, h, s, d] transposed views
  forward_backward  the forward, then torch.autograd.grad(out, (q, k, v), dout) with a
                    preallocated dout; q, k, v are leaves that require grad (for the peers,
                    leaves that are [b, h, s, d] transposed views)
  decode            one query token over a full cache of --cache keys:
                    fattn.flash_attn_with_kvcache (fattn_op: torch.ops.fattn.decode.default);
                    peers: SDPA of the token over [b, h, L, d] views of the cache
  decode_append     the same, writing one new token into the cache's last slot first
                    (peers: two slice copies into the cache, then SDPA)

A peer runs inside one sdpa_kernel(backend) context around its whole timing loop, as a user
picks a backend once, not per call. On a CPU the only peer is SDPA's math backend.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Results, int_list, print_table, require_device, sdpa_peers, short_error, time_ms  # noqa: E402

import fattn  # noqa: E402

OPS = ("forward", "forward_backward", "decode", "decode_append")
DTYPE = torch.bfloat16


def randn(*shape, device):
    return torch.randn(*shape, device=device, dtype=DTYPE)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def forward_calls(b, s, h, d, device, peers):
    """{impl: (call, SDPA backend or None)}."""
    q, k, v = (randn(b, s, h, d, device=device) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    calls = {"fattn": (lambda: fattn.flash_attn_func(q, k, v), None),
             "fattn_op": (lambda: torch.ops.fattn.forward.default(q, k, v, None, False, False), None)}
    return calls | {name: (lambda: sdpa(qt, kt, vt), backend) for name, backend in peers.items()}


def backward_calls(b, s, h, d, device, peers):
    q, k, v = (randn(b, s, h, d, device=device).requires_grad_() for _ in range(3))
    qt, kt, vt = (randn(b, s, h, d, device=device).transpose(1, 2).requires_grad_() for _ in range(3))
    dout, dout_t = randn(b, s, h, d, device=device), randn(b, h, s, d, device=device)
    calls = {"fattn": (lambda: torch.autograd.grad(fattn.flash_attn_func(q, k, v), (q, k, v), dout), None)}
    return calls | {name: (lambda: torch.autograd.grad(sdpa(qt, kt, vt), (qt, kt, vt), dout_t), backend)
                    for name, backend in peers.items()}


def decode_calls(b, cache, h, d, device, peers, append):
    q = randn(b, 1, h, d, device=device)
    k_cache, v_cache = randn(b, cache, h, d, device=device), randn(b, cache, h, d, device=device)
    k_new, v_new = (randn(b, 1, h, d, device=device), randn(b, 1, h, d, device=device)) if append else (None, None)
    # With an append the new token goes to the last slot, so both variants attend over `cache` keys.
    seqlens = torch.full((b,), cache - 1 if append else cache, dtype=torch.int32, device=device)
    calls = {
        "fattn": (lambda: fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens),
                  None),
        "fattn_op": (lambda: torch.ops.fattn.decode.default(q, k_cache, v_cache, k_new, v_new, None, None, seqlens,
                                                            None, None, None, None, False, -1, -1, 0.0, True,
                                                            None, 0), None),
    }
    qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)

    def sdpa_decode():
        if append:
            k_cache[:, cache - 1:].copy_(k_new)
            v_cache[:, cache - 1:].copy_(v_new)
        return sdpa(qt, kt, vt)
    return calls | {name: (sdpa_decode, backend) for name, backend in peers.items()}


def cases(args):
    """(op, seqlen_q, seqlen_k, heads, head_dim) to measure."""
    for op in args.ops:
        for d in args.head_dims:
            for h in args.heads:
                if op.startswith("decode"):
                    yield op, 1, args.cache, h, d
                else:
                    yield from ((op, s, s, h, d) for s in args.seqlens)


def make_calls(op, b, s, s_k, h, d, device, peers):
    if op == "forward":
        return forward_calls(b, s, h, d, device, peers)
    if op == "forward_backward":
        return backward_calls(b, s, h, d, device, peers)
    return decode_calls(b, s_k, h, d, device, peers, append=op == "decode_append")


def time_call(call, backend, args):
    """ms per call, wall clock; the first call runs untimed so that an error surfaces here."""
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        call()
        return time_ms([call] * args.calls, warmup=1, reps=args.repeats, device=args.device, wall=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seqlens", default="1,2,4,8,16", help="query = key length of forward and forward_backward")
    p.add_argument("--heads", default="1,8")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--cache", type=int, default=256, help="keys in the decode cache")
    p.add_argument("--calls", type=int, default=300, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=7, help="timed loops; the median counts")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="few shapes, short loops: a smoke run")
    p.add_argument("--out", type=Path, default=None, help="JSON path (results schema of common.py)")
    args = p.parse_args(argv)
    if args.quick:
        args.seqlens, args.heads, args.head_dims, args.cache, args.calls, args.repeats = "1,16", "8", "64", 64, 10, 3
    args.ops = [op for op in args.ops.split(",") if op]
    if not args.ops or set(args.ops) - set(OPS):
        p.error(f"--ops: a comma list of {', '.join(OPS)}")
    args.seqlens, args.heads, args.head_dims = int_list(args.seqlens), int_list(args.heads), int_list(args.head_dims)
    if min(args.calls, args.repeats, args.batch, args.cache) < 1:
        p.error("--calls, --repeats, --batch and --cache must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "bench_host")
    peers = sdpa_peers(args.device)
    results = Results.start("host", args, args.device)
    torch.manual_seed(0)
    for op, s, s_k, h, d in cases(args):
        case = {"op": op, "batch": args.batch, "seqlen_q": s, "seqlen_k": s_k, "heads": h, "head_dim": d,
                "dtype": "bfloat16"}
        for impl, (call, backend) in make_calls(op, args.batch, s, s_k, h, d, args.device, peers).items():
            try:
                ms, error = time_call(call, backend, args), None
            except Exception as e:  # noqa: BLE001  (a backend that refuses the shape)
                ms, error = None, short_error(e)
            results.add(case, impl, ms, error, us_per_call=ms * 1e3 if ms else None)
        results.compare(case, peers=list(peers))
        fattn_row = results.case_rows(case)[0]
        print(f"{op} s{s} h{h} d{d}: fattn {fattn_row['us_per_call'] or 0:.1f} us/call", flush=True)
    results.write(args.out)
    print_summary(results, list(peers))
    if args.out:
        print(f"wrote {args.out}")


def print_summary(results, peers):
    impls = list(dict.fromkeys(r["impl"] for r in results.rows))
    lines = []
    for r in (r for r in results.rows if r["impl"] == "fattn"):
        case = {k: r[k] for k in ("op", "seqlen_q", "seqlen_k", "heads", "head_dim")}
        us = {x["impl"]: x["us_per_call"] for x in results.case_rows(case)}
        lines.append([r["op"], r["seqlen_q"], r["seqlen_k"], r["heads"], r["head_dim"]]
                     + [None if us.get(i) is None else f"{us[i]:.1f}" for i in impls]
                     + [r["ratio_vs"].get(p) for p in peers])
    print_table(["op", "s_q", "s_k", "h", "d"] + impls + [f"fattn/{p}" for p in peers], lines,
                title="\nhost cost, us per call (wall clock, median); fattn/peer < 1: fattn is cheaper")
    for impl, err in sorted({(r["impl"], r["error"][:160]) for r in results.rows if r["error"]}):
        print(f"note: {impl}: {err}")


if __name__ == "__main__":
    main()
