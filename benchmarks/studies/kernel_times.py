"""Where one call's GPU time goes: the kernels of one forward or backward call of fattn and of the
SDPA peers, on bench_attention.py's shapes (bf16, --hidden, --tokens per step), from the torch
profiler over --calls calls. The benchmark CLI says how fast; this says which kernel to work on.

    python benchmarks/studies/kernel_times.py --pass backward --head-dims 64,128 --seqlens 4096,16384

Prints, per case and library, the call's time as the benchmark CLI measures it (CUDA events
around one call after a synchronize: where it exceeds the kernels' sum, the GPU waited for the
host), the summed kernel time of one call and each kernel's share (kernels told apart by their
full names, printed cut to 60 characters).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: the CLI and common.py
from bench_attention import make_impls, timed_call  # noqa: E402
from common import int_list, short_error, time_ms  # noqa: E402


def kernel_times(call, calls: int) -> dict[str, float]:
    """Microseconds per call of each kernel the call launches."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / calls
    return dict(totals)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass", dest="direction", choices=["forward", "backward"], default="backward")
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--causal", default="0,1", help="0, 1 or both")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--libraries", default="fattn,sdpa_cudnn", help="of fattn, sdpa_flash, sdpa_cudnn")
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernel_times needs a CUDA GPU: it profiles CUDA kernels")
    for d in int_list(args.head_dims):
        for causal in (bool(c) for c in int_list(args.causal)):
            impls = make_impls(causal, False, "cuda")
            for s in int_list(args.seqlens):
                b, h = max(1, args.tokens // s), args.hidden // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                for name in args.libraries.split(","):
                    case = f"{args.direction} d{d} s{s} causal={causal} {name}"
                    try:
                        call = timed_call(impls[name], args.direction, (q, k, v, qt, kt, vt))
                        times = kernel_times(call, args.calls)
                        call_us = time_ms(call) * 1e3
                    except Exception as e:  # noqa: BLE001  (a peer without a kernel for this shape)
                        print(f"{case}: failed: {short_error(e)[:160]}", flush=True)
                        continue
                    total = sum(times.values())
                    if total == 0:
                        print(f"{case}: call {call_us:.0f} us, no kernel recorded (the profiler saw no CUDA "
                              "activity)", flush=True)
                        continue
                    parts = ", ".join(f"{n[:60]} {t:.0f}us ({t / total:.0%})"
                                      for n, t in sorted(times.items(), key=lambda kv: -kv[1]))
                    print(f"{case}: call {call_us:.0f} us, kernels {total:.0f} us: {parts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
