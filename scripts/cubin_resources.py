"""Registers, spills and shared memory of the kernel grid's cubins, read from a kernel cache
(python -m aot_build fills it), per variant; or two caches side by side (two Triton versions,
two trees), to see what a compiler change does to register pressure before a GPU measures it.

Usage:
  python scripts/cubin_resources.py [--cache DIR] [--triton 3.6.0] [--grep TEXT]
  python scripts/cubin_resources.py --cache DIR --triton 3.6.0 --against DIR2 --against-triton 3.9.0 \
      [--against-tree OTHER_CHECKOUT]

The variants are the grid's (aot_build/configs.json, narrowed by FATTN_CUDA_ARCHS and
FATTN_HEAD_DIMS as for the build); an entry is found by its cache key, which holds the Triton
version (--triton, default the installed one) and the triton_src sources of this tree (of
--against-tree for the second cache: a scratch copy with edited kernels). Columns:
regs (the launch's registers per thread: a warp-specialized kernel's setmaxnreg budgets are the
`maxnreg` column, read from the PTX), stack (the stack frame, bytes), st / ld (bytes of local
stores / loads in the SASS, STL and LDL: in these kernels spills, equal to ptxas -v's "bytes
spill stores / loads"), smem (the build's dynamic shared memory) and ptx (the PTX ISA version).
cuobjdump: --cuobjdump, else the one on PATH, else the one Triton bundles (any of 12.8 to 13.1
reads both CUDA 12 and CUDA 13 cubins). docs/notes/tuning.md T31 used it for Triton 3.6 vs 3.9.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aot_build import compiler, grid  # noqa: E402

_WIDTH = {"64": 8, "128": 16, "U8": 1, "S8": 1, "U16": 2, "S16": 2}  # any other: 4 bytes
_LOCAL = re.compile(r"\b(STL|LDL)((?:\.\w+)*)\s")


def find_cuobjdump(given: str | None) -> str:
    if given:
        return given
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def resources(entry: Path, cuobjdump: str) -> dict:
    """One cache entry's figures (see the module's docstring)."""
    cubin = entry / "kernel.cubin"
    usage = subprocess.run([cuobjdump, "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK):(\d+)", usage))
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    spill = {"STL": 0, "LDL": 0}
    for op, suffixes in _LOCAL.findall(sass):
        spill[op] += next((_WIDTH[s] for s in suffixes.split(".") if s in _WIDTH), 4)
    ptx = (entry / "kernel.ptx").read_text()
    version = re.search(r"^\.version (\S+)", ptx, re.M)
    maxnreg = sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
    meta = json.loads((entry / "meta.json").read_text())
    return {"regs": int(fields.get("REG", 0)), "stack": int(fields.get("STACK", 0)), "st": spill["STL"],
            "ld": spill["LDL"], "smem": meta["shared"], "ptx": version.group(1) if version else "?",
            "maxnreg": "/".join(map(str, maxnreg)) or "-"}


def source_digest(tree: Path | None) -> str:
    """compiler._kernel_source_digest of another checkout's triton_src (this tree's when None)."""
    if tree is None:
        return compiler._kernel_source_digest()
    saved = compiler.KERNEL_DIR
    compiler.KERNEL_DIR = Path(tree).resolve() / "triton_src"
    try:
        return compiler._kernel_source_digest()
    finally:
        compiler.KERNEL_DIR = saved


def _cell(r: dict | None) -> str:
    if r is None:
        return f"{'(not in cache)':>52}"
    return f"{r['regs']:>4} {r['stack']:>6} {r['st']:>6} {r['ld']:>6} {r['smem']:>7} {r['maxnreg']:>16} {r['ptx']:>4}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=None, help="kernel cache (default: $FATTN_AOT_CACHE or build/aot_cache)")
    parser.add_argument("--triton", default=None, help="the Triton version the cache was built with (default: the installed)")
    parser.add_argument("--against", type=Path, default=None, help="a second cache, printed beside the first")
    parser.add_argument("--against-triton", default=None, help="its Triton version (default: --triton's)")
    parser.add_argument("--against-tree", type=Path, default=None, help="the checkout whose triton_src built it (default: this one)")
    parser.add_argument("--grep", default="", help="only variants whose label contains this text")
    parser.add_argument("--json", type=Path, default=None, help="also write every row as JSON here")
    parser.add_argument("--cuobjdump", default=None)
    args = parser.parse_args(argv)
    if args.triton is None:
        import triton

        args.triton = triton.__version__
    cache = args.cache or compiler.default_cache_dir()
    tool = find_cuobjdump(args.cuobjdump)
    sides = [(cache, args.triton, source_digest(None))]
    if args.against:
        sides.append((args.against, args.against_triton or args.triton, source_digest(args.against_tree)))
    head = f"{'regs':>4} {'stack':>6} {'st':>6} {'ld':>6} {'smem':>7} {'maxnreg':>16} {'ptx':>4}"
    print(f"{'variant':<100} " + " | ".join(f"{head}" for _ in sides))
    print(f"{'':<100} " + " | ".join(f"{str(c)[-28:] + ' (' + v + ')':>52}" for c, v, _ in sides))
    rows, missing = [], 0
    for variant in grid.expand():
        if args.grep not in variant.label:
            continue
        row = {"label": variant.label}
        for i, (where, version, digest) in enumerate(sides):
            entry = Path(where) / compiler.cache_key(variant, version, digest)
            row[f"side{i}"] = resources(entry, tool) if (entry / "meta.json").exists() else None
            missing += row[f"side{i}"] is None
        rows.append(row)
        print(f"{variant.label:<100} " + " | ".join(_cell(row[f"side{i}"]) for i in range(len(sides))), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"sides": [[str(c), v] for c, v, _ in sides], "rows": rows}, indent=1))
    if missing:
        print(f"{missing} entries not in the cache (build first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
