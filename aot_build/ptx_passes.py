"""PTX rewrites applied between Triton's PTX and ptxas, for kernels whose barriers Triton places
more conservatively than their protocol needs.

`drop_warpgroup_syncs` removes the warpgroup barrier (`bar.sync id, 128`) that Triton's
shared-memory barrier analysis puts before every mbarrier wait or arrive that follows another
mbarrier operation (docs/notes/tuning.md T32, scripts/mbarrier_sync_probe.py), where the
protocol makes it redundant:
- before a wait, the barrier may go where, on every path into it, the last instruction that
  touches memory or synchronises is a wgmma wait or issue, an mbarrier operation, a global load
  or another barrier (_SAFE_BEFORE_WAIT): a wait blocks only its own thread;
- before an arrive, only where that instruction is a wgmma wait or another barrier
  (_SAFE_BEFORE_ARRIVE). The arrive is one thread's, made for the whole warpgroup: it must not
  come before every warp has passed the waits it answers. If the other side, released, can
  complete the waited barrier's next phase before a slower warp has polled it, that warp finds
  the parity it waits for come round again and waits for ever (T42: a query tile with no key
  tiles waits for its Q and releases it at once, and a run of such tiles hung the forward). A
  completed wgmma shows that every warp has issued it, and so has passed every wait that comes
  before that issue in its program: in attn_fwd_sm90 the K slot's release follows S's completion
  (S read the slot after each warp's wait for it) and the V slot's follows P V's. The pass does
  not check which product guards which release; the kernels' protocol does, and tuning.md T42
  lists the releases. This is the single-thread release of CUTLASS's PipelineTmaAsync and
  FlashAttention-3. A wgmma's issue, an mbarrier wait or arrive, do not show it: each is one
  warp's.
So the epilogue's barrier after each warp's own TMA store wait stays, as do the one after the
mbarriers are made and, in each consumer, the one between a keyless tile's wait for Q and its
release, the one before Q's release after the key loop and the one before passing the turn to the
other warpgroup. The rewrite is refused, and the PTX kept whole, for a kernel whose threads read
or write shared memory themselves once its mbarriers exist (a bias tile read by ldmatrix, a
layout conversion through shared memory): there a barrier may be what makes one thread's release
speak for every warp's reads, or the only one between one warp's read and another's write.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

# Instructions that touch memory, synchronise the CTA or move control; every other one only
# computes in registers (a warp's shuffles and votes included), and may sit between a barrier and
# the instructions around it.
_MEMORY_OR_CONTROL = re.compile(r"^(@!?%p\d+\s+)?(ld|st|atom|red|cp|mbarrier|bar|barrier|wgmma|fence|membar|tensormap"
                                r"|stmatrix|ldmatrix|elect|griddepcontrol|setmaxnreg|bra|brx|ret|exit|call|prefetch"
                                r"|discard|applypriority|createpolicy|multimem|mma|wmma|nanosleep|trap)\b")
_WARPGROUP_SYNC = re.compile(r"^bar\.sync\s+\d+,\s*128;$")
_MBARRIER_WAIT_OR_ARRIVE = re.compile(r"^(@!?%p\d+\s+)?mbarrier\.(try_wait|arrive)\.")
# What a dropped barrier before a wait may follow, on every path into it: the completion or the
# issue of the warpgroup's wgmmas, an mbarrier operation (an inline wait loop's branch back is
# passed over as register work, so the loop ends at its try_wait), a load from global memory, or
# another barrier.
_SAFE_BEFORE_WAIT = re.compile(r"^(@!?%p\d+\s+)?(wgmma\.wait_group|wgmma\.commit_group|mbarrier\.(arrive|try_wait)"
                               r"|ld\.global|ld\.param|bar\.sync|barrier\.sync)\b")
# What a dropped barrier before an arrive may follow: what shows that every warp of the warpgroup
# is past its earlier waits, a completed wgmma or another barrier. Anything else keeps the
# barrier: after the epilogue's `cp.async.bulk.wait_group.read`, say, each warp has waited only for
# its own TMA store's reads of the tile, and the barrier is what lets one thread then release the
# buffer for all of them.
_SAFE_BEFORE_ARRIVE = re.compile(r"^(wgmma\.wait_group|bar\.sync|barrier\.sync)\b")
_LABEL = re.compile(r"^(\$L\w+):")
_BRANCH = re.compile(r"^(@!?%p\d+\s+)?bra(\.uni)?\s+(\$L\w+);$")
_ENDS_BLOCK = re.compile(r"^(bra(\.uni)?\s+\$L\w+|ret|exit|brx\.idx\b.*);?$")
# Shared-memory accesses by each thread: ldmatrix, atomics, and loads and stores at a computed
# address. Not among them: the warp-specialization preamble's fixed `global_smem+offset` slots and
# its one-byte dispatch load, and the epilogue's stmatrix (fenced and synchronised on its own
# before a TMA store; the barriers around it never directly precede an mbarrier operation on
# every path, _SAFE_BEFORE_ARRIVE). Descriptors written before the mbarriers are made are not
# looked at.
_THREAD_SHARED = re.compile(r"\bldmatrix\b|\b(atom|red)\.shared|\bcp\.async\.(ca|cg)\.shared"
                            r"|\bld(\.volatile)?\.shared(::cta)?\.(?!b8\b)[\w.]*\s+[^\[]*\[\s*%r"
                            r"|\bst(\.volatile)?\.shared(::cta)?\.[\w.]*\s+\[\s*%r")


def _code(line: str) -> str:
    return line.split("//", 1)[0].strip()


def _skipped(text: str) -> bool:
    """Lines that neither order memory nor end a block: blanks, inline assembly's braces, its
    predicate declaration and wait-loop label, register arithmetic."""
    return (not text or text in ("{", "}") or text.startswith(".reg") or text == "waitLoop:"
            or not (_MEMORY_OR_CONTROL.match(text) or text.endswith(":") or text.startswith(".")))


def _accesses_shared_by_thread(lines: list[str]) -> bool:
    start = next((i for i, line in enumerate(lines) if "mbarrier.init" in line), len(lines))
    return any(_THREAD_SHARED.search(_code(line)) for line in lines[start:])


def _next_instruction(lines: list[str], i: int) -> str:
    for line in lines[i + 1:]:
        text = _code(line)
        if not _skipped(text):
            return text
    return ""


def _branch_sources(lines: list[str]) -> dict[str, list[int]]:
    """Label -> the lines that branch to it; a label in a brx.idx table maps to [-1] (unknown)."""
    sources: dict[str, list[int]] = {}
    in_table = False
    for i, line in enumerate(lines):
        text = _code(line)
        if ".branchtargets" in text:
            in_table = True
        if in_table:
            for label in re.findall(r"\$L__\w+", text.split(".branchtargets")[-1]):
                sources.setdefault(label, []).append(-1)
            in_table = not text.endswith(";")
            continue
        branch = _BRANCH.match(text)
        if branch:
            sources.setdefault(branch.group(3), []).append(i)
    return sources


def _instructions_before(lines: list[str], i: int, sources: dict[str, list[int]]) -> list[str] | None:
    """The instruction that runs last before line i on each path into it (past register
    arithmetic, labels and the branches that only pass control), or None where a path cannot be
    followed (the kernel's entry, a computed branch)."""
    found, todo, seen = [], [i - 1], set()
    while todo:
        j = todo.pop()
        while True:
            if j < 0:
                return None
            if j in seen:
                break
            seen.add(j)
            text = _code(lines[j])
            label = _LABEL.match(text)
            if label:
                branches = sources.get(label.group(1), [])
                if -1 in branches:
                    return None
                todo.extend(b - 1 for b in branches)  # the branch itself orders nothing
                k = j - 1
                while k >= 0 and _skipped(_code(lines[k])):
                    k -= 1
                if k >= 0 and _ENDS_BLOCK.match(_code(lines[k])):
                    break  # no fall-through into the label
                j -= 1
                continue
            if _skipped(text) or (_BRANCH.match(text) and text.startswith("@")):
                j -= 1  # a conditional branch not taken passes control on
                continue
            found.append(text)
            break
    return found


def drop_warpgroup_syncs(ptx: str) -> tuple[str, int]:
    """(PTX, barriers removed): every `bar.sync id, 128` whose next instruction, past register
    arithmetic, is an mbarrier wait (or arrive) and whose previous instruction on every path is
    one _SAFE_BEFORE_WAIT (_SAFE_BEFORE_ARRIVE) names; (ptx, 0) for a kernel whose threads access
    shared memory themselves once its mbarriers exist."""
    lines = ptx.splitlines(keepends=True)
    if _accesses_shared_by_thread(lines):
        return ptx, 0
    sources = _branch_sources(lines)
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        following = _WARPGROUP_SYNC.match(_code(line)) and _MBARRIER_WAIT_OR_ARRIVE.match(_next_instruction(lines, i))
        if following:
            safe = _SAFE_BEFORE_ARRIVE if following.group(2) == "arrive" else _SAFE_BEFORE_WAIT
            before = _instructions_before(lines, i, sources)
            if before is not None and all(safe.match(text) for text in before):
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


@functools.lru_cache(maxsize=None)
def passes_digest() -> str:
    """Changes whenever a pass may: part of the build cache's key of every kernel with passes."""
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
