"""One Hopper kernel as another git revision has it against the working tree's, both through
Triton's JIT on the same inputs, interleaved: how a change to a Gluon kernel is measured before it
is adopted (the `jit_ab*.log` files under benchmarks/results/, docs/notes/tuning.md T16-T19).

    python benchmarks/revision_ab.py --base e5229f5 --kernel dkdv --head-dims 64 --accumulate-dq
    python benchmarks/revision_ab.py --base HEAD --kernel dq --head-dims 128 --softcap 30
    python benchmarks/revision_ab.py --base HEAD~2 --kernel forward --head-dims 128 --programs 4

The base revision's triton_src and its launcher, tuning/launch.py, are taken out of git (`git
archive`), or out of a tar file that `git archive --format=tar REV triton_src tuning/launch.py`
wrote (`--base base.tar`, for a copy of the tree without its history), into a temporary package,
triton_src_base, imported beside the working tree's triton_src; each side launches its own kernel
through its own launcher (a revision from before the launcher left triton_src has it there, as
triton_src/python_launch.py, which is taken instead), so the base must be a revision whose launch
helpers take the calls below (`spec=`, `accumulate_dq=`, `programs=`).

Kernels: forward (attn_fwd_sm90; --programs per (head, batch), default the op's model),
dkdv (attn_bwd_dkdv_sm90; --accumulate-dq for deterministic=False's form), dq (attn_bwd_dq_sm90),
with the tiles the working tree's grid builds for the bucket and score modification (--softcap
and --alibi take the softcap_alibi variants, triton_src/variants.py; a head dim or flag it builds none for is refused
before anything runs). Shapes: bf16, hidden 2048, 16k tokens (batch = 16384 / seqlen), --group
query heads per KV head, each seqlen causal and not; lse and delta from the plain forward (both
sides get the same, so the comparison holds whatever the variant). Each row: TFLOP/s of both
(products counted: forward 2, dK/dV 4 or 5 with dQ, dQ 3), the speedup (base time / tree time),
and per output whether it is bitwise equal and the largest absolute difference. dQ accumulated
by bulk reductions (--accumulate-dq) adds in an order that varies between runs, so it need not
be bitwise equal even against itself. The two alternate --pairs times, each sample the median
of 10 calls, the figure the median over the samples; rows are written to --out as they come.
Needs a Hopper GPU (the kernels are sm_90a code).
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import triton_src  # noqa: E402
import tuning.launch  # noqa: E402
from aot_build import grid  # noqa: E402
from triton_src.variants import score_mod_name, score_mod_value  # noqa: E402
from common import alibi_slopes, int_list, interleaved_ms, write_ab_rows  # noqa: E402
from tuning.tune import Problem  # noqa: E402

PACKAGE = "triton_src_base"
LAUNCHER = "tuning/launch.py"
# Where a revision from before tuning/ has its launcher: inside the kernels' package.
OLD_LAUNCHER_MODULE = "python_launch"
# Products of each kernel in units of the forward's two (QK^T and PV).
WORK = {"forward": 1.0, "dkdv": 2.0, "dkdv_dq": 2.5, "dq": 1.5}
# Each kernel's family in the grid, its Hopper implementation, and the outputs its launch helper returns.
FAMILY = {"forward": "attn_fwd", "dkdv": "attn_bwd_dkdv", "dq": "attn_bwd_dq"}
IMPLEMENTATION = {"forward": "attn_fwd_sm90", "dkdv": "attn_bwd_dkdv_sm90", "dq": "attn_bwd_dq_sm90"}
OUTPUTS = {"forward": ("out", "lse"), "dkdv": ("dk", "dv"), "dkdv_dq": ("dk", "dv", "dq"), "dq": ("dq",)}


@dataclass(frozen=True)
class Side:
    """One side of the comparison: its kernels (a triton_src package) and the launcher that launches them."""

    kernels: ModuleType
    launch: ModuleType


def revision_tar(rev: str) -> bytes:
    """triton_src and the launcher of `rev` as a tar: the file `rev` names if it is one, else `git
    archive`'s (triton_src alone for a revision from before tuning/, whose launcher is inside it)."""
    if rev.endswith(".tar") and Path(rev).is_file():
        return Path(rev).read_bytes()
    for paths in (["triton_src", LAUNCHER], ["triton_src"]):
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, *paths],
                                 capture_output=True, check=False)
        if archive.returncode == 0:
            return archive.stdout
    raise SystemExit(f"revision_ab: git archive {rev} triton_src failed: {archive.stderr.decode().strip()}")


