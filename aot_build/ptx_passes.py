"""PTX rewrites applied between Triton's PTX and ptxas, for kernels whose barriers Triton places
more conservatively than their protocol needs.

`drop_warpgroup_syncs` removes the warpgroup barrier (`bar.sync id, 128`) that Triton's
shared-memory barrier analysis puts before every mbarrier wait or arrive that follows another
mbarrier operation (docs/notes/tuning.md T32, scripts/mbarrier_sync_probe.py). In the Hopper
forward's consumers that barrier makes the four warps of a warpgroup meet three or four times per
key tile. The protocol does not need it:
- a wait only blocks the waiting thread;
- an arrive releases a K or V slot after the warpgroup's wgmma that read it completed
  (`wgmma.wait_group`): a wgmma is one operation of the whole warpgroup, so once one thread has
  seen it complete every warp's part is done (the single-thread release of CUTLASS's
  PipelineTmaAsync and FlashAttention-3); or it passes the turn to the other warpgroup, which
  orders nothing in memory.
The rewrite is refused, and the PTX kept whole, for a kernel whose threads read or write shared
memory themselves once its mbarriers exist (a bias tile read by ldmatrix, say): there the barrier
is what makes one thread's release speak for every warp's reads.
"""

from __future__ import annotations

import re

# Register-only instructions that may sit between a barrier and the mbarrier operation it guards.
_REGISTER_OPS = re.compile(r"^(@!?%p\d+\s+)?(mov|add|sub|mul|mad|shl|shr|and|or|xor|not|setp|selp|cvt|cvta|neg|min|max)\b")
_WARPGROUP_SYNC = re.compile(r"^bar\.sync\s+\d+,\s*128;$")
_MBARRIER_WAIT_OR_ARRIVE = re.compile(r"^(@!?%p\d+\s+)?mbarrier\.(try_wait|arrive)\.")
# Shared-memory accesses by each thread: ldmatrix, and loads and stores at a computed address.
# Not among them: the warp-specialization preamble's fixed `global_smem+offset` slots and its
# one-byte dispatch load, and the epilogue's stmatrix (fenced and synchronised on its own before a
# TMA store: that barrier precedes a TMA store or a branch, never an mbarrier operation, so it
# stays). Descriptors written before the mbarriers are made are not looked at.
_THREAD_SHARED = re.compile(r"\bldmatrix\b|\bld\.shared(::cta)?\.(?!b8\b)[\w.]*\s+[^\[]*\[\s*%r"
                            r"|\bst\.shared(::cta)?\.[\w.]*\s+\[\s*%r")


def _code(line: str) -> str:
    return line.split("//", 1)[0].strip()


def _accesses_shared_by_thread(lines: list[str]) -> bool:
    start = next((i for i, line in enumerate(lines) if "mbarrier.init" in line), len(lines))
    return any(_THREAD_SHARED.search(_code(line)) for line in lines[start:])


def _next_instruction(lines: list[str], i: int) -> str:
    for line in lines[i + 1:]:
        text = _code(line)
        # Inline assembly's braces, its predicate declaration and a wait loop's label.
        if (not text or text in ("{", "}") or text.startswith(".reg") or text.endswith(":")
                or _REGISTER_OPS.match(text)):
            continue
        return text
    return ""


def drop_warpgroup_syncs(ptx: str) -> tuple[str, int]:
    """(PTX, barriers removed): every `bar.sync id, 128` whose next instruction, past register
    arithmetic, is an mbarrier wait or arrive; (ptx, 0) for a kernel whose threads access shared
    memory themselves once its mbarriers exist."""
    lines = ptx.splitlines(keepends=True)
    if _accesses_shared_by_thread(lines):
        return ptx, 0
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        if _WARPGROUP_SYNC.match(_code(line)) and _MBARRIER_WAIT_OR_ARRIVE.match(_next_instruction(lines, i)):
            dropped += 1
            continue
        kept.append(line)
    return "".join(kept), dropped


# The passes each kernel's PTX goes through, by the compiled function's name.
PASSES = {
    "attn_fwd_sm90": (drop_warpgroup_syncs,),
}


def passes_for(kernel: str) -> tuple:
    return PASSES.get(kernel, ())


def passes_digest() -> str:
    """Changes whenever a pass may: part of the build cache's key of every kernel with passes."""
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def stages_hook(passes: tuple, counts: dict):
    """Triton's add_stages_inspection_hook: the PTX stage's output goes through `passes` before
    ptxas sees it; `counts` receives what each removed. Called without arguments (Triton 3.9 and
    later, for its cache key) it returns a key and a hash naming the passes."""
    def hook(backend=None, stages=None, options=None, language=None, capability=None):
        if stages is None:
            key = "fattn-ptx-passes-" + "-".join(p.__name__ for p in passes) + "-" + passes_digest()
            return key, passes_digest()
        make_ptx = stages["ptx"]

        def ptx_stage(src, metadata):
            ptx = make_ptx(src, metadata)
            for rewrite in passes:
                ptx, counts[rewrite.__name__] = rewrite(ptx)
            return ptx

        stages["ptx"] = ptx_stage

    return hook
