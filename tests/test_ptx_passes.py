"""aot_build/ptx_passes.py: which warpgroup barriers the PTX rewrite drops and which it keeps, on
small PTX texts (fast), and on the Hopper forward as the build compiles it (slow tier)."""

from __future__ import annotations

import re

import pytest

from aot_build import grid
from aot_build.compiler import compile_variant
from aot_build.ptx_passes import (_branch_sources, _instructions_before, _next_instruction, drop_warpgroup_syncs,
                                  passes_for)

# The mbarriers made, then (as at a consumer's start) a load from global memory: a barrier right
# after an init stays (the init must be seen by every thread), one after the load may go.
INIT = "\t@%p1 mbarrier.init.shared::cta.b64 [%r1], 2;\n\t@%p3 ld.global.b32 { %r4 }, [ %rd5 + 0 ];\n"
WAIT = ("\tbar.sync \t0, 128;\n\t// begin inline asm\n\t\n{\n\t.reg .pred complete;\n\twaitLoop:\n"
        "\tmbarrier.try_wait.parity.shared.b64 complete, [%r2], %r3;\n\t@!complete bra.uni waitLoop;\n}\n")
ARRIVE = ("\twgmma.wait_group.sync.aligned 0;\n\tbar.sync \t2, 128;\n\tadd.s32 \t%r9, %r8, 1;\n"
          "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9];\n")
STORE = ("\tstmatrix.sync.aligned.m8n8.x4.shared.b16 [%r5], {%r6, %r7, %r8, %r9};\n"
         "\tfence.proxy.async.shared::cta;\n\tbar.sync \t0, 128;\n"
         "\t@%p5 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r1, %r2}], [%r5];\n")


def _syncs(ptx: str) -> int:
    return len(re.findall(r"bar\.sync", ptx))


def test_drops_the_barrier_before_a_wait_and_an_arrive():
    ptx = INIT + WAIT + ARRIVE
    out, dropped = drop_warpgroup_syncs(ptx)
    assert dropped == 2 and _syncs(out) == 0
    assert "mbarrier.try_wait" in out and "mbarrier.arrive" in out and "add.s32" in out


def test_keeps_barriers_that_guard_anything_else():
    # The epilogue's barrier before a TMA store, a CTA-wide barrier, one before a branch (its
    # target is not looked at), and the barrier after the mbarriers are made.
    ptx = (INIT + "\tbar.sync \t0, 128;\n" + INIT + STORE + "\tbar.sync \t0;\n" + ARRIVE.replace("bar.sync \t2, 128", "bar.sync \t0")
           + "\tbar.sync \t2, 128;\n\tbra.uni \t$L__BB0_3;\n$L__BB0_3:\n" + ARRIVE.split("\tbar.sync")[0]
           + "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9];\n")
    out, dropped = drop_warpgroup_syncs(ptx)
    assert dropped == 0 and out == ptx


def test_keeps_the_barrier_after_each_warps_own_tma_store_wait():
    # The O-in-Q's-buffer epilogue: each warp waits for its own TMA store's reads, and only the
    # barrier lets thread 0 then release Q's buffer for all four warps.
    epilogue = ("\tcp.async.bulk.wait_group.read \t0;\n\tbar.sync \t2, 128;\n"
                "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9];\n")
    ptx = INIT + epilogue
    assert drop_warpgroup_syncs(ptx) == (ptx, 0)
    assert drop_warpgroup_syncs(INIT + WAIT + epilogue)[1] == 1  # the wait's barrier alone goes


def test_every_path_into_a_barrier_must_be_safe():
    # The loop head's barrier has two ways in: after an mbarrier arrive (safe) and, by a branch,
    # after a TMA store wait (not): it stays. With both ways safe, it goes.
    def head(other):
        return (INIT + "\t@%p2 bra \t$L__BB0_7;\n" + other + "\tbra.uni \t$L__BB0_8;\n$L__BB0_7:\n"
                "\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9];\n$L__BB0_8:\n" + WAIT)
    unsafe = head("\tcp.async.bulk.wait_group.read \t0;\n")
    assert drop_warpgroup_syncs(unsafe) == (unsafe, 0)
    assert drop_warpgroup_syncs(head("\twgmma.wait_group.sync.aligned 0;\n"))[1] == 1


@pytest.mark.parametrize("before", [
    # A query tile with no key tile: its wait for Q, then at once Q's release.
    "\t{\n\t.reg .pred complete;\n\twaitLoop:\n\tmbarrier.try_wait.parity.shared.b64 complete, [%r2], %r3;\n"
    "\t@!complete bra.uni waitLoop;\n}\n",
    # The products issued, then the turn passed to the other warpgroup.
    "\twgmma.commit_group.sync.aligned;\n",
    "\t@%p6 mbarrier.arrive.shared::cta.b64 _, [%r8];\n",
    "\t@%p7 ld.global.b32 { %r4 }, [ %rd5 + 0 ];\n",
])
def test_an_arrive_keeps_its_barrier_unless_every_warp_is_known_past_its_waits(before):
    # One thread arrives for the warpgroup. After its own wait, issue or arrive, the other warps
    # may still be short of a wait the arrive answers; released, the other side can complete that
    # barrier's next phase before they poll it, and they then wait on a parity that has come round
    # again, for ever (docs/notes/tuning.md T42). A completed wgmma (ARRIVE's) shows every warp
    # issued it, after its waits.
    arrive = "\tbar.sync \t2, 128;\n\t@%p4 mbarrier.arrive.shared::cta.b64 _, [%r9];\n"
    ptx = INIT + before + arrive
    assert drop_warpgroup_syncs(ptx) == (ptx, 0)
    assert drop_warpgroup_syncs(INIT + before + ARRIVE)[1] == 1


