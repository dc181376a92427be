"""One shape for Nsight Compute: attention at bf16 with bench_attention.py's shapes (16k tokens per
step: batch 16384 // seqlen; hidden 2048: 2048 // head_dim heads), run twice (the first call loads
modules and warms up; profile the second).

    ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats -k regex:attn_fwd -s 1 -c 1 \\
        python benchmarks/profile_attention.py fwd_fattn
    ... -k regex:'sdpa|fmha|fprop' -s 1 -c 1 python benchmarks/profile_attention.py fwd_cudnn
    ... -k regex:attn_bwd_dkdv -s 1 -c 1 python benchmarks/profile_attention.py bwd_fattn

    ... -k regex:attn_fwd -s 1 -c 1 python benchmarks/profile_attention.py fwd_fattn_fp8

Modes: fwd_fattn, fwd_cudnn (SDPA's cuDNN backend), bwd_fattn, bwd_cudnn (forward then backward),
fwd_fattn_fp8 (the same q, k, v quantized to e4m3 by fattn.quantize_fp8, one descale per sequence
and head).
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fattn


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["fwd_fattn", "fwd_cudnn", "bwd_fattn", "bwd_cudnn", "fwd_fattn_fp8"])
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
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
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=args.causal)
        if args.mode.startswith("bwd"):
            out.sum().backward()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
