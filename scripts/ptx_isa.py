"""Prints the PTX ISA versions of the kernel grid's PTX, per arch, read from the kernel
cache (python -m aot_build fills it; FATTN_AOT_CACHE, FATTN_CUDA_ARCHS and
FATTN_HEAD_DIMS as for the build). The driver must know that ISA to JIT the PTX
(FATTN_FORCE_PTX_ARCH, or a GPU no cubin serves).

Usage: python scripts/ptx_isa.py"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from aot_build import compiler, grid  # noqa: E402


def main() -> int:
    import triton

    digest = compiler._kernel_source_digest()
    found, missing = collections.Counter(), 0
    for variant in grid.expand():
        ptx = compiler.default_cache_dir() / compiler.cache_key(variant, triton.__version__, digest) / "kernel.ptx"
        if not ptx.exists():
            missing += 1
            continue
        lines = ptx.read_text().splitlines()
        version = next((line.split()[1] for line in lines if line.startswith(".version")), "?")
        target = next((line.split()[1] for line in lines if line.startswith(".target")), "?")
        found[(version, target)] += 1
    for (version, target), count in sorted(found.items()):
        print(f"PTX ISA {version}, .target {target}: {count} variants")
    if missing:
        print(f"{missing} variants not in the cache (build first)")
    return 1 if missing or not found else 0


if __name__ == "__main__":
    sys.exit(main())
