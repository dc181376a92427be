"""Decode throughput over a KV cache: fattn against SDPA (flash, cuDNN) and the device's read ceiling.

    python benchmarks/bench_decode.py --out benchmarks/results/decode_h100.json
    python benchmarks/bench_decode.py --batch 1 --contexts 4k,64k --num-splits 0,1,4,16
    python benchmarks/bench_decode.py --dry-run            # the case list; no GPU needed
    python benchmarks/bench_decode.py --device cpu --quick # smoke run of every code path
    python benchmarks/bench_decode.py --kv-dtype e4m3 --no-peers --batch 1 --contexts 128k
    python benchmarks/bench_decode.py --kv-dtype e4m3 --no-peers --batch 8 --contexts 64k
    python benchmarks/plot.py benchmarks/results/decode_h100.json

One decode step: bf16, 32 query heads over 8 KV heads (GQA), d128, one query token, no
append, cache_seqlens = context, non-causal. Decoding reads the whole cache, so rows carry
GB/s of K+V read (2 * batch * context * 8 * 128 * 2 bytes, GB = 1e9), all of the same data:

  fattn        fattn.flash_attn_with_kvcache on the contiguous cache [b, context, 8, 128]
  fattn_paged  the same keys over shuffled pages of --page-size tokens + a block_table
               (--page-order in-order: the pages in order)
  sdpa_flash   F.scaled_dot_product_attention(q [b, 32, 1, 128], k/v [b, 8, L, 128] transposed
  sdpa_cudnn   views of the cache, enable_gqa=True) under sdpa_kernel(FLASH / CUDNN); a backend
               that refuses is recorded with its error
  ceiling      the faster of two full reductions (fp32 sum, amax) over the case's K+V bytes

With --kv-dtype e4m3 or e5m2 the same keys and values are also quantized (fattn.quantize_fp8, a
descale per sequence and KV head) into an FP8 cache, and fattn_fp8 / fattn_paged_fp8 time it in
the same run (GB/s of the FP8 bytes read, checked against float64 attention over the dequantized
cache); the summary prints each case's FP8 / bf16 time ratio (the bar: <= 0.55 at batch 1 / 128k
and batch 8 / 64k).

Timing (common.graph_or_eager_ms): --calls back-to-back calls in a CUDA graph, replayed --reps times.
Contexts under --rotate-mb of K+V get several cache copies, consecutive calls reading
different ones, so that the L2 cannot serve a call. Every output is first checked against a
float64 reference; a wrong fattn result is not timed and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Results, decode_reference, fmt_size, graph_or_eager_ms, int_list, paginate,  # noqa: E402
                    parse_size, print_table, require_device, sdpa_peers, short_error)

import fattn  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ATOL, RTOL_L2 = 2e-2, 2e-2  # max |out - ref|, and ||out - ref|| / ||ref|| for long contexts' tiny values
DEFAULT_CASES = {1: ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k"], 8: ["8k", "16k", "32k", "64k"], 32: ["4k"],
                 64: ["2k"]}
QUICK_CASES = {1: ["100", "256"], 3: ["1000"]}
KV_DTYPES = {"bf16": None, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_BAR = 0.55  # FP8-cache time per step / bf16-cache time per step, at the bar's shapes
BAR_CASES = {(1, 128 * 1024), (8, 64 * 1024)}
CEILINGS = {"sum_fp32": lambda t: torch.sum(t, dtype=torch.float32), "amax": lambda t: torch.amax(t.view(-1))}


def plan_case(batch, context, args):
    """(the case's fields: K+V bytes, cache copies to rotate over, calls per timed unit; memory needed)."""
    nbytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
    copies = max(1, math.ceil(args.rotate_mb * 2**20 / nbytes))
    pages = -(-context // args.page_size)
    paged_bytes = 2 * batch * pages * args.page_size * KV_HEADS * HEAD_DIM * 2
    staging = paged_bytes if pages * args.page_size != context else 0  # paginate's padded copy
    ref_bytes = 2 * context * KV_HEADS * HEAD_DIM * 8  # float64 K and V of one sequence
    case = {"batch": batch, "context": context, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "kv_bytes": nbytes, "copies": copies, "calls": max(args.calls, copies)}
    mem = copies * (nbytes + paged_bytes) + staging + ref_bytes
    if KV_DTYPES[args.kv_dtype] is not None:  # FP8 copies (half the bytes) and the float32 dequantized K+V
        mem += copies * (nbytes + paged_bytes) // 2 + 2 * nbytes
    return case, mem


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default=None, help="comma list of batch sizes (default 1,8,32,64, each with its contexts)")
    p.add_argument("--contexts", default=None, help="contexts for every chosen batch, e.g. 4k,64k (default: "
                   + "; ".join(f"b{b}: {','.join(c)}" for b, c in DEFAULT_CASES.items()) + ")")
    p.add_argument("--page-size", type=int, default=256, help="tokens per page of the paged cache (multiple of 16)")
    p.add_argument("--page-order", choices=["shuffled", "in-order"], default="shuffled",
                   help="the paged cache's pages in shuffled physical order, or in order (the contiguous "
                        "cache's layout behind a block table: what the shuffle itself costs)")
    p.add_argument("--num-splits", default="0", help="fattn num_splits; a comma list sweeps them (0 = automatic)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/decode.json"))
    p.add_argument("--no-graph", dest="graph", action="store_false", help="time eagerly, not CUDA-graph replays")
    p.add_argument("--calls", type=int, default=20, help="calls per timed unit (more when more copies rotate)")
    p.add_argument("--reps", type=int, default=30, help="timed repetitions; the median counts")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes over the call list")
    p.add_argument("--rotate-mb", type=float, default=256.0, help="rotate cache copies until a unit reads this")
    p.add_argument("--max-gb", type=float, default=30.0, help="skip a case that would need more memory")
    p.add_argument("--budget-s", type=float, default=450.0, help="start no case after this many seconds (0: none)")
    p.add_argument("--no-peers", action="store_true", help="time fattn and the ceiling only")
    p.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bf16",
                   help="also time an FP8 cache of the same data (e4m3: float8_e4m3fn, e5m2: float8_e5m2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny cases, few reps: a smoke run")
    p.add_argument("--dry-run", action="store_true", help="print the cases and exit")
    args = p.parse_args(argv)
    try:
        defaults = QUICK_CASES if args.quick else DEFAULT_CASES
        args.batches = int_list(args.batch) if args.batch else list(defaults)
        contexts = [parse_size(c) for c in args.contexts.split(",") if c.strip()] if args.contexts else None
        args.cases = [(b, c) for b in args.batches for c in (contexts or map(parse_size, defaults.get(b, [])))]
        args.splits = int_list(args.num_splits)
    except ValueError as e:
        p.error(str(e))
    if not args.cases or any(b <= 0 for b in args.batches):
        p.error("no cases: give positive --batch sizes (and --contexts for a batch without defaults)")
    if not args.splits or len(set(args.splits)) != len(args.splits) or not all(0 <= n <= 256 for n in args.splits):
        p.error("--num-splits: distinct values in [0, 256]")
    if args.page_size <= 0 or args.page_size % 16 or min(args.calls, args.reps, args.warmup) < 1:
        p.error("--page-size must be a positive multiple of 16; --calls, --reps, --warmup >= 1")
    if args.quick:
        args.rotate_mb, args.calls, args.reps, args.warmup = min(args.rotate_mb, 0.5), 4, 3, 1
    args.graph = args.graph and args.device == "cuda"
    return args


