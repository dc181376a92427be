"""Decode throughput over a KV cache: fattn against SDPA (flash, cuDNN) and the device's read ceiling.

    python benchmarks/bench_decode.py --out benchmarks/results/decode_h100.json
    python benchmarks/bench_decode.py --batch 1 --contexts 4k,64k --num-splits 0,1,4,16
    python benchmarks/bench_decode.py --dry-run          # the case list; no GPU needed
    python benchmarks/plot_decode.py benchmarks/results/decode_h100.json

One decode step: bf16, 32 query heads over 8 KV heads (GQA), head_dim 128, one query
token, no append (k = v = None), cache_seqlens = context for every sequence, non-causal.
Decoding is a read of the whole cache, so every implementation is reported in GB/s of
K+V read: 2 * batch * context * kv_heads * head_dim * 2 bytes (GB = 1e9; q and out are
negligible). All implementations read the same data:

  fattn        fattn.flash_attn_with_kvcache on the contiguous cache [b, context, 8, 128]
  fattn_paged  the same keys scattered over shuffled pages of --page-size tokens + a block_table
  sdpa_flash   F.scaled_dot_product_attention(q [b, 32, 1, 128], k/v [b, 8, L, 128] (transposed
  sdpa_cudnn   views of the same cache), enable_gqa=True) under sdpa_kernel(FLASH / CUDNN); a
               backend that refuses is recorded with its error (heads are never expanded)
  ceiling      a full reduction (sum with fp32 accumulation, and amax; the faster counts) over
               exactly the K+V bytes of the case: the device's read bandwidth at that size

Timing: each implementation is captured in a CUDA graph of --calls back-to-back calls (after
a warm-up on a side stream) and the graph is replayed --reps times; per-call time = median
replay time / calls. Contexts whose K+V is under --rotate-mb get several distinct cache copies,
consecutive calls reading different copies, so that one replay reads >= --rotate-mb and the
50 MB L2 cannot serve a call. --no-graph times the same call lists with benchmarks/common.time_ms.
Before timing, every output (fattn for each --num-splits value, contiguous and paged, and the
SDPA peers) is checked against a float64 reference computed from the cache; a wrong fattn
result is reported loudly, not timed, and makes the exit status 1.
JSON is written after every case, so a run cut off keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment, time_ms, write_json  # noqa: E402

try:  # torch >= 2.3; guarded so that --help / --dry-run work whatever the torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover
    SDPBackend, sdpa_kernel = None, None

HEADS, KV_HEADS, HEAD_DIM, SEQLEN_Q = 32, 8, 128, 1
DTYPE = torch.bfloat16
ATOL = 2e-2      # max |out - ref| (bf16)
RTOL_L2 = 2e-2   # ||out - ref|| / ||ref||: catches wrong results whose values are all tiny (long contexts)
DEFAULT_CASES = {
    1: ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k"],
    8: ["8k", "16k", "32k", "64k"],
    32: ["4k"],
}
SELFTEST_CASES = {1: ["100", "256"], 3: ["1000"]}
PEERS = ["sdpa_flash", "sdpa_cudnn"]
ERR_CHARS = 1500


# ----------------------------------------------------------------------------- cases

def parse_size(text: str) -> int:
    """'4k' -> 4096, '128K' -> 131072, '1000' -> 1000."""
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        t, mult = t[:-1], 1024
    elif t.endswith("m"):
        t, mult = t[:-1], 1024 * 1024
    value = int(t) * mult
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def fmt_size(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 and n >= 1024 else str(n)


def kv_bytes(batch: int, context: int) -> int:
    return 2 * batch * context * KV_HEADS * HEAD_DIM * 2


def make_cases(batches, contexts, defaults=DEFAULT_CASES):
    """(batch, context) pairs: --contexts for every chosen batch, else each batch's defaults."""
    cases = []
    for b in batches:
        ctxs = contexts if contexts is not None else [parse_size(c) for c in defaults.get(b, [])]
        if not ctxs:
            raise ValueError(f"batch {b} has no default contexts; give --contexts")
        cases.extend((b, c) for c in ctxs)
    return cases