def load_revision(rev: str, directory: Path) -> Side:
    """triton_src as git revision `rev` (or the tar file `rev`) has it, imported from `directory` as
    the package triton_src_base (its modules import each other relatively, so the copy is
    self-contained), with that revision's launcher: tuning/launch.py, put into the package with
    its triton_src imports naming the copy, or the copy's own python_launch.py before tuning/."""
    launcher = None
    with tarfile.open(fileobj=io.BytesIO(revision_tar(rev))) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            source = tar.extractfile(member).read()
            if member.name == LAUNCHER:
                launcher = "_tuning_launch"
                target = directory / PACKAGE / f"{launcher}.py"
                source = re.sub(rb"\btriton_src\b", PACKAGE.encode(), source)
            elif Path(member.name).parts[0] == "triton_src":
                target = directory / PACKAGE / Path(member.name).relative_to("triton_src")
            else:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source)
    launcher = launcher or OLD_LAUNCHER_MODULE
    if not (directory / PACKAGE / f"{launcher}.py").is_file():
        raise SystemExit(f"revision_ab: {rev} holds neither {LAUNCHER} nor triton_src/{OLD_LAUNCHER_MODULE}.py "
                         f"(a tar needs both: git archive --format=tar REV triton_src {LAUNCHER})")
    sys.path.insert(0, str(directory))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    return Side(importlib.import_module(PACKAGE), importlib.import_module(f"{PACKAGE}.{launcher}"))


def op_programs(tiles: int, pairs: int, heavy_first: bool, sms: int) -> int:
    """The op's programs per (head, batch) for the looping forward
    (csrc/attention/query_tile_programs.cpp, written again here for the JIT launch, which may run
    without a built library; tests/test_library.py checks it against the library's)."""
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


