"""python -m tuning.tune [--head-dims 64,128] [--kernels attn_fwd,attn_bwd_dkdv,attn_bwd_dq] [--out FILE]
python -m tuning.tune --device cpu --out sm0.json   # Triton's interpreter, tiny shapes: a smoke run

The offline tuner, run on a GPU machine with Triton: for each kernel and head-dim bucket it
compiles every candidate tile config (BLOCK_M, BLOCK_N, num_warps, num_stages) of the very
triton_src kernel the build compiles (Triton's JIT, bf16), rejects the configs that fail the
accuracy rule, times the rest on the benchmark's shapes and keeps the fastest. The config the
grid holds now is always among the candidates. One compiled
variant serves causal and non-causal calls of every length, so a config's score is the
geometric mean of its throughput over all of them.

Accuracy rule (the GPU tests' rule): on a check problem with ragged lengths and GQA, every
output (out; dk and dv; dq) is within 2x the error of PyTorch's own bf16 computation against
float64, causal and not; and the timed shapes' outputs are finite.

Where the grid builds a bucket's forward both ways (attn_fwd and its looping implementation), the
length that picks between them is tuned by tuning/tune_tile_loop.py, into the same file.

The result goes to aot_build/tuned/sm<arch>.json (merged into an existing file of that arch):
the chosen config of each (kernel, bucket) with every candidate's measurements beside it.
aot_build reads the chosen configs in place of configs.json's (aot_build/grid.py), so a
(kernel, arch, bucket) tile lives in exactly one of the two files.

It tunes each family's own triton_src function. Where configs.json's "implementations" build
another function in its place (the Gluon Hopper forward, dK/dV and dQ, whose tiles their structure
fixes), the tuned tile serves the variants left to the family: on sm_90 the bias and dropout
variants (bias_dropout, triton_src/variants.py), the 32 bucket, and those the implementations' entries leave out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

from aot_build.grid import TUNED_DIR

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# (BLOCK_M, BLOCK_N, num_warps, num_stages) candidates per kernel, the sm90 neighbourhood of
# the tiles that won earlier searches.
CANDIDATES = {
    "attn_fwd": [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4),
                 (64, 64, 4, 3), (64, 128, 4, 3), (128, 32, 4, 3)],
    "attn_bwd_dkdv": [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
                      (64, 128, 4, 2), (32, 128, 8, 3), (32, 64, 4, 3), (32, 64, 4, 4), (16, 128, 4, 3),
                      (32, 128, 4, 4), (64, 64, 4, 2), (32, 128, 4, 2), (64, 64, 8, 3)],
    "attn_bwd_dq": [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2),
                    (64, 128, 4, 2), (128, 64, 4, 2)],
}
# Head dim 256 holds a [BLOCK, 256] float32 accumulator per output (two in dK/dV) and a 256-wide
# operand per tile in shared memory: its neighbourhood is narrower tiles, fewer stages, 8 warps.
BUCKET_CANDIDATES = {
    256: {
        "attn_fwd": [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 1),
                     (64, 32, 4, 3), (128, 128, 8, 1)],
        "attn_bwd_dkdv": [(32, 64, 8, 1), (16, 64, 4, 2), (32, 64, 8, 2), (32, 64, 4, 2), (16, 128, 8, 2),
                          (32, 128, 8, 1), (64, 64, 8, 1), (32, 32, 4, 3), (32, 32, 4, 2), (32, 32, 8, 3),
                          (16, 32, 4, 3), (32, 32, 4, 4), (64, 32, 4, 2), (64, 32, 8, 2), (32, 32, 2, 3),
                          (64, 32, 4, 3), (128, 32, 4, 2), (64, 16, 4, 2), (64, 32, 4, 1), (128, 32, 8, 2),
                          (128, 16, 4, 2)],
        "attn_bwd_dq": [(64, 64, 8, 1), (64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2), (32, 64, 4, 2),
                        (128, 64, 8, 1), (64, 32, 8, 3), (128, 32, 8, 3), (128, 32, 4, 2), (64, 32, 4, 3),
                        (128, 64, 8, 2)],
    },
}
# Matmul work of each kernel in units of the forward's 4 * b * h * s^2 * d (halved when causal):
# the forward does QK^T and PV; dK/dV recomputes QK^T and dO V^T and adds P^T dO and dS^T Q; dQ
# recomputes QK^T and dO V^T and adds dS K.
WORK = {"attn_fwd": 1.0, "attn_bwd_dkdv": 2.0, "attn_bwd_dq": 1.5}


def _time_ms(fn, reps: int) -> float:
    """Median ms of `reps` calls after one untimed call: benchmarks/common.py's timer, the one
    every benchmark and tuner shares (CUDA events on a GPU, the wall clock under the interpreter)."""
    import torch

    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    from common import time_ms

    return time_ms(fn, warmup=1, reps=reps, device="cuda" if torch.cuda.is_available() else "cpu")


def graph_replay(fn):
    """fn captured in a CUDA graph (run once outside it first, so that Triton compiles), as a
    callable that replays it: a JIT launch timed without its host time."""
    import torch

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Problem:
    """q, k, v, a random upstream gradient, and what each kernel needs besides its tiles (the
    forward's lse and delta, computed in float32)."""

    def __init__(self, batch, seqlen, heads, kv_heads, head_dim, causal, seed=0):
        import torch

        # bf16 on the GPU; float32 under the interpreter (numpy has no bf16).
        device, self.dtype = ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)
        g = torch.Generator(device=device).manual_seed(seed)
        shape = (batch, seqlen, heads, head_dim)
        kv_shape = (batch, seqlen, kv_heads, head_dim)
        self.causal = causal
        self.q, self.dout = (torch.randn(shape, device=device, dtype=self.dtype, generator=g) for _ in range(2))
        self.k, self.v = (torch.randn(kv_shape, device=device, dtype=self.dtype, generator=g) for _ in range(2))
        self.flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)

    def prepare_backward(self):
        from tuning.launch import Tiles, Variant, forward

        out, self.lse = forward(self.q, self.k, self.v, Tiles(64, 64, 4, 2), Variant(causal=self.causal))
        self.delta = (out.float() * self.dout.float()).sum(-1).transpose(1, 2).contiguous()

    def run(self, kernel, cfg):
        """The kernel's outputs with tiles `cfg`: (out,), (dk, dv) or (dq,)."""
        from tuning.launch import Tiles, Variant, backward_dkdv, backward_dq, forward

        tiles, variant = Tiles(*cfg), Variant(causal=self.causal)
        if kernel == "attn_fwd":
            return forward(self.q, self.k, self.v, tiles, variant)[:1]
        args = (self.q, self.k, self.v, self.dout, self.lse, self.delta, tiles, variant)
        return backward_dkdv(*args) if kernel == "attn_bwd_dkdv" else (backward_dq(*args),)

    def references(self, dtype):
        """(out, dq, dk, dv) of SDPA's math path in `dtype` (GQA expanded)."""
        import torch
        import torch.nn.functional as F

        group = self.q.shape[2] // self.k.shape[2]
        leaves = [t.to(dtype).requires_grad_() for t in (self.q, self.k, self.v)]
        q, k, v = (t.transpose(1, 2) for t in leaves)
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal).transpose(1, 2)
        grads = torch.autograd.grad(out, leaves, self.dout.to(dtype))
        return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2]}