def plan_case(batch, context, args):
    """Copies of the cache to rotate over, calls per timed unit, and the memory the case needs."""
    nbytes = kv_bytes(batch, context)
    rotate = int(args.rotate_mb * 2**20)
    copies = 1 if nbytes >= rotate else math.ceil(rotate / nbytes)
    calls = max(args.calls, copies)
    pages = -(-context // args.page_size)
    paged_bytes = 2 * batch * pages * args.page_size * KV_HEADS * HEAD_DIM * 2
    padding_tmp = paged_bytes if pages * args.page_size != context else 0  # padded staging copy
    ref_tmp = 2 * context * KV_HEADS * HEAD_DIM * 8  # float64 K and V of one sequence
    need = copies * (nbytes + paged_bytes) + padding_tmp + ref_tmp
    return {"batch": batch, "context": context, "bytes": nbytes, "copies": copies,
            "calls": calls, "pages_per_seq": pages, "mem_bytes": need}


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default=None,
                   help="comma list of batch sizes (default 1,8,32; each with its default contexts)")
    p.add_argument("--contexts", default=None,
                   help="comma list of contexts for every chosen batch, e.g. 4k,64k (default: per batch: "
                        + "; ".join(f"b{b}: {','.join(c)}" for b, c in DEFAULT_CASES.items()) + ")")
    p.add_argument("--page-size", type=int, default=256, help="tokens per page of the paged cache (multiple of 16)")
    p.add_argument("--num-splits", default="0",
                   help="fattn num_splits; a comma list sweeps the values (fattn only), e.g. 0,1,2,4,8,16")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/decode.json)")
    p.add_argument("--graph", dest="graph", action="store_true", default=True,
                   help="time CUDA-graph replays of --calls calls (default)")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="time the same call lists eagerly with common.time_ms")
    p.add_argument("--calls", type=int, default=20, help="calls per graph (more when more cache copies rotate)")
    p.add_argument("--reps", type=int, default=30, help="timed replays; the median counts")
    p.add_argument("--warmup", type=int, default=3, help="untimed passes over the call list")
    p.add_argument("--rotate-mb", type=float, default=256.0,
                   help="cases with less K+V than this (MiB) rotate over distinct cache copies")
    p.add_argument("--max-gb", type=float, default=30.0, help="skip a case that would need more GPU memory")
    p.add_argument("--budget-s", type=float, default=450.0,
                   help="start no new case after this many seconds (0: no limit); the rest is marked skipped")
    p.add_argument("--no-peers", action="store_true", help="time fattn and the ceiling only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the cases and exit (no GPU needed)")
    p.add_argument("--cpu-selftest", action="store_true",
                   help="run the whole pipeline on CPU with tiny cases (wall-clock timing, a spec-following "
                        "stand-in for fattn when the real op is missing): checks this script without a GPU")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        defaults = SELFTEST_CASES if args.cpu_selftest else DEFAULT_CASES
        args.batches = parse_int_list(args.batch) if args.batch else list(defaults)
        args.context_list = [parse_size(c) for c in args.contexts.split(",") if c.strip()] if args.contexts else None
        args.splits = parse_int_list(args.num_splits)
        args.cases = make_cases(args.batches, args.context_list, defaults)
    except ValueError as e:
        parser.error(str(e))
    if not args.splits:
        parser.error("--num-splits: give at least one value")
    if any(n < 0 or n > 256 for n in args.splits):
        parser.error("--num-splits: values must be in [0, 256] (0 = automatic)")
    if len(set(args.splits)) != len(args.splits):
        parser.error("--num-splits: repeated value")
    if any(b <= 0 for b in args.batches):
        parser.error("--batch: sizes must be positive")
    if args.page_size <= 0 or args.page_size % 16:
        parser.error("--page-size must be a positive multiple of 16")
    if args.calls < 1 or args.reps < 1 or args.warmup < 1:
        parser.error("--calls, --reps and --warmup must be >= 1")
    if args.cpu_selftest:
        args.graph = False
        if args.rotate_mb == 256.0:
            args.rotate_mb = 0.5  # exercise the rotation with tiny caches
        args.calls = min(args.calls, 4)
        args.reps = min(args.reps, 3)
        args.warmup = 1
    args.out = args.out or Path("benchmarks/results/decode_cpu_selftest.json" if args.cpu_selftest
                                else "benchmarks/results/decode.json")
    return args


