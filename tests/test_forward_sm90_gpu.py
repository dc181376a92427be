"""The Hopper forward (triton_src/forward_sm90.py: the Gluon kernel configs.json builds as attn_fwd's
sm_90 implementation for the 64, 96, 128, 192 and 256 head-dim buckets: SCORE_MOD plain,
softcap_alibi, alibi_only and bias_tma (a bias read by TMA), at 64 plain for long queries only; 96
and 192 its alone, the head dim in two pieces) on a Hopper GPU
(skipped elsewhere, and where the build lacks it): which kernel serves which call, and the inputs
only its TMA path meets (empty packed sequences, a query tile's second half past the end, row
strides far from head_dim, padded head dims), against float64 with the 2x rule. The op-level
suites (forward, varlen, variants, sinks, head dims, backward) run through it as well on Hopper."""

import pytest
import torch

import fattn
from fattn._library import host_maps_up_to_rows, prefers_tile_loop
from fattn.reference import attention_reference
from helpers import (
    check_accuracy, fp8_kernels_on, kernels_launched, kernels_launched_by_kernel, launch_grids, make_qkv, requires_gpu,
)
from helpers.fp8 import check_fp8_accuracy, fp8_references


def _hopper_build():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        return False
    return any(e["function"] == "attn_fwd_sm90" for e in fattn.build_info()["kernels"])


pytestmark = [requires_gpu, pytest.mark.gpu,
              pytest.mark.skipif(not _hopper_build(), reason="needs a Hopper GPU and a build with attn_fwd_sm90")]


@pytest.mark.parametrize("head_dim", [72, 96, 128, 136, 192, 200, 256])
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(softcap=30.0, window_size=(100, 0))],
                         ids=["plain", "causal", "softcap-window"])
def test_the_hopper_kernel_serves_the_buckets_above_64(head_dim, options):
    # Causal calls in the 128 bucket run attn_fwd below the tuned crossover (the next test): these
    # have more queries.
    n = max(600, _tuned_crossover(128, True) + 100) if options.get("causal") else 600
    q, k, v = make_qkv(2, n, n, 4, 2, head_dim, torch.bfloat16, "cuda")
    names = kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q, k, v, **options))
    assert "attn_fwd_sm90" in names, names


@pytest.mark.parametrize("case", ["causal 512", "causal 300", "window 500", "causal 513", "causal 1024",
                                  "non-causal 512", "softcap causal 512", "packed causal 512", "d96 causal 512"])
def test_short_d128_calls_follow_the_tuned_crossover(case):
    # The build has both kernels at d128 without score modifications; the op asks for the looping
    # Hopper kernel from the rows aot_build/tuned/sm90.json's crossover gives (csrc/attention/
    # query_tile_programs.h; since the looping kernel's maps, from the first row at d128, causal
    # or not: docs/notes/tuning.md T43), attn_fwd below, and the looping kernel for packed
    # sequences, score modifications and the 96 bucket, which have that kernel alone.
    n = int(case.split()[-1])
    d = 96 if case.startswith("d96") else 128
    torch.manual_seed(n)
    q, k, v = make_qkv(1, n, n, 4, 2, d, torch.bfloat16, "cuda")
    options = {"window 500": dict(window_size=(50, 0)), "non-causal 512": {}}.get(case, dict(causal=True))
    if case.startswith("softcap"):
        options["softcap"] = 30.0
    if case.startswith("packed"):
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        call = lambda: fattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, n, n, causal=True)  # noqa: E731
    else:
        call = lambda: fattn.flash_attn_func(q, k, v, **options)  # noqa: E731
    # Which of the two the tuned crossover picks for a dense call (the library's own rule).
    dense_d128 = d == 128 and not case.startswith(("softcap", "packed"))
    right_edge = case != "non-causal 512"
    want = "attn_fwd_sm90" if not dense_d128 or prefers_tile_loop(90, 128, n, False, right_edge) else "attn_fwd"
    names = kernels_launched_by_kernel(call)
    assert want in names and ({"attn_fwd", "attn_fwd_sm90"} - {want}).isdisjoint(names), names
    if not case.startswith("packed"):
        out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, **options)
        causal = options.pop("causal", False)
        check_accuracy(out, lse, q, k, v, None, causal, case, **options)


