"""Where the host time of a tiny fattn call goes: torch.profiler's CPU-side table of one op.

    python benchmarks/profile_host.py --op forward_backward --rows 25

bench_host.py says how long a call takes; this says which layer (Python wrapper, autograd,
dispatcher, the C++ op, allocations, launches) spends it, for the same tiny shapes.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import fattn


def make_call(op: str, device: str):
    b, s, h, d = 1, 16, 8, 128
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=torch.bfloat16, requires_grad=op != "forward")
               for _ in range(3))
    dout = torch.randn(b, s, h, d, device=device, dtype=torch.bfloat16)
    if op == "forward":
        return lambda: fattn.flash_attn_func(q, k, v)
    return lambda: torch.autograd.grad(fattn.flash_attn_func(q, k, v), (q, k, v), dout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("forward", "forward_backward"), default="forward_backward")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    call = make_call(args.op, args.device)
    for _ in range(20):
        call()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.calls):
            call()
        if args.device == "cuda":
            torch.cuda.synchronize()
    print(f"{args.op}: {args.calls} calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