OUTPUTS = {"attn_fwd": ("out",), "attn_bwd_dkdv": ("dk", "dv"), "attn_bwd_dq": ("dq",)}


def _max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def accuracy_checks(head_dim, batch=2, seqlen=1000):
    """Per causal flag: the check problem and, per output, the error bound (2x PyTorch's own in
    the problem's dtype)."""
    import torch

    checks = []
    for causal in (False, True):
        p = Problem(batch, seqlen, 4, 2, head_dim, causal, seed=1)
        p.prepare_backward()
        exact, same_precision = p.references(torch.float64), p.references(p.dtype)
        # The floor only matters for float32 under the interpreter, where both errors are ~1e-6.
        bounds = {name: max(2 * _max_err(same_precision[name], exact[name]), 1e-5) for name in exact}
        checks.append((p, exact, bounds))
    return checks


def evaluate(kernel, cfg, checks, timed, reps):
    """One candidate: its accuracy on every check, then (if it passed) its time on every timed problem."""
    import torch

    row = {"config": dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), cfg))}
    try:
        for p, exact, bounds in checks:
            for name, got in zip(OUTPUTS[kernel], p.run(kernel, cfg)):
                err = _max_err(got, exact[name])
                if not err <= bounds[name]:
                    row["rejected"] = (f"{name} error {err:.3g} > {bounds[name]:.3g} (2x torch's) "
                                       f"{'causal' if p.causal else 'non-causal'}")
                    return row
        cases = []
        for name, p in timed:
            outputs = p.run(kernel, cfg)
            if not all(torch.isfinite(t).all() for t in outputs):
                row["rejected"] = f"non-finite output on {name}"
                return row
            ms = _time_ms(lambda: p.run(kernel, cfg), reps)
            cases.append({"case": name, "ms": round(ms, 4), "tflops": WORK[kernel] * p.flops / ms / 1e9})
        score = math.exp(sum(math.log(c["tflops"]) for c in cases) / len(cases))
        row["cases"] = [dict(c, tflops=round(c["tflops"], 1)) for c in cases]
        row["score_tflops"] = round(score, 1) if score >= 1 else score
    except Exception as e:  # noqa: BLE001  a config that does not compile or fit is a rejected candidate
        row["rejected"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


def current_config(kernel, arch, bucket):
    """The (BLOCK_M, BLOCK_N, num_warps, num_stages) the grid builds today, or None."""
    from aot_build import grid

    try:
        tile = grid.tile_config(kernel, grid.load_config(), arch, bucket)
    except (grid.GridError, KeyError):
        return None
    return tile["BLOCK_M"], tile["BLOCK_N"], tile["num_warps"], tile["num_stages"]


def tune(kernels, head_dims, seqlens, tokens, hidden, reps, arch, candidates=None, check=(2, 1000),
         log=print) -> dict:
    import torch

    found = {}
    for d in head_dims:
        checks = accuracy_checks(d, *check)
        timed = []
        for s in seqlens:
            for causal in (False, True):
                p = Problem(max(1, tokens // s), s, hidden // d, hidden // d, d, causal)
                p.prepare_backward()
                timed.append((f"s{s} {'causal' if causal else 'non-causal'}", p))
        for kernel in kernels:
            rows = []
            current = current_config(kernel, arch, d)
            configs = list((candidates or BUCKET_CANDIDATES.get(d, CANDIDATES))[kernel])
            if current is not None and current not in configs:
                configs.insert(0, current)
            for cfg in configs:
                row = evaluate(kernel, cfg, checks, timed, reps)
                row["grid_had_it"] = cfg == current
                log(f"{kernel} d{d} {cfg}: " + (row.get("rejected") or f"{row['score_tflops']} TFLOP/s"))
                rows.append(row)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            passed = [r for r in rows if "score_tflops" in r]
            if not passed:
                raise RuntimeError(f"tuning.tune: every {kernel} d{d} candidate was rejected")
            best = max(passed, key=lambda r: r["score_tflops"])
            found.setdefault(kernel, {})[str(d)] = {"chosen": best["config"], "score_tflops": best["score_tflops"],
                                                    "candidates": rows}
            log(f"{kernel} d{d}: chose {best['config']} ({best['score_tflops']} TFLOP/s, geometric mean)")
        del checks, timed
    return found


def read_tuned(path: Path, arch: int) -> dict:
    """The tuned file of `arch` at path (a new one if there is none), for a tuner to merge into."""
    data = json.loads(path.read_text()) if path.exists() else {"arch": arch, "kernels": {}}
    if data.get("arch") != arch:
        raise ValueError(f"{path} holds sm{data.get('arch')} configs, not sm{arch}")
    return data


def merge(path: Path, arch: int, found: dict, meta: dict) -> dict:
    data = read_tuned(path, arch)
    data.update({k: v for k, v in meta.items()})
    for kernel, buckets in found.items():
        data["kernels"].setdefault(kernel, {}).update(buckets)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuning.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default=",".join(CANDIDATES))
    parser.add_argument("--head-dims", default="64,128", help="head-dim buckets to tune")
    parser.add_argument("--seqlens", default="4096,16384")
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None, help="default: aot_build/tuned/sm<arch>.json")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: Triton's interpreter on tiny shapes, two candidates each (a smoke run)")
    args = parser.parse_args(argv)

    if args.device == "cpu":  # before triton_src is imported: the kernels then run interpreted
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton

    candidates, check = None, (2, 1000)
    if args.device == "cpu":
        if args.out is None:
            parser.error("--device cpu needs --out (its numbers are no tuning data)")
        arch = 0
        args.head_dims, args.seqlens, args.tokens, args.hidden, args.reps = "16", "64", 64, 32, 1
        candidates, check = {k: [(16, 16, 4, 1), (32, 16, 4, 1)] for k in CANDIDATES}, (1, 37)
    elif not torch.cuda.is_available():
        parser.error("the tuner times kernels: it needs a CUDA GPU (or --device cpu for a smoke run)")
    else:
        major, minor = torch.cuda.get_device_capability()
        arch = 10 * major + minor
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = [k for k in kernels if k not in CANDIDATES]
    if unknown:
        parser.error(f"unknown kernels {unknown}; tunable: {list(CANDIDATES)}")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    seqlens = [int(s) for s in args.seqlens.split(",")]
    found = tune(kernels, head_dims, seqlens, args.tokens, args.hidden, args.reps, arch, candidates, check)
    meta = {"device": torch.cuda.get_device_name() if arch else "cpu (Triton interpreter)",
            "torch": torch.__version__, "triton": triton.__version__,
            "dtype": "bf16" if arch else "float32", "date": datetime.date.today().isoformat(),
            "shapes": {"tokens": args.tokens, "hidden": args.hidden, "seqlens": seqlens, "causal": [False, True]},
            "accuracy": f"every output within 2x of PyTorch's max error in the same dtype against float64 on "
                        f"batch {check[0]}, seqlen {check[1]}, 4 heads over 2 kv heads, causal and not; "
                        f"timed outputs finite"}
    out = args.out or TUNED_DIR / f"sm{arch}.json"
    merge(out, arch, found, meta)
    print(f"tuning.tune: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