def grid_tiles(kernel: str, head_dim: int, score_mod: int, accumulate_dq: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the Hopper implementation the working tree's
    grid builds for the kernel, bucket and flags; SystemExit naming what is missing."""
    for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": str(head_dim)}):
        c = v.constant_dict
        if (v.kernel == FAMILY[kernel] and v.implementation == IMPLEMENTATION[kernel]
                and c["BLOCK_D"] == head_dim and c["SCORE_MOD"] == score_mod
                and (kernel != "dkdv" or c["ACCUMULATE_DQ"] == accumulate_dq)):
            return c["BLOCK_M"], c["BLOCK_N"], v.num_warps, v.num_stages
    raise SystemExit(f"revision_ab: the grid builds {IMPLEMENTATION[kernel]} for no {head_dim} bucket with "
                     f"SCORE_MOD {score_mod_name(score_mod)}" + (f" and ACCUMULATE_DQ {accumulate_dq}" if kernel == "dkdv" else ""))


def kernel_call(side, kernel: str, p, tiles, causal: bool, softcap: float, accumulate_dq: bool,
                programs: int | None, alibi: torch.Tensor | None = None):
    """A callable launching `kernel` as `side` (the working tree's or the base revision's) has it. The
    spec and launch helper are looked up here, so a side without them fails before anything runs."""
    launch, kernels = side.launch, side.kernels
    variant = launch.Variant(causal=causal, softcap=softcap, alibi=alibi)
    tiles = launch.Tiles(*tiles)
    if kernel == "forward":
        spec, forward = kernels.forward_sm90.ATTN_FWD_SM90, launch.forward
        return lambda: forward(p.q, p.k, p.v, tiles, variant, spec=spec, programs=programs)
    grads = (p.q, p.k, p.v, p.dout, p.lse, p.delta)
    if kernel == "dkdv":
        spec, backward_dkdv = kernels.backward_sm90.ATTN_BWD_DKDV_SM90, launch.backward_dkdv
        return lambda: backward_dkdv(*grads, tiles, variant, spec=spec, accumulate_dq=accumulate_dq)
    spec, backward_dq = kernels.backward_dq_sm90.ATTN_BWD_DQ_SM90, launch.backward_dq
    return lambda: backward_dq(*grads, tiles, variant, spec=spec)


def compare(a, b, names) -> dict:
    """Per output of two calls (named by `names`): bitwise equal, and the largest absolute
    difference (inf where one side has a NaN the other has not)."""
    a, b = (x if isinstance(x, tuple) else (x,) for x in (a, b))
    result = {}
    for name, x, y in zip(names, a, b, strict=True):
        result[f"{name}_equal"] = torch.equal(x, y)
        result[f"{name}_max_abs_diff"] = (x.float() - y.float()).abs().nan_to_num(float("inf")).max().item()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against (default HEAD), "
                        "or a tar of its triton_src and tuning/launch.py from `git archive` (a name ending in .tar)")
    parser.add_argument("--kernel", choices=("forward", "dkdv", "dq"), default="dkdv")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seqlens", default="1024,4096,16384")
    parser.add_argument("--group", type=int, default=1, help="query heads per KV head")
    parser.add_argument("--softcap", type=float, default=0.0, help="> 0: the softcap_alibi variants")
    parser.add_argument("--alibi", action="store_true", help="ALiBi's slopes (the softcap_alibi variants)")
    parser.add_argument("--accumulate-dq", action="store_true", help="dkdv: deterministic=False's form")
    parser.add_argument("--programs", type=int, default=None, help="forward: programs per (head, batch)")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    head_dims = int_list(args.head_dims)
    if args.group < 1 or any((2048 // d) % args.group for d in head_dims):
        parser.error(f"--group {args.group} must divide every head dim's head count (2048 / head dim)")
    if args.accumulate_dq and args.kernel != "dkdv":
        parser.error("--accumulate-dq is dkdv's")
    if args.programs is not None and args.kernel != "forward":
        parser.error("--programs is the forward's")
    score_mod = score_mod_value("softcap_alibi" if args.softcap > 0 or args.alibi else "plain")
    tiles = {d: grid_tiles(args.kernel, d, score_mod, args.accumulate_dq) for d in head_dims}
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        parser.error("times sm_90 kernels: needs a Hopper GPU")
    # The Gluon kernels build their TMA descriptors in global scratch, which the JIT launch allocates.
    tuning.launch.use_torch_scratch()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kind = "dkdv_dq" if args.kernel == "dkdv" and args.accumulate_dq else args.kernel
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        base, tree = load_revision(args.base, Path(directory)), Side(triton_src, tuning.launch)
        for d in head_dims:
            heads = 2048 // d
            slopes = alibi_slopes(heads, "cuda") if args.alibi else None
            for seqlen in int_list(args.seqlens):
                for causal in (False, True):
                    p = Problem(16384 // seqlen, seqlen, heads, heads // args.group, d, causal)
                    if args.kernel != "forward":
                        p.prepare_backward()
                    flags = {}
                    if args.kernel == "forward":
                        flags["programs"] = args.programs or op_programs(-(-seqlen // tiles[d][0]),
                                                                         p.q.shape[0] * heads, causal, sms)
                    if args.kernel == "dkdv":
                        flags["accumulate_dq"] = args.accumulate_dq
                    calls = {name: kernel_call(side, args.kernel, p, tiles[d], causal, args.softcap,
                                               args.accumulate_dq, flags.get("programs"), slopes)
                             for name, side in (("base", base), ("tree", tree))}
                    outputs = compare(calls["base"](), calls["tree"](), OUTPUTS[kind])
                    ms = interleaved_ms(calls, args.pairs)
                    row = {"kernel": args.kernel, "head_dim": d, "seqlen": seqlen, "causal": causal,
                           "group": args.group, "softcap": args.softcap, "alibi": args.alibi, **flags, **outputs,
                           **{f"{name}_tflops": round(WORK[kind] * p.flops / t / 1e9, 1) for name, t in ms.items()},
                           "speedup": round(ms["base"] / ms["tree"], 3)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                    if args.out:
                        write_ab_rows(args.out, rows)  # after every row: a cut-off run keeps what it measured
                    del p, calls
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