@pytest.mark.parametrize("access", [
    "\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r7];\n",
    "\tld.shared.v2.b32 \t{%r1, %r2}, [%r114+131808];\n",
    "\tst.shared.b32 \t[%r448+114688], %r5977;\n",
])
def test_a_kernel_whose_threads_use_shared_memory_is_left_whole(access):
    # Each warp's own shared-memory reads or writes: only the barrier makes one thread's release
    # (or the next write) safe for every warp.
    ptx = INIT + access + WAIT + ARRIVE
    assert drop_warpgroup_syncs(ptx) == (ptx, 0)
    # Before the mbarriers exist (the TMA descriptors' fill), the same access does not count.
    assert drop_warpgroup_syncs(access + INIT + WAIT + ARRIVE)[1] == 2


def test_only_the_hopper_forward_has_passes():
    assert [p.__name__ for p in passes_for("attn_fwd_sm90")] == ["drop_warpgroup_syncs"]
    assert passes_for("attn_bwd_dkdv_sm90") == () and passes_for("attn_fwd") == ()


def _forward_variant(score_mod: int, head_dim: str = "128"):
    return next(v for v in grid.expand(env={"FATTN_CUDA_ARCHS": "90", "FATTN_HEAD_DIMS": head_dim})
                if v.implementation == "attn_fwd_sm90" and v.dtype == "bf16" and not v.constant_dict["FP8"]
                and v.constant_dict["SCORE_MOD"] == score_mod and not v.constant_dict["HOST_MAPS"])


@pytest.mark.slow
def test_the_hopper_forward_loses_the_redundant_consumer_barriers_and_keeps_the_rest(tmp_path):
    from triton_src.variants import BIAS_TMA, PLAIN

    plain = compile_variant(_forward_variant(PLAIN), shared_limit=232448, cache_dir=tmp_path)
    lines = plain.ptx.splitlines()
    sources = _branch_sources(lines)
    # Gone: every warpgroup barrier before a wait, and between a completed wgmma and an arrive (the
    # K and V slots' releases). Kept, in each consumer: the one between a query tile's wait for Q
    # and its release when it has no key tile, and the one before passing the turn.
    kept_before_arrive = []
    for i, line in enumerate(lines):
        following = _next_instruction(lines, i)
        if (re.match(r"bar\.sync\s+\d+,\s*128;", line.split("//")[0].strip())
                and re.search(r"mbarrier\.(try_wait|arrive)\.", following)):
            before = _instructions_before(lines, i, sources)
            assert "mbarrier.arrive" in following, (i, before, following)
            assert not all(text.startswith("wgmma.wait_group") for text in before), (i, before)
            kept_before_arrive.append(before)
    assert sum(any(text.startswith("mbarrier.try_wait") for text in before) for before in kept_before_arrive) == 2
    assert sum("wgmma.commit_group.sync.aligned;" in before for before in kept_before_arrive) == 2
    assert plain.meta["ptx_passes"]["drop_warpgroup_syncs"] == 14  # of T34's 20
    code = [line for line in (raw.split("//")[0].strip() for raw in lines)
            if line and line not in ("{", "}") and not line.startswith(".reg")]
    # Kept: the epilogue's barriers around the O tile in shared memory, and those after the
    # mbarriers are made.
    assert sum(code[i - 1].startswith("fence.proxy.async") for i, line in enumerate(code) if "bar.sync" in line) >= 2
    assert _syncs(plain.ptx) >= 10
    # d256 stages O in Q's buffer: the barrier between each warp's TMA store wait and thread 0's
    # release of the buffer stays (twice: one per consumer).
    wide = compile_variant(_forward_variant(PLAIN, "256"), shared_limit=232448, cache_dir=tmp_path)
    code = [line for line in (raw.split("//")[0].strip() for raw in wide.ptx.splitlines())
            if line and line not in ("{", "}") and not line.startswith(".reg")]
    kept = [i for i, line in enumerate(code[:-1]) if line.startswith("cp.async.bulk.wait_group.read")
            and re.match(r"bar\.sync\s+\d+,\s*128;", code[i + 1])
            and "mbarrier.arrive" in _next_instruction(code, i + 1)]
    assert len(kept) == 2
    assert wide.meta["ptx_passes"]["drop_warpgroup_syncs"] == 14  # of T34's 16: the turn's two are back
    # A bias read by each thread from its TMA tile: the barriers stay.
    bias = compile_variant(_forward_variant(BIAS_TMA.value), shared_limit=232448, cache_dir=tmp_path)
    assert bias.meta["ptx_passes"] == {"drop_warpgroup_syncs": 0}


def test_the_stages_hook_rewrites_the_ptx_stage_and_names_itself_for_the_cache():
    from aot_build.ptx_passes import passes_digest, stages_hook

    counts: dict = {}
    hook = stages_hook((drop_warpgroup_syncs,), counts)
    stages = {"ptx": lambda src, metadata: INIT + WAIT + ARRIVE, "cubin": None}
    hook(None, stages, None, None, 90)
    assert _syncs(stages["ptx"]("src", {})) == 0 and counts == {"drop_warpgroup_syncs": 2}
    # Triton 3.9 and later call it without arguments for a key that keeps its cache apart.
    key, digest = hook()
    assert digest == passes_digest() and "drop_warpgroup_syncs" in key and digest in key