@pytest.mark.parametrize("head_dim", [96, 128, 200, 256])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(700, 700), (333, 1000), (1000, 129)])
def test_alibi_without_softcap(head_dim, seqlen_q, seqlen_k):
    # ALiBi alone runs the Hopper kernel's SCORE_MOD alibi_only variant (the softcap's code left out) from
    # d96 on; ALiBi's distances with seqlen_q != seqlen_k, [batch, heads] slopes, GQA, windows.
    torch.manual_seed(seqlen_q + head_dim)
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 8, 2, head_dim, torch.bfloat16, "cuda")
    slopes = torch.rand(2, 8, device="cuda") * 0.3
    assert "attn_fwd_sm90" in kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q, k, v, alibi_slopes=slopes))
    for options in (dict(causal=True), dict(), dict(window_size=(100, 20))):
        out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, alibi_slopes=slopes, **options)
        causal = options.pop("causal", False)
        check_accuracy(out, lse, q, k, v, None, causal, f"alibi d{head_dim} {options}", alibi_slopes=slopes,
                       **options)


@pytest.mark.parametrize("what", ["dropout at head_dim 64", "bias at head_dim 64", "head_dim 64", "head_dim 32"])
def test_other_calls_stay_on_attn_fwd(what):
    # Short d64 calls, and bias or dropout at d64 (SCORE_MOD bias_tma is built from d96 on), run attn_fwd.
    d = 32 if what == "head_dim 32" else 64
    q, k, v = make_qkv(2, 300, 300, 4, 2, d, torch.bfloat16, "cuda")
    p = 0.1 if what.startswith("dropout") else 0.0
    bias = torch.randn(2, 4, 300, 300, device="cuda", dtype=q.dtype) if what.startswith("bias") else None
    names = kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q, k, v, p, bias=bias))
    assert "attn_fwd" in names and "attn_fwd_sm90" not in names, names


def _dropout_seed(value):
    return torch.tensor([value], dtype=torch.int64, device="cuda")


@pytest.mark.parametrize("head_dim", [80, 128, 192, 256])
@pytest.mark.parametrize("what", ["bias bhqk", "mask", "dropout", "dropout+bias+softcap+alibi",
                                  "bias broadcast over queries", "bias rows unaligned"])
