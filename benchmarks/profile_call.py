"""One call to look inside: for Nsight Compute (attention, decode) or torch.profiler (host).

attention: attention at bf16 with bench_attention.py's shapes (16k tokens per step: batch
16384 // seqlen; hidden 2048: 2048 // head_dim heads), run twice (the first call loads modules
and warms up; profile the second). Modes: fwd_fattn, fwd_cudnn (SDPA's cuDNN backend),
bwd_fattn, bwd_cudnn (forward then backward), fwd_fa4, bwd_fa4 (FlashAttention-4, where
installed: common.fa4_peer), fwd_fattn_fp8 (the same q, k, v quantized to e4m3 by
fattn.quantize_fp8, one descale per sequence and head).

    ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats -k regex:attn_fwd -s 1 -c 1 \\
        python benchmarks/profile_call.py attention fwd_fattn
    ... -k regex:'sdpa|fmha|fprop' -s 1 -c 1 python benchmarks/profile_call.py attention fwd_cudnn
    ... -k regex:attn_bwd_dkdv -s 1 -c 1 python benchmarks/profile_call.py attention bwd_fattn
    ... -k regex:attn_fwd -s 1 -c 1 python benchmarks/profile_call.py attention fwd_fattn_fp8

decode: one decode step at the FP8 bar's shape (32 query / 8 KV heads, d128, one query token,
batch 1, 128k keys) over a bf16 cache or the same cache quantized to e4m3 or e5m2 (one descale
per sequence and head), run four times (profile a later one: the first loads modules).

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \\
        -k regex:attn_decode_split -s 2 -c 1 python benchmarks/profile_call.py decode e4m3

host: where the host time of a tiny fattn call goes, torch.profiler's CPU-side table of one op
at bench_host.py's tiny shapes. bench_host.py says how long a call takes; this says which layer
(Python wrapper, autograd, dispatcher, the C++ op, allocations, launches) spends it.

    python benchmarks/profile_call.py host --op forward_backward --rows 25
"""

# Not profile.py: a script run from benchmarks/ has that folder first on sys.path, where the name
# would hide the standard library's profile module, which torch's compiler imports.

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fattn
from common import fa4_peer

ATTENTION_MODES = ["fwd_fattn", "fwd_cudnn", "fwd_fa4", "bwd_fattn", "bwd_cudnn", "bwd_fa4", "fwd_fattn_fp8"]
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def attention(args):
    heads, batch = 2048 // args.head_dim, max(1, 16384 // args.seqlen)
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    descales = {}
    if args.mode == "fwd_fattn_fp8":
        quantized = [fattn.quantize_fp8(t.detach(), torch.float8_e4m3fn, "head") for t in (q, k, v)]
        (q, descales["q_descale"]), (k, descales["k_descale"]), (v, descales["v_descale"]) = quantized
    for _ in range(2):
        if args.mode == "fwd_fattn_fp8":
            out = fattn.flash_attn_func(q, k, v, causal=args.causal, **descales)
        elif args.mode.endswith("fattn"):
            out = fattn.flash_attn_func(q, k, v, causal=args.causal)
        elif args.mode.endswith("fa4"):
            out = fa4_peer("cuda")(q, k, v, causal=args.causal)
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        if args.mode.startswith("bwd"):
            out.sum().backward()
    torch.cuda.synchronize()


def decode(args):
    torch.manual_seed(0)
    heads, kv_heads, head_dim = 32, 8, 128
    q = torch.randn(args.batch, 1, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(args.batch, args.context, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    descales = {}
    if args.cache in FP8:
        (k, descales["k_descale"]), (v, descales["v_descale"]) = (fattn.quantize_fp8(t, FP8[args.cache], "head")
                                                                  for t in (k, v))
    seqlens = torch.full((args.batch,), args.context, dtype=torch.int32, device="cuda")
    for _ in range(4):
        fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **descales)
    torch.cuda.synchronize()


def host_call(op: str, device: str):
    b, s, h, d = 1, 16, 8, 128
    q, k, v = (torch.randn(b, s, h, d, device=device, dtype=torch.bfloat16, requires_grad=op != "forward")
               for _ in range(3))
    dout = torch.randn(b, s, h, d, device=device, dtype=torch.bfloat16)
    if op == "forward":
        return lambda: fattn.flash_attn_func(q, k, v)
    return lambda: torch.autograd.grad(fattn.flash_attn_func(q, k, v), (q, k, v), dout)


def host(args):
    call = host_call(args.op, args.device)
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_subparsers(dest="what", required=True)
    p = what.add_parser("attention", help="one attention call, for Nsight Compute")
    p.add_argument("mode", choices=ATTENTION_MODES)
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.set_defaults(run=attention)
    p = what.add_parser("decode", help="one decode step, for Nsight Compute")
    p.add_argument("cache", choices=["bf16", *FP8])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=131072)
    p.set_defaults(run=decode)
    p = what.add_parser("host", help="torch.profiler's host-side table of a tiny call")
    p.add_argument("--op", choices=("forward", "forward_backward"), default="forward_backward")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rows", type=int, default=25)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.set_defaults(run=host)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