def setting(args) -> dict:
    return {
        "op": "decode", "dtype": "bfloat16", "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "seqlen_q": SEQLEN_Q, "causal": False, "append": False, "cache_seqlens": "context (every sequence)",
        "page_size": args.page_size, "num_splits": args.splits, "graph": args.graph, "calls": args.calls,
        "reps": args.reps, "warmup": args.warmup, "rotate_mb": args.rotate_mb,
        "bytes": "2 * batch * context * kv_heads * head_dim * 2 (K+V read once); GBps = bytes / s / 1e9",
        "ceiling": "max of torch.sum(kv, dtype=float32) and torch.amax(kv) over the K+V bytes of the case",
        "check": f"float64 reference; max abs err <= {ATOL} and rel L2 err <= {RTOL_L2}",
        "cpu_selftest": args.cpu_selftest,
    }


def dry_run(args):
    print("decode benchmark cases (K+V bytes read per call; copies rotated; calls per timed unit; GPU memory)")
    print(f"{'batch':>5} {'context':>8} {'K+V MB':>9} {'copies':>6} {'calls':>5} {'pages':>6} {'mem GB':>7}")
    for b, ctx in args.cases:
        p = plan_case(b, ctx, args)
        flag = "  (over --max-gb: would be skipped)" if p["mem_bytes"] > args.max_gb * 1e9 else ""
        print(f"{b:>5} {fmt_size(ctx):>8} {p['bytes'] / 1e6:9.1f} {p['copies']:>6} {p['calls']:>5} "
              f"{p['pages_per_seq']:>6} {p['mem_bytes'] / 1e9:7.2f}{flag}")
    print(f"fattn num_splits: {args.splits}; page size {args.page_size}; "
          f"{'CUDA graphs' if args.graph else 'eager (common.time_ms)'}; reps {args.reps}; out {args.out}")


# ----------------------------------------------------------------------------- implementations

def short_error(e: BaseException, caught=()) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    reasons = [str(w.message) for w in caught]
    if reasons:
        msg += " | warnings: " + " / ".join(r.replace("\n", " ") for r in reasons)
    return msg[:ERR_CHARS]