def dry_run(args):
    lines = []
    for b, ctx in args.cases:
        case, mem = plan_case(b, ctx, args)
        over = "over --max-gb" if mem > args.max_gb * 1e9 else ""
        lines.append([b, fmt_size(ctx), f"{case['kv_bytes'] / 1e6:.1f}", case["copies"], case["calls"],
                      f"{mem / 1e9:.2f}", over])
    print_table(["batch", "context", "K+V MB", "copies", "calls", "mem GB", ""], lines, title="decode cases")
    print(f"num_splits {args.splits}; page size {args.page_size} ({args.page_order}); "
          f"{'graphs' if args.graph else 'eager'}; "
          f"reps {args.reps}; out {args.out}")


def check(out, ref):
    """(error or None, {max_abs_err, rel_l2_err})."""
    if tuple(out.shape) != tuple(ref.shape):
        return f"WRONG RESULT: output shape {tuple(out.shape)}, expected {tuple(ref.shape)}", {}
    diff = out.double() - ref
    errs = {"max_abs_err": float(diff.abs().max()), "rel_l2_err": float(diff.norm() / ref.norm().clamp_min(1e-300))}
    if bool(torch.isfinite(out).all()) and errs["max_abs_err"] <= ATOL and errs["rel_l2_err"] <= RTOL_L2:
        return None, errs
    return f"WRONG RESULT: {errs} (tolerances {ATOL}, {RTOL_L2})", errs


