"""Does the Triton that compiles the kernels put a CTA barrier (bar.sync) between an mbarrier wait
and a later arrive? Compiles small Gluon kernels for sm_90 (no GPU needed) and prints each one's
barrier instructions in the loop, as PTX has them.

    python scripts/mbarrier_sync_probe.py

The Hopper kernels' consumers wait on "ready" barriers and arrive on "empty" ones every key tile;
a bar.sync before each arrive makes every warp of the warpgroup wait for the slowest
(docs/notes/tuning.md T32). Cases: arrivals alone; a wait then an arrive on another barrier
array; the same with a shared-memory load between; a wait and an arrive on two fixed barriers.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

try:
    from triton.experimental.gluon._runtime import GluonASTSource
except ImportError:  # later Triton releases
    from triton.experimental.gluon import GluonASTSource

CASES = {0: "arrive alone", 1: "wait(ready[i]) then arrive(empty[i])", 2: "wait, shared load, arrive",
         3: "wait(ready[0]) then arrive(empty[0])"}


@gluon.jit
def probe(X, n, CASE: gl.constexpr):
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tiles = gl.allocate_shared_memory(gl.int32, [2, 128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    for b in gl.static_range(2):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=1)
    acc = gl.zeros([128], gl.int32, layout)
    for i in range(n):
        if CASE == 3:
            mbarrier.wait(ready.index(0), 0)
            mbarrier.arrive(empty.index(0), count=1)
        else:
            if CASE >= 1:
                mbarrier.wait(ready.index(i % 2), (i // 2) & 1)
            if CASE == 2:
                acc += tiles.index(i % 2).load(layout)
            mbarrier.arrive(empty.index(i % 2), count=1)
    gl.store(X + gl.arange(0, 128, layout), acc)


def barriers_in_loop(case: int) -> list[str]:
    source = GluonASTSource(fn=probe, signature={"X": "*i32", "n": "i32", "CASE": "constexpr"},
                            constexprs={"CASE": case})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    lines = [line.strip() for line in compiled.asm["ptx"].splitlines()]
    first = next(i for i, line in enumerate(lines) if "mbarrier.try_wait" in line or "mbarrier.arrive" in line)
    return [line for line in lines[first - 1:] if "bar.sync" in line or "mbarrier." in line]


def main() -> int:
    print(f"triton {triton.__version__}, sm_90 PTX")
    for case, what in CASES.items():
        found = barriers_in_loop(case)
        synced = any("bar.sync" in line for line in found)
        print(f"{what}: {'bar.sync in the loop' if synced else 'no bar.sync'}\n    " + "\n    ".join(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
