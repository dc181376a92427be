"""Tile-config and split-count search for the decode kernel, with Triton's JIT on the GPU machine.

    python -m tuning.tune_decode --out decode_tune.json
    python -m tuning.tune_decode --kv-dtype e4m3 --configs 128:8:3,128:4:3 --out fp8_tune.json
    python -m tuning.tune_decode --device cpu --quick      # Triton's interpreter, tiny shapes

Times candidate (BLOCK_N, num_warps, num_stages) x num_splits of triton_src's
attn_decode_split (+ attn_decode_merge), launched through their specs, on the decode
benchmark's shapes (GQA 32/8, d128, one query token), contiguous and paged. Each call
list is replayed as a CUDA graph (launch overhead would otherwise hide the kernel),
rotating over enough cache copies to defeat L2. Every config is checked against a
float64 reference. On a CPU the inputs are float32 and the timing is wall clock.
With --kv-dtype e4m3 or e5m2 the caches are FP8 (the KV_FP8 variants, descales of 1), the
reference reads the same FP8 values, and GB/s counts their bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import (Results, decode_reference, int_list, load_kernels, paginate, print_table,  # noqa: E402
                    require_device, short_error, time_ms)

CONFIGS = [(64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (64, 8, 3)]
SPLITS = [8, 12, 16, 24, 32, 48]
HQ, HK, D = 32, 8, 128
KV_DTYPES = {"bf16": None, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
BLOCK_M, BLOCK_S = 16, 16  # the row tile and the merge's chunk, as aot_build/configs.json ships them


def decode(q, k_cache, v_cache, seqlens, table, splits, cfg):
    """One decode step as the library's op launches it: split-K, then the merge of the splits."""
    from tuning.launch import DecodeTiles, decode  # after load_kernels: the JIT or the interpreter

    block_n, warps, stages = cfg
    tiles = DecodeTiles(block_m=BLOCK_M, block_n=block_n, block_s=BLOCK_S, num_warps=warps, num_stages=stages)
    return decode(q, k_cache, v_cache, seqlens, table, splits, tiles)[0]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tuning.tune_decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="1x8192,1x131072,8x65536", help="batch x context, comma separated")
    parser.add_argument("--page-size", type=int, default=256)
    parser.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bf16",
                        help="the caches' dtype (e4m3: float8_e4m3fn, e5m2: float8_e5m2; q stays 16-bit)")
    parser.add_argument("--configs", default=None, help="BLOCK_N:warps:stages,... (default: CONFIGS)")
    parser.add_argument("--splits", default=None, help="comma list (default: SPLITS)")
    parser.add_argument("--copies", type=int, default=0, help="cache copies to rotate (0: enough to defeat L2)")
    parser.add_argument("--contiguous-only", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="one tiny case, one config: a smoke run")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (results schema of benchmarks/common.py)")
    args = parser.parse_args(argv)
    if args.quick:
        # One copy, one timed rep: a smoke run checks that each config runs, is right and gets a
        # time, and under the interpreter every extra call is seconds.
        args.cases, args.page_size, args.configs, args.splits, args.copies, args.reps = \
            "1x64", 16, "16:4:1", "1,3", 1, 1
    args.config_list = CONFIGS if not args.configs else [tuple(map(int, c.split(":"))) for c in args.configs.split(",")]
    args.split_list = int_list(args.splits) if args.splits else SPLITS
    return args


def tune_case(results, args, b, ctx):
    fp8 = KV_DTYPES[args.kv_dtype]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    nbytes = 2 * b * ctx * HK * D * (1 if fp8 else 2)
    copies = args.copies or max(1, min(8, (512 << 20) // nbytes))
    kvs = [torch.randn(2, b, ctx, HK, D, device=args.device, dtype=dtype) for _ in range(copies)]
    if fp8 is not None:  # paged through a byte view: index_copy_ takes no FP8 tensors
        kvs = [kv.to(fp8) for kv in kvs]
        pools = [paginate(kv.view(torch.uint8), args.page_size) for kv in kvs]
        pools = [(pool.view(fp8), table) for pool, table in pools]
    else:
        pools = [paginate(kv, args.page_size) for kv in kvs]
    q = torch.randn(b, 1, HQ, D, device=args.device, dtype=dtype)
    seqlens = torch.full((b,), ctx, dtype=torch.int32, device=args.device)
    want = decode_reference(q, kvs[0].to(torch.float32), ctx)
    for paged in (False,) if args.contiguous_only else (False, True):
        case = {"batch": b, "context": ctx, "heads": HQ, "kv_heads": HK, "head_dim": D, "paged": paged,
                "kv_dtype": args.kv_dtype}
        for cfg in args.config_list:
            for splits in args.split_list:
                def call(i, cfg=cfg, splits=splits, paged=paged):
                    if paged:
                        return decode(q, *pools[i][0], seqlens, pools[i][1], splits, cfg)
                    return decode(q, *kvs[i], seqlens, None, splits, cfg)
                ms = None
                try:
                    err = (call(0).double() - want).abs().max().item()
                    error = None if err < 2e-2 else f"WRONG (max err {err:.3e})"
                    if error is None:
                        ms = time_ms([lambda i=i: call(i) for i in range(copies)], warmup=1, reps=args.reps,
                                     device=args.device, graph=args.device == "cuda")
                except Exception as e:  # noqa: BLE001  (a config that does not fit or compile)
                    error = short_error(e, 300)
                if error:
                    print(f"b{b} ctx{ctx} paged={paged} {cfg} splits={splits}: {error}", flush=True)
                results.add(case, "attn_decode_split", ms, error, nbytes=nbytes, block_n=cfg[0], num_warps=cfg[1],
                            num_stages=cfg[2], num_splits=splits)


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "tune_decode")
    load_kernels(args.device)  # the JIT, or the interpreter on a CPU
    results = Results.start("tune_decode", args, args.device)
    for case in args.cases.split(","):
        b, ctx = map(int, case.split("x"))
        tune_case(results, args, b, ctx)
        results.write(args.out)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    lines = []
    for key in dict.fromkeys((r["batch"], r["context"], r["paged"]) for r in results.rows):
        ranked = sorted((r for r in results.rows if (r["batch"], r["context"], r["paged"]) == key and r["ms"]),
                        key=lambda r: r["ms"])
        lines += [[*key[:2], str(key[2]), r["block_n"], r["num_warps"], r["num_stages"], r["num_splits"],
                   f"{r['ms'] * 1e3:.1f}", f"{r['gb_s']:.0f}"] for r in ranked[:5]]
    print_table(["batch", "context", "paged", "BN", "warps", "stages", "splits", "us", "GB/s"], lines,
                title="\nfastest decode configs (top 5 per case)")
    results.require_timings(["batch", "context", "paged"])


if __name__ == "__main__":
    main()