def measure(results, args, case, impl, make_call, ref=None, to_ref=None, num_splits=None, nbytes=None):
    """Checks copy 0's output against ref, then times the rotated call list; adds the row (GB/s of
    nbytes per call, the case's K+V bytes by default)."""
    error, metrics, timing = None, {}, None
    try:
        out = make_call(0)()
        if ref is not None:
            error, metrics = check(to_ref(out) if to_ref else out, ref)
        if error is None:
            ms, timing = graph_or_eager_ms([make_call(i % case["copies"]) for i in range(case["calls"])],
                                           warmup=args.warmup, reps=args.reps, device=args.device, graph=args.graph)
    except Exception as e:  # noqa: BLE001  (a peer without a kernel for this case, an fattn error)
        error = short_error(e, 1500)
    if error is not None:
        ms = None
    row = results.add(case, impl, ms, error, nbytes=nbytes or case["kv_bytes"], num_splits=num_splits, timing=timing,
                      **metrics)
    label = impl if num_splits is None else f"{impl} n={num_splits}"
    if error:
        print(f"  {'!!! ' if impl.startswith('fattn') else ''}{label:<18} {error[:400]}", flush=True)
    else:
        print(f"  {label:<18} {ms * 1e3:10.2f} us {row['gb_s']:9.1f} GB/s  [{timing}]", flush=True)
    return row


def fp8_copy(kv, dtype, page_size, shuffle=True):
    """kv [2, b, L, Hk, D] quantized into an FP8 cache: ((k, v), (k_descale, v_descale) [b, Hk],
    (paged k pool, paged v pool, block_table)), the pages shuffled as paginate's."""
    (k8, kd), (v8, vd) = (fattn.quantize_fp8(kv[i], dtype, granularity="head") for i in (0, 1))
    pool, table = paginate(torch.stack([k8, v8]).view(torch.uint8), page_size, shuffle)  # index_copy_ on the bytes
    pool = pool.view(dtype)
    return (k8, v8), (kd, vd), (pool[0], pool[1], table)


def dequantized(cache):
    """float32 [2, b, L, Hk, D] of an fp8_copy's contiguous cache: x_fp8 * descale[b, h]."""
    (k8, v8), (kd, vd), _ = cache
    return torch.stack([k8.float() * kd[:, None, :, None], v8.float() * vd[:, None, :, None]])


