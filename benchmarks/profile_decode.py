"""One decode step for Nsight Compute: the FP8 bar's shape (32 query / 8 KV heads, d128, one query
token, batch 1, 128k keys) over a bf16 cache or the same cache quantized to e4m3 (one descale per
sequence and head), run four times (profile a later one: the first loads modules).

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \\
        --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \\
        -k regex:attn_decode_split -s 2 -c 1 python benchmarks/profile_decode.py e4m3
"""

import argparse

import torch

import fattn


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cache", choices=["bf16", "e4m3", "e5m2"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=131072)
    args = parser.parse_args()
    torch.manual_seed(0)
    heads, kv_heads, head_dim = 32, 8, 128
    q = torch.randn(args.batch, 1, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(args.batch, args.context, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    descales = {}
    if args.cache != "bf16":
        fp8 = torch.float8_e4m3fn if args.cache == "e4m3" else torch.float8_e5m2
        (k, descales["k_descale"]), (v, descales["v_descale"]) = (fattn.quantize_fp8(t, fp8, "head") for t in (k, v))
    seqlens = torch.full((args.batch,), args.context, dtype=torch.int32, device="cuda")
    for _ in range(4):
        fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **descales)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