def test_a_bias_runs_the_hopper_kernel(head_dim, what):
    # SCORE_MOD bias_tma (a bias that TMA can read, with dropout, softcap and ALiBi) from d96 on:
    # seqlen_q != seqlen_k, GQA, causal and windows; a boolean mask with a row that sees no key
    # (its out 0, lse -inf); dropout with the CPU's mask for the same seed. A bias broadcast over
    # the queries (row stride 0) or whose rows are not 16-byte multiples (900 keys), and dropout
    # without a bias, run attn_fwd (SCORE_MOD bias_dropout).
    torch.manual_seed(head_dim + len(what))
    b, sq, sk, h, hk = 2, 900, 900 if what == "bias rows unaligned" else 904, 4, 2
    q, k, v = make_qkv(b, sq, sk, h, hk, head_dim, torch.bfloat16, "cuda")
    bias, p, seed, extra = None, 0.0, _dropout_seed(0x5EED + head_dim), {}
    if what.startswith("bias") and what != "bias broadcast over queries" or what.startswith("dropout+bias"):
        bias = (torch.randn(b, h, sq, sk, device="cuda") * 2).to(q.dtype)
    elif what == "bias broadcast over queries":
        bias = (torch.randn(1, h, 1, sk, device="cuda") * 2).to(q.dtype).expand(b, h, sq, sk)
    elif what == "mask":
        bias = torch.rand(b, 1, sq, sk, device="cuda") > 0.3
        bias[..., sq // 2, :] = False
    if what.startswith("dropout"):
        p = 0.2
    if "softcap" in what:
        extra = dict(softcap=20.0, alibi_slopes=torch.rand(h, device="cuda") * 0.1)
    op = torch.ops.fattn.forward.default
    prepared = fattn._bias.prepare("test", bias, q, k)
    want = "attn_fwd" if what in ("bias broadcast over queries", "bias rows unaligned", "dropout") else "attn_fwd_sm90"
    for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (150, 40))):
        def call():
            return op(q, k, v, None, causal, False, window[0], window[1], extra.get("softcap", 0.0),
                      extra.get("alibi_slopes"), None, None, None, prepared, p, seed)
        names = kernels_launched_by_kernel(call)
        assert want in names and ({"attn_fwd", "attn_fwd_sm90"} - {want}).isdisjoint(names), (what, names)
        out, lse = call()
        check_accuracy(out, lse, q, k, v, None, causal, f"{what} d{head_dim} causal {causal} window {window}",
                       window_size=window, bias=bias, dropout_p=p, dropout_seed=seed, **extra)
        if what == "mask":
            assert torch.all(out[:, sq // 2] == 0) and torch.all(lse[:, :, sq // 2] == float("-inf"))


@pytest.mark.parametrize("head_dim", [80, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("seqlen_q", [1, 63, 64, 65, 127, 129, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tile_halves_past_the_end(seqlen_q, dtype, head_dim):
    # The second consumer warpgroup's 64 rows start past seqlen_q for seqlen_q <= 64 (it stores
    # nothing), straddle it for 65..127: every row of both batch entries must come out right (a
    # store past one sequence's end would land in the next one's rows).
    torch.manual_seed(seqlen_q)
    q, k, v = make_qkv(2, seqlen_q, 777, 8, 2, head_dim, dtype, "cuda")
    for causal in (False, True):
        out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        check_accuracy(out, lse, q, k, v, None, causal, f"seqlen_q {seqlen_q} causal {causal}")


def _hopper_forward_grids(fn):
    return launch_grids(fn, "attn_fwd_sm90") + launch_grids(fn, "attn_fwd_sm90_maps")


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("shape", [(4, 1600, 1600, 12, 4), (2, 3824, 3000, 8, 2), (3, 1000, 4000, 16, 2)],
                         ids=["13-tiles", "30-tiles", "8-tiles-more-keys"])
def test_programs_that_loop_over_query_tiles(shape, head_dim):
    # Dense calls give each (head, sequence) fewer programs than query tiles
    # (csrc/attention/query_tile_programs.cpp): each program runs tiles in snaked rounds, the
    # last round short for some, with its barriers' phases and its K/V ring running on across
    # tiles. The grid must be shorter than the tiles, and every row right.
    b, sq, sk, h, hk = shape
    torch.manual_seed(sq + head_dim)
    q, k, v = make_qkv(b, sq, sk, h, hk, head_dim, torch.bfloat16, "cuda")
    tiles = -(-sq // 128)
    cases = {"plain": {}, "causal": dict(causal=True), "window+softcap": dict(window_size=(300, 0), softcap=20.0),
             "causal+sinks": dict(causal=True, sinks=torch.randn(h, device="cuda"))}
    for what, options in cases.items():
        grids = _hopper_forward_grids(lambda: fattn.flash_attn_func(q, k, v, return_lse=True, **options))
        assert grids and all(g[0] < tiles for g in grids), f"{what}: grids {grids} for {tiles} query tiles"
        out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, **options)
        causal = options.pop("causal", False)
        check_accuracy(out, lse, q, k, v, None, causal, f"{shape} d{head_dim} {what}", **options)


def _tuned_crossover(bucket: int, right_edge: bool) -> int:
    """The sm_90 rows from which the op asks for the looping kernel, as the library holds them."""
    row = next(r for r in fattn.build_info()["tile_loop"] if r["arch"] == 90 and r["bucket"] == bucket)
    return row["from_rows_right_edge" if right_edge else "from_rows"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("right_edge", [False, True], ids=["no-right-edge", "right-edge"])
def test_head_dim_64_picks_its_kernel_by_length(dtype, right_edge):
    # d64 has both kernels on sm_90 without score modifications (configs.json): dense queries run
    # the looping Hopper kernel (192-row tiles, three consumer warpgroups) from the tuned
    # crossover's rows (aot_build/tuned/sm90.json, through the kernel table), without or with a
    # right edge (causal, a window); shorter ones, packed sequences and the softcap attn_fwd
    # (csrc/attention/query_tile_programs.h). Here: 204 rows past the crossover, and one before it.
    threshold = _tuned_crossover(64, right_edge)
    assert 1 < threshold < 16384, f"d64 crossover at {threshold} rows: the cases below need one between"
    sq = threshold + 204
    b, sk, h, hk = (1, 3000, 8, 2) if right_edge else (2, 3000, 16, 4)
    torch.manual_seed(sq)
    q, k, v = make_qkv(b, sq, sk, h, hk, 64, dtype, "cuda")
    tiles = -(-sq // 192)
    # Segment ids take the looping kernel's second copy of its key loop at d64 (docs/notes/tuning.md T18).
    q_ids = torch.sort(torch.randint(0, 5, (b, sq), device="cuda", dtype=torch.int32), 1).values
    kv_ids = torch.sort(torch.randint(0, 5, (b, sk), device="cuda", dtype=torch.int32), 1).values
    if right_edge:
        cases = {"causal": dict(causal=True), "window": dict(window_size=(300, 0)),
                 "causal+sinks": dict(causal=True, sinks=torch.randn(h, device="cuda")),
                 "causal+segments": dict(causal=True, q_segment_ids=q_ids, kv_segment_ids=kv_ids)}
    else:
        cases = {"plain": {}, "left window": dict(window_size=(300, -1)),
                 "sinks": dict(sinks=torch.randn(h, device="cuda")),
                 "segments": dict(q_segment_ids=q_ids, kv_segment_ids=kv_ids)}
    for what, options in cases.items():
        grids = _hopper_forward_grids(lambda: fattn.flash_attn_func(q, k, v, **options))
        assert grids and all(g[0] < tiles for g in grids), f"{what}: grids {grids} for {tiles} query tiles"
        out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, **options)
        n = threshold - 1
        cut = {name: ids[:, :n] for name, ids in options.items() if name == "q_segment_ids"}
        short = kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q[:, :n], k, v, **{**options, **cut}))
        assert "attn_fwd" in short and "attn_fwd_sm90" not in short, f"{what}, {n} queries: {short}"
        causal = options.pop("causal", False)
        check_accuracy(out, lse, q, k, v, None, causal, f"d64 {dtype} {what}", **options)
    if right_edge:
        return
    cu = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, sk, 2 * sk], dtype=torch.int32, device="cuda")
    packed = kernels_launched_by_kernel(
        lambda: fattn.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu_k, sq, sk))
    assert "attn_fwd" in packed and "attn_fwd_sm90" not in packed, f"packed: {packed}"
    softcap = kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q, k, v, softcap=20.0))
    assert "attn_fwd" in softcap and "attn_fwd_sm90" not in softcap, f"softcap: {softcap}"
    causal = kernels_launched_by_kernel(lambda: fattn.flash_attn_func(q, k, v, causal=True))
    want = "attn_fwd_sm90" if sq >= _tuned_crossover(64, True) else "attn_fwd"
    assert want in causal and ({"attn_fwd", "attn_fwd_sm90"} - {want}).isdisjoint(causal), f"causal, {sq}: {causal}"


