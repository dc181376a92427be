"""Chunked prefill: a chunk of query tokens attending (causal, bottom-right) over a long KV cache
that already holds the chunk's own keys, as a serving engine prefills a long prompt piece by piece.

    python benchmarks/bench_chunked_prefill.py --out benchmarks/results/chunked_prefill_h100.json
    python benchmarks/bench_chunked_prefill.py --chunks 512 --contexts 8k,32k
    python benchmarks/bench_chunked_prefill.py --device cpu --quick   # smoke run of every code path

bf16, 32 query heads over 8 KV heads, d128, batch 1. Every implementation computes the same
[chunk, context] attention over the same keys:

  fattn_paged         fattn.flash_attn_with_kvcache over shuffled pages of --page-size tokens
  fattn_cache         the same call over the contiguous cache [1, context, 8, 128]
  fattn_varlen_paged  fattn.flash_attn_varlen_func(..., block_table=) over the pages
  fattn_varlen        fattn.flash_attn_varlen_func over contiguous K/V (the prefill forward kernel)
  sdpa_cudnn          F.scaled_dot_product_attention on the contiguous cache with the
  sdpa_efficient      bottom-right causal mask (CausalBias lower-right for the efficient
                      backend, the same mask as a boolean tensor for cuDNN); a backend that
                      refuses is recorded with its error

TFLOP/s count the visible (query, key) pairs only: 4 * heads * head_dim * pairs. Timing:
common.graph_or_eager_ms: CUDA-graph replays (eager if a capture fails). Every output is first checked
against float64 attention on its last 64 queries of 4 heads; a wrong fattn result is not timed
and makes the exit status 1. The goal this measures: paged within 5 % of contiguous varlen.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (Results, fmt_size, graph_or_eager_ms, int_list, paginate, parse_size,  # noqa: E402
                    print_table, require_device, short_error)

import fattn  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
CHECK_ROWS, CHECK_HEADS = 64, 4
ATOL = 2e-2
IMPLS = ["fattn_paged", "fattn_cache", "fattn_varlen_paged", "fattn_varlen", "sdpa_cudnn", "sdpa_efficient"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", default="512,2048", help="query tokens per chunk, a comma list")
    p.add_argument("--contexts", default="32k", help="keys in the cache (the chunk's included), a comma list")
    p.add_argument("--page-size", type=int, default=256, help="tokens per page (a multiple of 16)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/chunked_prefill.json"))
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--calls", type=int, default=5, help="calls per timed unit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny cases, few reps: a smoke run")
    args = p.parse_args(argv)
    try:
        args.chunk_list = int_list(args.chunks)
        args.context_list = [parse_size(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError as e:
        p.error(str(e))
    if args.quick:
        args.chunk_list, args.context_list, args.reps, args.warmup, args.calls = [40], [300], 2, 1, 1
    if args.page_size <= 0 or args.page_size % 16:
        p.error("--page-size must be a positive multiple of 16")
    if any(c <= 0 for c in args.chunk_list) or any(c < ch for c in args.context_list for ch in args.chunk_list):
        p.error("chunks must be positive and no longer than the contexts")
    return args


def visible_pairs(chunk, context):
    """(query, key) pairs a bottom-right causal chunk sees: query t sees context - chunk + t + 1 keys."""
    return chunk * (context - chunk) + chunk * (chunk + 1) // 2


def reference(q, k, v, context):
    """float64 attention of the chunk's last CHECK_ROWS queries, first CHECK_HEADS heads: [rows, heads, d]."""
    chunk = q.shape[1]
    rows = min(CHECK_ROWS, chunk)
    group = HEADS // KV_HEADS
    qd = q[0, chunk - rows:, :CHECK_HEADS].double()                           # [rows, h, d]
    kd = k[0, :, :CHECK_HEADS // group + 1].double().repeat_interleave(group, 1)[:, :CHECK_HEADS]
    vd = v[0, :, :CHECK_HEADS // group + 1].double().repeat_interleave(group, 1)[:, :CHECK_HEADS]
    scores = torch.einsum("qhd,khd->hqk", qd, kd) / HEAD_DIM ** 0.5
    t = torch.arange(chunk - rows, chunk, device=q.device)[:, None]
    j = torch.arange(context, device=q.device)[None, :]
    scores = scores.masked_fill(j > t + context - chunk, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


def check(out, ref):
    """out [chunk, heads, d] of one sequence: its checked rows against the reference."""
    got = out[-ref.shape[0]:, :CHECK_HEADS].double()
    err = float((got - ref).abs().max())
    return (None if err <= ATOL and bool(torch.isfinite(got).all()) else f"WRONG RESULT: max error {err:.3g}"), err


def calls_for(q, k, v, pool, table, context, device):
    """{impl: a call returning out [chunk, heads, d]}."""
    chunk = q.shape[1]
    seqlens = torch.tensor([context], dtype=torch.int32, device=device)
    cu_q = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, context], dtype=torch.int32, device=device)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    lower_right = causal_lower_right(chunk, context)
    mask = torch.ones(chunk, context, dtype=torch.bool, device=device).tril(context - chunk)

    def sdpa(backend, attn_mask):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, enable_gqa=True)[0].transpose(0, 1)
        return call

    return {
        "fattn_paged": lambda: fattn.flash_attn_with_kvcache(q, pool[0], pool[1], cache_seqlens=seqlens,
                                                             block_table=table, causal=True)[0],
        "fattn_cache": lambda: fattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True)[0],
        "fattn_varlen_paged": lambda: fattn.flash_attn_varlen_func(q[0], pool[0], pool[1], cu_q, cu_k, chunk, context,
                                                                   causal=True, block_table=table),
        "fattn_varlen": lambda: fattn.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, chunk, context,
                                                             causal=True),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, mask),
        "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION, lower_right),
    }


