"""One Hopper kernel as another git revision has it against the working tree's, both through
Triton's JIT on the same inputs, interleaved: how a change to a Gluon kernel is measured before it
is adopted (the `jit_ab*.log` files under benchmarks/results/, NOTES.md T16-T19).

    python benchmarks/revision_ab.py --base e5229f5 --kernel dkdv --head-dims 64 --accumulate-dq
    python benchmarks/revision_ab.py --base HEAD --kernel dq --head-dims 128 --softcap 30
    python benchmarks/revision_ab.py --base HEAD~2 --kernel forward --head-dims 128 --programs 4

The base revision's triton_src is taken out of git (`git archive`) into a temporary package,
triton_src_base, imported beside the working tree's triton_src; each side launches its own kernel
through its own triton_src/python_launch.py, so the base must be a revision whose launch helpers
take the calls below (`spec=`, `accumulate_dq=`, `programs=`).

Kernels: forward (attn_fwd_sm90; --programs per (head, batch), default the op's model),
dkdv (attn_bwd_dkdv_sm90; --accumulate-dq for deterministic=False's form), dq (attn_bwd_dq_sm90),
with the tiles the working tree's grid builds for the bucket. Shapes: bf16, hidden 2048, 16k tokens
(batch = 16384 / seqlen), --group query heads per KV head, each seqlen causal and not; lse and
delta from the forward. Each row: TFLOP/s of both (products counted: forward 2, dK/dV 4 or 5 with
dQ, dQ 3), the speedup (base time / tree time), and whether every output is bitwise equal (else
the largest absolute difference). The two alternate --pairs times, each sample the median of 10
calls, the figure the median over the samples. Needs a Hopper GPU (the kernels are sm_90a code).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402

import triton_src  # noqa: E402
import triton_src.python_launch  # noqa: E402,F401  (the tree's side: triton_src.python_launch)
from aot_build.tune import Problem  # noqa: E402
from common import int_list, interleaved_ms, write_ab_rows  # noqa: E402
from hopper_backward_ab import hopper_dq_tiles, hopper_tiles  # noqa: E402
from hopper_forward_ab import _hopper_tiles as forward_tiles  # noqa: E402

PACKAGE = "triton_src_base"
# Products of each kernel in units of the forward's two (QK^T and PV).
WORK = {"forward": 1.0, "dkdv": 2.0, "dkdv_dq": 2.5, "dq": 1.5}


def load_revision(rev: str, directory: Path):
    """triton_src as git revision `rev` has it, imported from `directory` as the package
    triton_src_base (its modules import each other relatively, so the copy is self-contained)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "triton_src"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"revision_ab: git archive {rev} triton_src failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                target = directory / PACKAGE / Path(member.name).relative_to("triton_src")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    sys.path.insert(0, str(directory))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    package = importlib.import_module(PACKAGE)
    importlib.import_module(PACKAGE + ".python_launch")
    return package


def op_programs(tiles: int, pairs: int, heavy_first: bool, sms: int) -> int:
    """The op's programs per (head, batch) for the looping forward
    (csrc/attention/query_tile_programs.cpp, written again here for the JIT launch)."""
    if tiles <= 1 or (heavy_first and tiles <= 4):
        return tiles
    best, best_cost = tiles, 1 << 62
    for g in range(2, tiles + 1):
        waves = -(-pairs * g // sms)
        if waves * 3 >= best_cost:
            break
        cost = waves * (-(-tiles // g) + 2)
        if cost < best_cost:
            best, best_cost = g, cost
    return best


def kernel_call(side, kernel: str, p: Problem, tiles, causal: bool, softcap: float, accumulate_dq: bool,
                programs: int | None):
    """A callable launching `kernel` as `side` (triton_src or the base package) has it."""
    launch = side.python_launch
    variant = launch.Variant(causal=causal, softcap=softcap)
    tiles = launch.Tiles(*tiles)
    grads = (p.q, p.k, p.v, p.dout, p.lse, p.delta)
    if kernel == "forward":
        return lambda: launch.forward(p.q, p.k, p.v, tiles, variant, spec=side.forward_sm90.ATTN_FWD_SM90,
                                      programs=programs)
    if kernel == "dkdv":
        return lambda: launch.backward_dkdv(*grads, tiles, variant, spec=side.backward_sm90.ATTN_BWD_DKDV_SM90,
                                            accumulate_dq=accumulate_dq)
    return lambda: launch.backward_dq(*grads, tiles, variant, spec=side.backward_dq_sm90.ATTN_BWD_DQ_SM90)


def compare(a, b) -> tuple[bool, float]:
    """(every output bitwise equal, largest absolute difference) of two calls' outputs."""
    a, b = (x if isinstance(x, tuple) else (x,) for x in (a, b))
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    diff = max(((x.float() - y.float()).abs().nan_to_num(float("inf")).max().item() for x, y in zip(a, b)),
               default=0.0)
    return same, diff


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against (default HEAD)")
    parser.add_argument("--kernel", choices=("forward", "dkdv", "dq"), default="dkdv")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--group", type=int, default=1, help="query heads per KV head")
    parser.add_argument("--softcap", type=float, default=0.0, help="> 0: the SCORE_MOD 1 variants")
    parser.add_argument("--accumulate-dq", action="store_true", help="dkdv: deterministic=False's form")
    parser.add_argument("--programs", type=int, default=None, help="forward: programs per (head, batch)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("times sm_90 kernels: needs a Hopper GPU")
    # The Gluon kernels build their TMA descriptors in global scratch, which the JIT launch allocates.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    score_mod = int(args.softcap > 0)
    work = WORK["dkdv_dq" if args.kernel == "dkdv" and args.accumulate_dq else args.kernel]
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        base = load_revision(args.base, Path(directory))
        for d in int_list(args.head_dims):
            if args.kernel == "forward":
                tiles = forward_tiles(d, None)
            elif args.kernel == "dkdv":
                tiles = hopper_tiles(d, score_mod, None, accumulate_dq=args.accumulate_dq)
            else:
                tiles = hopper_dq_tiles(d, score_mod)
                if tiles is None:
                    raise SystemExit(f"the grid builds attn_bwd_dq_sm90 for no {d} bucket with SCORE_MOD {score_mod}")
            tiles = (tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages)
            heads = 2048 // d
            for seqlen in int_list(args.seqlens):
                for causal in (False, True):
                    p = Problem(16384 // seqlen, seqlen, heads, heads // args.group, d, causal)
                    p.prepare_backward()
                    programs = args.programs
                    if args.kernel == "forward" and programs is None:
                        programs = op_programs(-(-seqlen // tiles[0]), p.q.shape[0] * heads, causal, sms)
                    calls = {name: kernel_call(side, args.kernel, p, tiles, causal, args.softcap,
                                               args.accumulate_dq, programs)
                             for name, side in (("base", base), ("tree", triton_src))}
                    same, diff = compare(calls["base"](), calls["tree"]())
                    ms = interleaved_ms(calls, args.pairs)
                    row = {"kernel": args.kernel, "head_dim": d, "seqlen": seqlen, "causal": causal,
                           "group": args.group, "softcap": args.softcap, "accumulate_dq": args.accumulate_dq,
                           "programs": programs, "bitwise_equal": same, "max_abs_diff": diff,
                           **{f"{name}_tflops": round(work * p.flops / t / 1e9, 1) for name, t in ms.items()},
                           "speedup": round(ms["base"] / ms["tree"], 3)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    del p, calls
                    torch.cuda.empty_cache()
    if args.out:
        write_ab_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