@pytest.mark.parametrize("softmax_scale", [-0.3, 0.0, 0.02])
def test_any_finite_softmax_scale(softmax_scale):
    # The kernel folds a positive scale into its exp2 after the row maximum, which a scale <= 0
    # would not commute with: those scale first.
    torch.manual_seed(1)
    q, k, v = make_qkv(2, 500, 700, 4, 4, 128, torch.bfloat16, "cuda")
    for causal in (False, True):
        out, lse = fattn.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)
        check_accuracy(out, lse, q, k, v, softmax_scale, causal, f"scale {softmax_scale} causal {causal}")


@pytest.mark.parametrize("head_dim", [72, 96, 104, 128, 136, 192, 256])
def test_strided_views_and_padded_head_dims(head_dim):
    # Row strides far from head_dim (views of a fused buffer, q transposed from [b, h, s, d]):
    # the device-side TMA descriptors take them as they are.
    torch.manual_seed(head_dim)
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, head_dim, torch.bfloat16, "cuda", layout="strided")
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    check_accuracy(out, lse, q, k, v, None, True, f"strided d{head_dim}")


# Causal calls with many more queries than keys: the first 16384 - seqlen_k rows see none. With 8
# heads each (head, sequence) gets 16 programs (csrc/attention/query_tile_programs.cpp), heaviest
# tiles first, so a program runs seven or eight keyless query tiles in a row: at 2048 keys each
# program's first tile has keys, at 300 keys three programs' first tile. For a keyless tile each
# consumer warpgroup waits for its Q and releases it at once (d256 bf16 stages Out in Q's buffer
# and releases it after the store), and the producer answers at once. The calls run in a child
# process, ten each, so that a stalled kernel fails the test instead of hanging the suite.
_KEYLESS_TILES = """
import sys, torch, fattn
from helpers import kernels_launched_by_kernel
from helpers.fp8 import fp8_qkv
d, sk, fp8, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fp8", sys.argv[4]
if fp8:
    q, k, v, qd, kd, vd = fp8_qkv(1, 16384, sk, 8, 2, d, torch.float8_e4m3fn, "cuda", seed=sk + d)
    descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
else:
    torch.manual_seed(sk + d)
    q = torch.randn(1, 16384, 8, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(1, sk, 2, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    descales = {}
call = lambda: fattn.flash_attn_func(q, k, v, causal=True, return_lse=True, **descales)
for _ in range(10):
    out, lse = call()
torch.cuda.synchronize()
names = sorted(kernels_launched_by_kernel(call))
torch.save(dict(q=q, k=k, v=v, out=out, lse=lse, names=names, **descales), path)
"""