def stand_in_decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, num_splits=0):
    """The decode contract of decode_spec.md for this benchmark's setting (no append, no window),
    in plain torch: used by --cpu-selftest only, when fattn's op is missing."""
    b, sq, h, d = q.shape
    hk = k_cache.shape[2]
    out = torch.empty_like(q)
    for i in range(b):
        n = int(cache_seqlens[i])
        if block_table is not None:
            ps = k_cache.shape[1]
            idx = torch.arange(n)
            pages = block_table[i].long()[idx // ps]
            k, v = k_cache[pages, idx % ps], v_cache[pages, idx % ps]
        else:
            k, v = k_cache[i, :n], v_cache[i, :n]
        qq = q[i].float().reshape(sq, hk, h // hk, d)
        s = torch.einsum("qhgd,lhd->qhgl", qq, k.float()) / math.sqrt(d)
        o = torch.einsum("qhgl,lhd->qhgd", torch.softmax(s, -1), v.float())
        out[i] = o.reshape(sq, h, d).to(q.dtype)
    return out


def resolve_fattn(selftest: bool):
    """(decode(q, k_cache, v_cache, cache_seqlens, block_table, num_splits) -> out, error or None, note)."""
    try:
        import fattn
    except Exception as e:  # noqa: BLE001
        if selftest:
            return stand_in_decode, None, f"stand-in (import fattn failed: {type(e).__name__})"
        return None, f"import fattn failed: {short_error(e)}", ""
    fn = getattr(fattn, "flash_attn_with_kvcache", None)
    if fn is not None:
        def run(q, kc, vc, seqlens, block_table, n):
            out = fn(q, kc, vc, cache_seqlens=seqlens, block_table=block_table, num_splits=n)
            return out[0] if isinstance(out, (tuple, list)) else out
        return run, None, "fattn.flash_attn_with_kvcache"
    try:
        op = torch.ops.fattn.decode
    except (AttributeError, RuntimeError):
        op = None
    if op is not None:
        def run_op(q, kc, vc, seqlens, block_table, n):
            return op(q, kc, vc, None, None, seqlens, block_table, None, False, -1, -1, 0.0, n)[0]
        return run_op, None, "torch.ops.fattn.decode"
    if selftest:
        return stand_in_decode, None, "stand-in (fattn has no decode op)"
    return None, "this fattn has neither flash_attn_with_kvcache nor torch.ops.fattn.decode", ""


def sdpa_backends():
    if sdpa_kernel is None or SDPBackend is None:
        return {name: None for name in PEERS}
    return {"sdpa_flash": getattr(SDPBackend, "FLASH_ATTENTION", None),
            "sdpa_cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}


def sdpa_call(backend, q, kv):
    """SDPA's layout: q [b, 32, 1, 128] (a contiguous copy of fattn's q, made once, outside the
    timed call) and the cache kv [2, b, L, 8, 128] seen as [b, 8, L, 128] views (no copy)."""
    qt, kt, vt = q.transpose(1, 2).contiguous(), kv[0].transpose(1, 2), kv[1].transpose(1, 2)

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    return run


# ----------------------------------------------------------------------------- data, reference, check

def paginate(kv: torch.Tensor, page_size: int):
    """kv [2, b, L, hk, d] -> (pool [2, b * pages, page_size, hk, d], block_table int32 [b, pages]):
    the logical pages in shuffled physical order; key j of sequence i lives at
    pool[:, block_table[i, j // page_size], j % page_size]."""
    _, b, length, hk, d = kv.shape
    pages = -(-length // page_size)
    if pages * page_size != length:
        src = kv.new_zeros(2, b, pages * page_size, hk, d)
        src[:, :, :length] = kv
    else:
        src = kv
    src = src.reshape(2, b * pages, page_size, hk, d)
    perm = torch.randperm(b * pages, device=kv.device)
    pool = torch.empty_like(src)
    pool.index_copy_(1, perm, src)  # pool[:, perm[i]] = src[:, i]
    del src
    return pool, perm.view(b, pages).to(torch.int32).contiguous()


def reference(q: torch.Tensor, kv: torch.Tensor, context: int) -> torch.Tensor:
    """float64 attention of q [b, 1, H, D] over the first `context` keys of kv [2, b, L, Hk, D]."""
    b, sq, h, d = q.shape
    hk = kv.shape[3]
    out = torch.empty(b, sq, h, d, dtype=torch.float64, device=q.device)
    for i in range(b):
        k = kv[0, i, :context].double()
        v = kv[1, i, :context].double()
        qq = q[i].double().reshape(sq, hk, h // hk, d)  # query head h reads kv head h // (H / Hk)
        s = torch.einsum("qhgd,lhd->qhgl", qq, k) / math.sqrt(d)
        out[i] = torch.einsum("qhgl,lhd->qhgd", torch.softmax(s, dim=-1), v).reshape(sq, h, d)
        del k, v, s
    return out


def check(out, ref) -> dict:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return {"ok": False, "why": f"output shape {shape}, expected {tuple(ref.shape)}"}
    o = out.detach().to(torch.float64)
    finite = bool(torch.isfinite(o).all())
    diff = o - ref
    max_abs = float(diff.abs().max())
    rel = float(diff.norm() / ref.norm().clamp_min(1e-300))
    ok = finite and max_abs <= ATOL and rel <= RTOL_L2
    res = {"ok": ok, "max_abs_err": max_abs, "rel_l2_err": rel}
    if not ok:
        res["why"] = (f"WRONG RESULT: finite={finite} max|out-ref|={max_abs:.3g} (atol {ATOL}) "
                      f"rel L2={rel:.3g} (tol {RTOL_L2})")
    return res


class CaseData:
    """`copies` independent caches (and their paged versions) with their queries."""

    def __init__(self, batch, context, copies, page_size, device, paged=True):
        self.batch, self.context = batch, context
        self.q, self.kv, self.pool, self.block_table = [], [], [], []
        for _ in range(copies):
            self.q.append(torch.randn(batch, SEQLEN_Q, HEADS, HEAD_DIM, device=device, dtype=DTYPE))
            # K and V of one copy in one allocation: kv[0] and kv[1] are contiguous caches, and the
            # ceiling reduction reads exactly these bytes.
            self.kv.append(torch.randn(2, batch, context, KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE))
            if paged:
                pool, table = paginate(self.kv[-1], page_size)
                self.pool.append(pool)
                self.block_table.append(table)
        self.seqlens = torch.full((batch,), context, dtype=torch.int32, device=device)


# ----------------------------------------------------------------------------- timing

class Timer:
    def __init__(self, args, device):
        self.args, self.device = args, device

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def eager_ms(self, calls):
        def unit():
            for c in calls:
                c()
        if self.device == "cuda":
            return time_ms(unit, warmup=self.args.warmup, reps=self.args.reps) / len(calls)
        for _ in range(self.args.warmup):
            unit()
        times = []
        for _ in range(self.args.reps):
            t0 = time.perf_counter()
            unit()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times) / len(calls)

    def graph_ms(self, calls):
        """Median ms per call of a CUDA graph holding all `calls` back to back."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            for _ in range(self.args.warmup):
                for c in calls:
                    c()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for c in calls:
                    c()
            graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(self.args.reps):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            return statistics.median(times) / len(calls)
        finally:
            torch.cuda.synchronize()
            try:
                graph.reset()  # frees the graph's private memory pool now
            except Exception:  # noqa: BLE001  (a graph whose capture failed)
                pass
            del graph

    def ms_per_call(self, calls):
        """(ms per call, how it was timed)."""
        if not self.args.graph:
            return self.eager_ms(calls), "eager"
        try:
            return self.graph_ms(calls), "graph"
        except Exception as e:  # noqa: BLE001  (an op that cannot be captured: still time it)
            torch.cuda.synchronize()  # raises if the context is broken: the caller stops the run
            note = f"eager (graph capture failed: {short_error(e)[:300]})"
            print(f"    ! {note}", flush=True)
            return self.eager_ms(calls), note


# ----------------------------------------------------------------------------- one case

def is_fatal_cuda(device) -> str | None:
    """A sticky CUDA error (illegal address, ...) leaves the context unusable: report it."""
    if device != "cuda":
        return None
    try:
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return short_error(e)


def measure(rows, timer, base, name, make_call, ref, n_copies, n_calls, num_splits=None, is_fattn=False,
            to_ref_layout=None):
    """Check copy 0 against the reference, then time the rotated call list; append the row.
    Raises if the CUDA context is left unusable (the run cannot go on)."""
    row = dict(base, impl=name, num_splits=num_splits, us=None, GBps=None, timing=None, error=None)
    label = name if num_splits is None else f"{name} n={num_splits}"
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = make_call(0)()
            timer.sync()
    except Exception as e:  # noqa: BLE001  (a peer without a kernel for this case, an fattn error)
        row["error"] = short_error(e, caught)
    else:
        if ref is not None:
            res = check(to_ref_layout(out) if to_ref_layout else out, ref)
            row["max_abs_err"], row["rel_l2_err"] = res.get("max_abs_err"), res.get("rel_l2_err")
            if not res["ok"]:
                row["error"] = res["why"]
                row["wrong"] = True
        del out
    if row["error"] is None:
        calls = [make_call(i % n_copies) for i in range(n_calls)]
        try:
            ms, how = timer.ms_per_call(calls)
            row.update(us=ms * 1e3, GBps=base["bytes"] / (ms * 1e-3) / 1e9, timing=how)
        except Exception as e:  # noqa: BLE001
            row["error"] = "timing failed: " + short_error(e)
        del calls
    rows.append(row)
    fatal = is_fatal_cuda(timer.device) if row["error"] else None
    if fatal:
        raise RuntimeError(f"CUDA context broken after {label}: {fatal}")
    if row["error"]:
        loud = "!!! " if (is_fattn or row.get("wrong")) else ""
        print(f"  {loud}{label:<18} {row['error'][:400]}", flush=True)
    else:
        err = f"  err {row['max_abs_err']:.1e} / rel {row['rel_l2_err']:.1e}" if "max_abs_err" in row else ""
        print(f"  {label:<18} {row['us']:10.2f} us {row['GBps']:9.1f} GB/s  [{row['timing']}]{err}", flush=True)
    return row


def run_case(args, plan, timer, device, decode, decode_error, case_rows, fails):
    """Appends the case's rows to case_rows as they are measured (kept if the case fails midway)."""
    b, ctx = plan["batch"], plan["context"]
    base = {"batch": b, "context": ctx, "bytes": plan["bytes"], "copies": plan["copies"], "calls": plan["calls"]}
    print(f"\n[batch {b}, context {fmt_size(ctx)}] K+V {plan['bytes'] / 1e6:.1f} MB, {plan['copies']} "
          f"cop{'y' if plan['copies'] == 1 else 'ies'}, {plan['calls']} calls per timed unit", flush=True)
    data = CaseData(b, ctx, plan["copies"], args.page_size, device, paged=decode is not None)
    ref = reference(data.q[0], data.kv[0], ctx)
    n, c = plan["copies"], plan["calls"]

    # The ceiling: one full reduction over each copy's K+V bytes (same rotation).
    ceil_rows = []
    for method, fn in (("sum_fp32", lambda t: torch.sum(t, dtype=torch.float32)),
                       ("amax", lambda t: torch.amax(t.view(-1)))):
        ceil_rows.append(measure([], timer, base, f"ceiling:{method}",
                                 lambda i, fn=fn: (lambda t=data.kv[i]: fn(t)), None, n, c))
    good = [r for r in ceil_rows if r["GBps"]]
    best = max(good, key=lambda r: r["GBps"]) if good else ceil_rows[0]
    ceiling = dict(best, impl="ceiling", method=best["impl"].split(":", 1)[1],
                   variants={r["impl"].split(":", 1)[1]: r["GBps"] for r in ceil_rows})
    if not good:
        ceiling["error"] = "; ".join(str(r["error"]) for r in ceil_rows)
    case_rows.append(ceiling)

    if not args.no_peers:
        for name, backend in sdpa_backends().items():
            if backend is None:
                case_rows.append(dict(base, impl=name, num_splits=None, us=None, GBps=None, timing=None,
                                      error="this torch has no torch.nn.attention.sdpa_kernel / SDPBackend"))
                print(f"  {name:<18} {case_rows[-1]['error']}")
                continue
            measure(case_rows, timer, base, name,
                    lambda i, backend=backend: sdpa_call(backend, data.q[i], data.kv[i]), ref, n, c,
                    to_ref_layout=lambda o: o.transpose(1, 2))  # [b, heads, 1, d] -> [b, 1, heads, d]

    for n_splits in args.splits:
        for name in ("fattn", "fattn_paged"):
            if decode is None:
                case_rows.append(dict(base, impl=name, num_splits=n_splits, us=None, GBps=None, timing=None,
                                      error=decode_error))
                continue
            if name == "fattn":
                def make(i, n_splits=n_splits):
                    q, kc, vc, sl = data.q[i], data.kv[i][0], data.kv[i][1], data.seqlens
                    return lambda: decode(q, kc, vc, sl, None, n_splits)
            else:
                def make(i, n_splits=n_splits):
                    q, kc, vc = data.q[i], data.pool[i][0], data.pool[i][1]
                    table, sl = data.block_table[i], data.seqlens
                    return lambda: decode(q, kc, vc, sl, table, n_splits)
            row = measure(case_rows, timer, base, name, make, ref, n, c, num_splits=n_splits, is_fattn=True)
            if row["error"]:
                fails.append(f"b{b} ctx {fmt_size(ctx)} {name} n={n_splits}: {row['error'][:300]}")
    if decode is None:
        print(f"  !!! fattn: {decode_error}")
    if device == "cuda":
        print(f"  peak GPU memory {torch.cuda.max_memory_allocated() / 1e9:.2f} GB", flush=True)
    del data, ref


def finish_rows(case_rows):
    """frac_ceiling on every row."""
    ceil = next((r["GBps"] for r in case_rows if r["impl"] == "ceiling"), None)
    for r in case_rows:
        r["frac_ceiling"] = (r["GBps"] / ceil) if (r.get("GBps") and ceil) else None
    return case_rows


# ----------------------------------------------------------------------------- summary

def summarize(rows, cases) -> list[dict]:
    """One entry per case: the best fattn over the num_splits sweep and fattn's ratios."""
    out = []
    for b, ctx in cases:
        sel = [r for r in rows if r["batch"] == b and r["context"] == ctx]
        if not sel:
            continue
        get = lambda impl: next((r.get("GBps") for r in sel if r["impl"] == impl), None)  # noqa: E731

        def best(impl):
            cand = [r for r in sel if r["impl"] == impl and r.get("GBps")]
            return max(cand, key=lambda r: r["GBps"]) if cand else None
        f, p = best("fattn"), best("fattn_paged")
        s = {"batch": b, "context": ctx, "bytes": sel[0]["bytes"], "ceiling_GBps": get("ceiling"),
             "sdpa_flash_GBps": get("sdpa_flash"), "sdpa_cudnn_GBps": get("sdpa_cudnn"),
             "fattn_GBps": f and f["GBps"], "fattn_us": f and f["us"], "fattn_num_splits": f and f["num_splits"],
             "fattn_paged_GBps": p and p["GBps"], "fattn_paged_num_splits": p and p["num_splits"]}
        ratio = lambda a, c: (a / c) if (a and c) else None  # noqa: E731
        s["fattn_frac_ceiling"] = ratio(s["fattn_GBps"], s["ceiling_GBps"])
        s["fattn_over_cudnn"] = ratio(s["fattn_GBps"], s["sdpa_cudnn_GBps"])
        s["fattn_over_flash"] = ratio(s["fattn_GBps"], s["sdpa_flash_GBps"])
        s["paged_over_contiguous"] = ratio(s["fattn_paged_GBps"], s["fattn_GBps"])
        s["skipped"] = next((r["error"] for r in sel if r["impl"] == "skipped"), None)
        s["failed"] = next((r["error"] for r in sel if r["impl"] == "case_failed"), None)
        out.append(s)
    return out


def print_tables(summary, rows, splits):
    cell = lambda x, w=8, f=".0f": f"{x:{w}{f}}" if x else f"{'-':>{w}}"  # noqa: E731
    print("\nGB/s of K+V read (bf16, 32 q heads / 8 kv heads, d128, one query token); fattn = best num_splits")
    print(f"{'batch':>5} {'context':>7} {'K+V MB':>8} | {'ceiling':>8} {'fattn':>8} {'paged':>8} "
          f"{'flash':>8} {'cudnn':>8} | {'fattn us':>8} {'n':>3} | {'f/ceil':>6} {'f/cudnn':>7} "
          f"{'f/flash':>7} {'pg/cont':>7}")
    for s in summary:
        if s["skipped"]:
            print(f"{s['batch']:>5} {fmt_size(s['context']):>7} {s['bytes'] / 1e6:8.1f} | skipped: {s['skipped']}")
            continue
        n = s["fattn_num_splits"]
        print(f"{s['batch']:>5} {fmt_size(s['context']):>7} {s['bytes'] / 1e6:8.1f} | "
              f"{cell(s['ceiling_GBps'])} {cell(s['fattn_GBps'])} {cell(s['fattn_paged_GBps'])} "
              f"{cell(s['sdpa_flash_GBps'])} {cell(s['sdpa_cudnn_GBps'])} | {cell(s['fattn_us'], 8, '.1f')} "
              f"{n if n is not None else '-':>3} | {cell(s['fattn_frac_ceiling'], 6, '.2f')} "
              f"{cell(s['fattn_over_cudnn'], 7, '.2f')} {cell(s['fattn_over_flash'], 7, '.2f')} "
              f"{cell(s['paged_over_contiguous'], 7, '.2f')}")
        if s["failed"]:
            print(f"{'':>5} {'':>7} {'':>8} | !!! {s['failed'][:200]}")
    if len(splits) > 1:
        print("\nfattn num_splits sweep, GB/s (contiguous / paged)")
        print(f"{'batch':>5} {'context':>7} | " + " ".join(f"{'n=' + str(n):>15}" for n in splits))
        for s in summary:
            if s["skipped"]:
                continue
            sel = [r for r in rows if r["batch"] == s["batch"] and r["context"] == s["context"]]
            pick = lambda impl, n: next((r.get("GBps") for r in sel  # noqa: E731
                                         if r["impl"] == impl and r.get("num_splits") == n), None)
            print(f"{s['batch']:>5} {fmt_size(s['context']):>7} | " + " ".join(
                f"{cell(pick('fattn', n), 7)}/{cell(pick('fattn_paged', n), 7)}" for n in splits))
    errs = {(r["impl"], r["error"][:160]) for r in rows if r.get("error") and r["impl"] in PEERS}
    for impl, err in sorted(errs):
        print(f"note: {impl}: {err}")


# ----------------------------------------------------------------------------- main

def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    device = "cpu" if args.cpu_selftest else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_decode needs a CUDA GPU (try --dry-run or --cpu-selftest)")
    t_start = time.time()
    torch.manual_seed(args.seed)
    decode, decode_error, decode_note = resolve_fattn(args.cpu_selftest)
    try:
        env = environment()
    except Exception as e:  # noqa: BLE001  (fattn missing or broken: still record the rest)
        env = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
               "cuda": torch.version.cuda, "environment_error": short_error(e)}
    env["decode_impl"] = decode_note
    try:
        env["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        env["cudnn"] = None
    rows, fails = [], []
    payload = {"benchmark": "decode", "environment": env, "setting": setting(args), "rows": rows, "summary": []}
    if decode is None:
        print(f"!!! fattn decode unavailable: {decode_error}\n    (timing the peers and the ceiling only)", flush=True)
    else:
        print(f"fattn decode: {decode_note}", flush=True)
    print(f"device {env.get('device')}, torch {torch.__version__}; "
          f"{'CUDA graphs of' if args.graph else 'eager lists of'} >= {args.calls} calls, median of {args.reps}")
    timer = Timer(args, device)
    fatal = None
    for b, ctx in args.cases:
        plan = plan_case(b, ctx, args)
        skip = None
        if args.budget_s and time.time() - t_start > args.budget_s:
            skip = f"time budget ({args.budget_s:.0f} s) spent"
        elif plan["mem_bytes"] > args.max_gb * 1e9:
            skip = f"needs {plan['mem_bytes'] / 1e9:.1f} GB > --max-gb {args.max_gb}"
        elif device == "cuda":
            free = torch.cuda.mem_get_info()[0]
            if plan["mem_bytes"] > 0.9 * free:
                skip = f"needs {plan['mem_bytes'] / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
        if skip:
            print(f"\n[batch {b}, context {fmt_size(ctx)}] skipped: {skip}", flush=True)
            rows.append({"impl": "skipped", "batch": b, "context": ctx, "bytes": plan["bytes"], "error": skip})
        else:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            case_rows = []
            try:
                run_case(args, plan, timer, device, decode, decode_error, case_rows, fails)
            except Exception as e:  # noqa: BLE001  (out of memory, a broken context, a bug)
                traceback.print_exc()
                msg = short_error(e)
                fatal = is_fatal_cuda(device) or (msg if "CUDA context broken" in msg else None)
                case_rows.append({"impl": "case_failed", "batch": b, "context": ctx, "bytes": plan["bytes"],
                                  "error": f"case failed: {msg}"})
                fails.append(f"b{b} ctx {fmt_size(ctx)}: case failed: {msg[:300]}")
            rows.extend(finish_rows(case_rows))
            del case_rows
            gc.collect()
            if device == "cuda" and not fatal:
                torch.cuda.empty_cache()
        payload["summary"] = summarize(rows, args.cases)
        payload["elapsed_s"] = round(time.time() - t_start, 1)
        write_json(args.out, payload)  # after every case: a cut-off run keeps what it measured
        if fatal:
            print(f"\n!!! stopping: the CUDA context is unusable ({fatal[:300]})", flush=True)
            break
    print_tables(payload["summary"], rows, args.splits)
    print(f"\nwrote {args.out} ({time.time() - t_start:.0f} s)")
    if decode is None:
        fails.insert(0, f"fattn decode unavailable: {decode_error}")
    if fails:
        print("\n!!! fattn failures:", *fails, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