def run_case(args, results, chunk, context):
    dev = args.device
    print(f"\n[chunk {chunk} over a {fmt_size(context)} cache]", flush=True)
    case = {"batch": 1, "chunk": chunk, "context": context, "heads": HEADS, "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "page_size": args.page_size}
    q = torch.randn(1, chunk, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(2, 1, context, KV_HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
    pool, table = paginate(kv, args.page_size)
    ref = reference(q, kv[0], kv[1], context)
    flops = 4 * HEADS * HEAD_DIM * visible_pairs(chunk, context)
    fails = []
    for impl, call in calls_for(q, kv[0], kv[1], pool, table, context, dev).items():
        error, err, ms, how = None, None, None, None
        try:
            error, err = check(call(), ref)
            if error is None:
                ms, how = graph_or_eager_ms([call] * args.calls, warmup=args.warmup, reps=args.reps,
                                            device=args.device)
        except Exception as e:  # noqa: BLE001  (a peer without a kernel for this case, an fattn error)
            error = short_error(e, 800)
        row = results.add(case, impl, ms, error, flops=flops, max_abs_err=err, timing=how)
        if error:
            print(f"  {'!!! ' if impl.startswith('fattn') else ''}{impl:<20} {error[:300]}", flush=True)
            if impl.startswith("fattn"):
                fails.append(f"chunk {chunk} ctx {fmt_size(context)} {impl}: {error[:200]}")
        else:
            print(f"  {impl:<20} {ms * 1e3:10.1f} us {row['tflops']:8.1f} TFLOP/s  [{how}]", flush=True)
    results.compare(case, peers=["fattn_varlen", "fattn_cache", "sdpa_cudnn", "sdpa_efficient"])
    return fails


def print_summary(results, args):
    lines = []
    for chunk in args.chunk_list:
        for context in args.context_list:
            rows = {r["impl"]: r for r in results.case_rows({"chunk": chunk, "context": context})}
            tf = [rows.get(i, {}).get("tflops") for i in IMPLS]
            paged = rows.get("fattn_paged", {}).get("ratio_vs", {})
            lines.append([chunk, fmt_size(context)] + [x and f"{x:.0f}" for x in tf]
                         + [paged.get("fattn_varlen"), paged.get("fattn_cache"), paged.get("sdpa_cudnn")])
    print_table(["chunk", "context"] + IMPLS + ["paged/varlen", "paged/cache", "paged/cudnn"], lines,
                title="\nTFLOP/s of the visible pairs; x/y = time ratio (< 1: fattn_paged is faster)")


def main(argv=None):
    args = parse_args(argv)
    require_device(args.device, "bench_chunked_prefill")
    torch.manual_seed(args.seed)
    start = time.time()
    results = Results.start("chunked_prefill", args, args.device)
    fails = []
    for chunk in args.chunk_list:
        for context in args.context_list:
            fails += run_case(args, results, chunk, context)
            results.write(args.out)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print_summary(results, args)
    print(f"\nwrote {args.out} ({time.time() - start:.0f} s)")
    if fails:
        print("\n!!! fattn failures:", *fails, sep="\n  ")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