@pytest.mark.parametrize("case", ["d128 300", "d128 2048", "d256 2048", "d128 2048 fp8"])
def test_a_run_of_query_tiles_without_keys_does_not_stall(case, tmp_path):
    # The warpgroup barrier between a keyless tile's wait for Q and its release, and the one before
    # passing the turn, keep a slow warp from finding a barrier two phases on, the parity it waits
    # for come round again (aot_build/ptx_passes.py, docs/notes/tuning.md T42; without them the
    # bf16 d128 call at 2048 keys hung every time on an H200).
    import os
    import subprocess
    import sys
    from pathlib import Path

    words = case.split()
    d, sk, fp8 = int(words[0][1:]), int(words[1]), "fp8" in words
    if fp8 and not fp8_kernels_on("cuda"):
        pytest.skip("this build has no FP8 forward kernels")
    path = tmp_path / "result.pt"
    tests = str(Path(__file__).parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    try:
        subprocess.run([sys.executable, "-c", _KEYLESS_TILES, str(d), str(sk), "fp8" if fp8 else "bf16", str(path)],
                       check=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: 16384 queries over {sk} keys, causal: the forward did not finish in 180 s")
    r = torch.load(path)
    q, k, v, out, lse = r["q"], r["k"], r["v"], r["out"], r["lse"]
    assert "attn_fwd_sm90" in r["names"], r["names"]
    keyless = 16384 - sk
    assert torch.all(out[:, :keyless] == 0) and torch.all(lse[..., :keyless] == float("-inf")), case
    # The rows with keys: the same problem as the last sk queries over every key.
    if fp8:
        refs = fp8_references(q[:, keyless:], k, v, r["q_descale"], r["k_descale"], r["v_descale"], None, True)
        check_fp8_accuracy(out[:, keyless:], lse[..., keyless:], refs, what=case)
    else:
        check_accuracy(out[:, keyless:], lse[..., keyless:], q[:, keyless:], k, v, None, True, case)


def test_packed_batch_with_empty_sequences():
    # Empty query spans, empty key spans and both: descriptors of zero rows are never read from or
    # stored through; a query with no key gets out 0 and lse -inf.
    lens_q = [0, 5, 3, 130, 64, 1, 0]
    lens_k = [3, 0, 0, 200, 64, 1, 0]
    heads, kv_heads, d = 4, 2, 128
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(sum(lens_q), heads, d, dtype=torch.bfloat16, device="cuda", generator=g)
    k = torch.randn(sum(lens_k), kv_heads, d, dtype=torch.bfloat16, device="cuda", generator=g)
    v = torch.randn_like(k)
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                           return_lse=True)
    assert not torch.isnan(out).any()
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        qs, ks = int(cu_q[b]), int(cu_k[b])
        if lq == 0:
            continue
        o, l = out[qs:qs + lq], lse[:, qs:qs + lq]
        if lk == 0:
            assert torch.equal(o, torch.zeros_like(o)), f"sequence {b}: out of a query with no key"
            assert torch.isneginf(l).all(), f"sequence {b}: lse of a query with no key"
            continue
        qb, kb, vb = q[None, qs:qs + lq], k[None, ks:ks + lk], v[None, ks:ks + lk]
        ref, ref_lse = attention_reference(qb.double(), kb.double(), vb.double(), None, True)
        low, _ = attention_reference(qb, kb, vb, None, True, dtype=torch.bfloat16)
        err = (o.double() - ref[0]).abs().max().item()
        base = (low[0].double() - ref[0]).abs().max().item()
        assert err <= 2 * base + 1e-5, f"sequence {b}: out error {err:.3e} > 2 x torch error {base:.3e}"
        finite = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isfinite(l), finite), f"sequence {b}: lse -inf pattern"
        assert (l[finite].double() - ref_lse[0][finite]).abs().max().item() <= 5e-3, f"sequence {b}: lse"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["d64 1600x1500", "d64 1600x1500 left-window", "d120 1000x1300",
                                  "d120 1000x1300 causal", "d128 LIMITx700 causal", "d128 333x2048"])