def run_case(args, results, case):
    """Measures one case; returns fattn's failures."""
    b, ctx, copies = case["batch"], case["context"], case["copies"]
    print(f"\n[batch {b}, context {fmt_size(ctx)}] K+V {case['kv_bytes'] / 1e6:.1f} MB, {copies} copies, "
          f"{case['calls']} calls per timed unit", flush=True)
    dev = args.device
    qs = [torch.randn(b, 1, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    # K and V of a copy in one allocation: the ceiling's reduction reads exactly these bytes.
    kvs = [torch.randn(2, b, ctx, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    shuffle = args.page_order == "shuffled"
    paged = [paginate(kv, args.page_size, shuffle) for kv in kvs]
    seqlens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    ref = decode_reference(qs[0], kvs[0], ctx)

    ceilings = [measure(results, args, case, f"ceiling:{name}", lambda i, fn=fn: (lambda: fn(kvs[i])))
                for name, fn in CEILINGS.items()]
    best = max(ceilings, key=lambda r: r["gb_s"] or 0)
    results.rows.append(dict(best, impl="ceiling", method=best["impl"].split(":")[1], ratio_vs={},
                             ratio={}))
    for name, backend in ({} if args.no_peers else sdpa_peers(dev)).items():
        def sdpa(i, backend=backend):
            qt, kt, vt = qs[i].transpose(1, 2).contiguous(), kvs[i][0].transpose(1, 2), kvs[i][1].transpose(1, 2)

            def call():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            return call
        measure(results, args, case, name, sdpa, ref, to_ref=lambda o: o.transpose(1, 2))
    fails = []
    for n in args.splits:
        for impl in ("fattn", "fattn_paged"):
            def decode(i, n=n, impl=impl):
                kc, vc, table = (kvs[i][0], kvs[i][1], None) if impl == "fattn" else (*paged[i][0], paged[i][1])
                return lambda: fattn.flash_attn_with_kvcache(qs[i], kc, vc, cache_seqlens=seqlens,
                                                             block_table=table, num_splits=n)
            row = measure(results, args, case, impl, decode, ref, num_splits=n)
            if row["error"]:
                fails.append(f"b{b} ctx {fmt_size(ctx)} {impl} n={n}: {row['error'][:300]}")
    fp8_dtype = KV_DTYPES[args.kv_dtype]
    if fp8_dtype is not None:
        fp8 = [fp8_copy(kv, fp8_dtype, args.page_size, shuffle) for kv in kvs]
        ref8 = decode_reference(qs[0], dequantized(fp8[0]), ctx)
        for n in args.splits:
            for impl in ("fattn_fp8", "fattn_paged_fp8"):
                def decode8(i, n=n, impl=impl):
                    (k8, v8), (kd, vd), (kp, vp, table) = fp8[i]
                    kc, vc, table = (k8, v8, None) if impl == "fattn_fp8" else (kp, vp, table)
                    return lambda: fattn.flash_attn_with_kvcache(qs[i], kc, vc, cache_seqlens=seqlens,
                                                                 block_table=table, num_splits=n, k_descale=kd,
                                                                 v_descale=vd)
                row = measure(results, args, case, impl, decode8, ref8, num_splits=n, nbytes=case["kv_bytes"] // 2)
                if row["error"]:
                    fails.append(f"b{b} ctx {fmt_size(ctx)} {impl} n={n}: {row['error'][:300]}")
    for r in results.case_rows(case):
        r["frac_ceiling"] = r["gb_s"] / best["gb_s"] if r["gb_s"] and best["gb_s"] else None
    results.compare(case, peers=list(sdpa_peers(dev)))
    return fails


def best_rows(rows):
    """The row of each impl; for fattn and fattn_paged the one of the fastest num_splits."""
    best = {}
    for r in rows:
        if r["impl"] not in best or (r["gb_s"] or 0) > (best[r["impl"]]["gb_s"] or 0):
            best[r["impl"]] = r
    return best


def fp8_ratios(best):
    """(contiguous, paged) FP8-cache time / bf16-cache time of a case's best rows, None where missing."""
    def ratio(fp8, bf16):
        f, b = best.get(fp8, {}).get("ms"), best.get(bf16, {}).get("ms")
        return f / b if f and b else None
    return ratio("fattn_fp8", "fattn"), ratio("fattn_paged_fp8", "fattn_paged")


def print_fp8_summary(results, args):
    lines = []
    for b, ctx in args.cases:
        best = best_rows(results.case_rows({"batch": b, "context": ctx}))
        contiguous, paged = fp8_ratios(best)
        bar = ""
        if (b, ctx) in BAR_CASES:
            worst = max((r for r in (contiguous, paged) if r is not None), default=None)
            bar = "n/a" if worst is None else ("meets" if worst <= FP8_BAR else "MISSES")
        lines.append([b, fmt_size(ctx), best.get("fattn", {}).get("ms"), best.get("fattn_fp8", {}).get("ms"),
                      contiguous, paged, bar])
    print_table(["batch", "context", "bf16 ms", f"{args.kv_dtype} ms", "fp8/bf16", "paged fp8/bf16",
                 f"bar <= {FP8_BAR}"], lines, title=f"\nFP8 ({args.kv_dtype}) cache / bf16 cache, time per step")


def print_summary(results, args):
    peers = [] if args.no_peers else list(sdpa_peers(args.device))
    impls = ["ceiling", "fattn", "fattn_paged"] + peers
    lines, sweep = [], []
    for b, ctx in args.cases:
        rows = results.case_rows({"batch": b, "context": ctx})
        best = best_rows(rows)
        f, paged = best.get("fattn", {}), best.get("fattn_paged", {})
        gb = [best.get(i, {}).get("gb_s") for i in impls]
        lines.append([b, fmt_size(ctx)] + [x and f"{x:.0f}" for x in gb]
                     + [f.get("ms") and f"{f['ms'] * 1e3:.1f}", f.get("num_splits"), f.get("frac_ceiling")]
                     + [f.get("ratio_vs", {}).get(p) for p in peers]
                     + [paged["ms"] / f["ms"] if paged.get("ms") and f.get("ms") else None,
                        best.get("skipped", {}).get("error")])
        gb_at = {(r["impl"], r["num_splits"]): r["gb_s"] or 0 for r in rows if r["impl"].startswith("fattn")}
        sweep.append([b, fmt_size(ctx)] + [f"{gb_at.get(('fattn', n), 0):.0f}/{gb_at.get(('fattn_paged', n), 0):.0f}"
                                           for n in args.splits])
    if len(args.splits) > 1:
        print_table(["batch", "context"] + [f"n={n}" for n in args.splits], sweep,
                    title="\nfattn num_splits sweep, GB/s contiguous/paged")
    print_table(["batch", "context"] + impls + ["fattn us", "n", "f/ceil"] + [f"fattn/{p}" for p in peers]
                + ["paged/contig", "skipped"], lines,
                title="\nGB/s of K+V read (fattn: best num_splits); x/y = time ratio (< 1: x is faster)")
    for impl, err in sorted({(r["impl"], r["error"][:160]) for r in results.rows if r["error"] and r["impl"] in peers}):
        print(f"note: {impl}: {err}")


def skip_reason(args, mem, elapsed_s):
    if args.budget_s and elapsed_s > args.budget_s:
        return f"time budget ({args.budget_s:.0f} s) spent"
    free = torch.cuda.mem_get_info()[0] if args.device == "cuda" else math.inf
    if mem > min(args.max_gb * 1e9, 0.9 * free):
        return f"needs {mem / 1e9:.1f} GB (--max-gb {args.max_gb}, {free / 1e9:.1f} GB free)"
    return None


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    require_device(args.device, "bench_decode")
    start = time.time()
    torch.manual_seed(args.seed)
    results = Results.start("decode", args, args.device)
    fails = []
    for b, ctx in args.cases:
        case, mem = plan_case(b, ctx, args)
        skip = skip_reason(args, mem, time.time() - start)
        if skip:
            print(f"\n[batch {b}, context {fmt_size(ctx)}] skipped: {skip}", flush=True)
            results.add(case, "skipped", None, skip)
        else:
            try:
                fails += run_case(args, results, case)
            except Exception as e:  # noqa: BLE001  (out of memory, a broken CUDA context, a bug)
                results.add(case, "case_failed", None, short_error(e, 1500))
                fails.append(f"b{b} ctx {fmt_size(ctx)}: case failed: {short_error(e, 300)}")
                print(f"  !!! {fails[-1]}", flush=True)
                results.write(args.out)
                if args.device == "cuda":
                    torch.cuda.synchronize()  # a sticky CUDA error raises here: no later case could run
            if args.device == "cuda":
                torch.cuda.empty_cache()
        results.write(args.out)  # after every case: a cut-off run keeps what it measured
    print_summary(results, args)
    if KV_DTYPES[args.kv_dtype] is not None:
        print_fp8_summary(results, args)
    print(f"\nwrote {args.out} ({time.time() - start:.0f} s)")
    if fails:
        print("\n!!! fattn failures:", *fails, sep="\n  ")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