def test_dense_calls_up_to_the_limit_take_host_made_maps(case, dtype):
    # csrc/attention/forward_cuda.cpp: dense 16-bit calls with plain scores, up to the library's
    # host_maps_up_to_rows() query rows (LIMIT: that many), that run the looping kernel take Q, K,
    # V and Out as maps the host made (attn_fwd_sm90_maps).
    # The maps clip rows and columns as the kernel's own descriptors do, so its output must be the
    # same to the bit as that of the same call with K as a view that broadcasts over the KV heads
    # (a stride of 0, which no map takes: the kernel then makes its descriptors), and right
    # against float64.
    words = case.split()
    d = int(words[0][1:])
    sq, sk = (host_maps_up_to_rows() if x == "LIMIT" else int(x) for x in words[1].split("x"))
    options = {"causal": dict(causal=True), "left-window": dict(window_size=(300, -1))}.get(words[-1], {})
    torch.manual_seed(sq + sk + d)
    q, k, v = make_qkv(2, sq, sk, 8, 2, d, dtype, "cuda")
    broadcast = k[:, :, :1].expand(-1, -1, 2, -1)
    assert broadcast.stride(2) == 0
    k = broadcast.contiguous()
    maps = kernels_launched(lambda: fattn.flash_attn_func(q, k, v, **options))
    own = kernels_launched(lambda: fattn.flash_attn_func(q, broadcast, v, **options))
    assert "attn_fwd_sm90_maps" in maps and "attn_fwd_sm90" not in maps, maps
    assert "attn_fwd_sm90" in own and "attn_fwd_sm90_maps" not in own, own
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, **options)
    out_own, lse_own = fattn.flash_attn_func(q, broadcast, v, return_lse=True, **options)
    assert torch.equal(out, out_own) and torch.equal(lse, lse_own), case
    causal = options.pop("causal", False)
    check_accuracy(out, lse, q, k, v, None, causal, case, **options)


@pytest.mark.parametrize("case", ["a row past the limit", "packed", "softcap", "fp16 rows unaligned"])
def test_other_calls_keep_the_kernels_own_descriptors(case):
    # Past host_maps_up_to_rows() query rows (the maps measured slower at d128 4k: docs/notes/tuning.md T39), packed
    # sequences (a map does not stop at a sequence's end), score modifications (no HOST_MAPS
    # variant) and tensors a map cannot take run attn_fwd_sm90 with its own descriptors.
    n = host_maps_up_to_rows() + 1 if case == "a row past the limit" else 1000
    torch.manual_seed(n)
    q, k, v = make_qkv(1, n, n, 4, 2, 128, torch.float16 if case.startswith("fp16") else torch.bfloat16, "cuda")
    if case == "packed":
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        names = kernels_launched(lambda: fattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, n, n))
    elif case == "softcap":
        names = kernels_launched(lambda: fattn.flash_attn_func(q, k, v, softcap=30.0))
    elif case == "fp16 rows unaligned":
        # A view whose base is 8 bytes past a 16-byte boundary: the op copies it (aligned_for_kernel),
        # and maps are chosen from the tensors as given, so this call keeps its descriptors.
        wide = torch.randn(1, n, 4, 132, dtype=torch.float16, device="cuda")
        q = wide[..., 4:]
        names = kernels_launched(lambda: fattn.flash_attn_func(q, k, v))
    else:
        names = kernels_launched(lambda: fattn.flash_attn_func(q, k, v))
    assert "attn_fwd_sm90" in names and "attn_fwd_sm90_maps" not in names, (case, names)
