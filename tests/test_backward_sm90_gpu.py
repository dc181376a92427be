"""The Hopper dK/dV kernel (triton_src/backward_sm90.py: the Gluon kernel configs.json builds as
attn_bwd_dkdv's sm_90 implementation for the 64, 96, 128 and 256 buckets; 96 is its alone, the
head dim in two pieces) on a Hopper GPU (skipped
elsewhere, and where the build lacks it): which kernel serves which call, and the inputs only its
TMA path meets (a key tile's second half past the end, query tiles past the end, GQA groups walked
through one descriptor, row strides far from head_dim, padded head dims, empty packed sequences),
every gradient against float64 with the 2x rule. The op-level backward suites run through it as
well on Hopper.

At d64 with deterministic=False (flash-attn's default, and these tests') the kernel also
accumulates dQ (ACCUMULATE_DQ: bulk TMA reductions into a float32 tensor the op converts), so the
cases here with d40-d64 check that path: query rows past the end and GQA groups through the
accumulator's descriptor, packed sequences, padded head dims; deterministic=True keeps attn_bwd_dq
and stays bitwise reproducible. At d128 without score modifications dQ comes from the Hopper dQ
kernel (triton_src/backward_dq_sm90.py, attn_bwd_dq's sm_90 implementation) either way, and with a
softcap or ALiBi under deterministic=True, so the d72 to d128 cases here check its TMA path too
(query rows past the end, GQA, windows, padded head dims, row strides, empty packed sequences).
A bias that TMA can read runs both kernels' SCORE_MOD bias_tma (d bias and dropout too), checked here
with its gradients."""

import pytest
import torch

import fattn
from fattn._library import backward_host_maps_up_to_rows
from fattn.reference import attention_reference
from helpers import (
    check_gradients, check_loss_gradients, check_variant_gradients, hopper_variants, kernels_launched,
    kernels_launched_by_kernel, launch_args, loss_gradients, make_qkv, requires_gpu,
)


def _hopper_build():
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        return False
    return any(e["function"] == "attn_bwd_dkdv_sm90" for e in fattn.build_info()["kernels"])


pytestmark = [requires_gpu, pytest.mark.gpu,
              pytest.mark.skipif(not _hopper_build(), reason="needs a Hopper GPU and a build with attn_bwd_dkdv_sm90")]


def _backward(q, k, v, p=0.0, **options):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fattn.flash_attn_func(q, k, v, p, **options)
    out.backward(torch.ones_like(out))


@pytest.mark.parametrize("head_dim,options", [
    (128, dict()), (128, dict(causal=True)), (96, dict(window_size=(100, 0))), (64, dict()),
    (64, dict(softcap=30.0, causal=True)), (40, dict(causal=True)), (256, dict(causal=True)),
    (200, dict(softcap=30.0)),
], ids=["d128", "d128-causal", "d96-window", "d64", "d64-softcap", "d40-causal", "d256-causal", "d200-softcap"])
def test_the_hopper_kernel_serves_its_buckets(head_dim, options):
    q, k, v = make_qkv(2, 300, 300, 4, 2, head_dim, torch.bfloat16, "cuda")
    names = kernels_launched_by_kernel(lambda: _backward(q, k, v, **options))
    assert "attn_bwd_dkdv_sm90" in names, names


def _dkdv_variant_shared(constants: dict) -> set[int]:
    return {e["shared"] for e in hopper_variants("attn_bwd_dkdv_sm90", constants)}


@pytest.mark.parametrize("head_dim,deterministic,softcap", [(80, False, 0.0), (96, True, 0.0), (96, False, 30.0)])
def test_head_dims_up_to_96_run_the_96_bucket(head_dim, deterministic, softcap):
    # The 96 bucket (64 + 32 columns) has no dQ accumulation: the op falls back to its split
    # variant rather than to the 128 bucket. The two buckets' variants differ in shared memory,
    # which the profiler reports per launch.
    q, k, v = make_qkv(2, 300, 300, 4, 2, head_dim, torch.bfloat16, "cuda")
    score_mod = "softcap_alibi" if softcap else "plain"
    shared = launch_args(lambda: _backward(q, k, v, deterministic=deterministic, softcap=softcap),
                         "attn_bwd_dkdv_sm90", "shared memory")
    want = _dkdv_variant_shared({"BLOCK_D": 96, "SCORE_MOD": score_mod, "ACCUMULATE_DQ": 0})
    other = _dkdv_variant_shared({"BLOCK_D": 128, "SCORE_MOD": score_mod})
    assert len(want) == 1 and not want & other, (want, other)
    assert shared and set(shared) <= want, f"launched with shared memory {shared}; the 96 bucket's is {want}"


@pytest.mark.parametrize("what", ["dropout", "d128 softcap deterministic", "d256 dropout", "head_dim 32"])
def test_other_calls_stay_on_attn_bwd_dkdv(what):
    d = {"d256 dropout": 256, "head_dim 32": 32}.get(what, 128)
    q, k, v = make_qkv(2, 300, 300, 4, 2, d, torch.bfloat16, "cuda")
    # d128 softcap: the 128-key form spills there; only with dQ accumulated (deterministic=False)
    # does the wide-head form take it.
    options = dict(softcap=30.0, deterministic=True) if "softcap" in what else {}
    p = 0.1 if "dropout" in what else 0.0
    names = kernels_launched_by_kernel(lambda: _backward(q, k, v, p, **options))
    assert "attn_bwd_dkdv" in names and "attn_bwd_dkdv_sm90" not in names, names


@pytest.mark.parametrize("head_dim,deterministic,options,served_by", [
    (64, False, dict(), "attn_bwd_dkdv_sm90"), (64, False, dict(softcap=30.0, causal=True), "attn_bwd_dkdv_sm90"),
    (40, False, dict(window_size=(50, 0)), "attn_bwd_dkdv_sm90"), (64, True, dict(), "attn_bwd_dq"),
    (128, False, dict(), "attn_bwd_dq_sm90"), (128, True, dict(causal=True), "attn_bwd_dq_sm90"),
    (72, False, dict(window_size=(30, 30)), "attn_bwd_dq_sm90"), (64, False, dict(p=0.1), "attn_bwd_dq"),
    (128, False, dict(softcap=30.0), "attn_bwd_dkdv_sm90"), (96, False, dict(softcap=30.0), "attn_bwd_dq_sm90"),
    (128, True, dict(softcap=30.0), "attn_bwd_dq_sm90"), (128, False, dict(p=0.1), "attn_bwd_dq"),
    (256, False, dict(), "attn_bwd_dq"), (128, False, dict(alibi=True), "attn_bwd_dq_sm90"),
    (128, False, dict(alibi=True, softcap=30.0), "attn_bwd_dkdv_sm90"),
], ids=["d64", "d64-softcap", "d40-window", "d64-deterministic", "d128", "d128-causal-deterministic",
        "d72-window", "d64-dropout", "d128-softcap", "d96-softcap", "d128-softcap-deterministic", "d128-dropout",
        "d256", "d128-alibi", "d128-alibi-softcap"])
def test_which_kernel_computes_dq(head_dim, deterministic, options, served_by):
    # served_by: the kernel that computes dQ. A dQ kernel runs exactly when the dK/dV pass does
    # not accumulate it (configs.json builds ACCUMULATE_DQ for d64 SCORE_MOD plain and
    # softcap_alibi and d128 softcap_alibi only; d65-d96 take the 96 bucket, which has none, and
    # d128 ALiBi without a softcap its alibi_only variant, which has none); from d65 to d128 without bias or dropout it is the Hopper one
    # (attn_bwd_dq_sm90).
    q, k, v = make_qkv(2, 300, 300, 4, 2, head_dim, torch.bfloat16, "cuda")
    options = dict(options)
    p = options.pop("p", 0.0)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(4, device="cuda") * 0.3
    names = kernels_launched_by_kernel(lambda: _backward(q, k, v, p, deterministic=deterministic, **options))
    dq_kernels = names & {"attn_bwd_dq", "attn_bwd_dq_sm90"}
    assert dq_kernels == (set() if served_by == "attn_bwd_dkdv_sm90" else {served_by}), names


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_true_is_bitwise_reproducible_and_false_agrees(head_dim):
    torch.manual_seed(11)
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, head_dim, torch.bfloat16, "cuda")
    w = torch.randn(2, 1000, 8, head_dim, device="cuda", dtype=torch.bfloat16)

    def grads(deterministic):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fattn.flash_attn_func(*leaves, causal=True, deterministic=deterministic)
        return torch.autograd.grad(out, leaves, w)

    first, second = grads(True), grads(True)
    for a, b, name in zip(first, second, ("dq", "dk", "dv")):
        assert torch.equal(a, b), f"deterministic=True: {name} differs between two runs"
    accumulated = grads(False)
    for a, b, name in zip(first, accumulated, ("dq", "dk", "dv")):
        # d64: dK and dV come from the same products in the same order; dQ from other kernels
        # (attn_bwd_dq recomputes P in its own orientation, so a dS element may round to another
        # bf16, and sums in another order; both round float32 sums once): within 2 bf16 ulps of the
        # largest. d128 (no score modification) runs the split path either way, attn_bwd_dq_sm90
        # included: all three exactly equal.
        tol = 0 if name != "dq" or head_dim == 128 else 2 * torch.finfo(torch.bfloat16).eps * a.abs().max().item()
        assert (a.float() - b.float()).abs().max().item() <= tol, name


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("seqlen_k", [1, 63, 64, 65, 127, 129, 1000])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_key_tile_halves_past_the_end(seqlen_k, dtype, head_dim):
    # The second consumer warpgroup's 64 keys start past seqlen_k for seqlen_k <= 64 and straddle
    # it for 65..127 (d256: its 32 of a 64-key tile, for seqlen_k <= 32 and 33..63, and the next
    # tile's for 65..127): dK/dV rows past the end must not be stored (they would land in the next
    # batch entry's keys), and the ones before it must be right.
    torch.manual_seed(seqlen_k)
    q, k, v = make_qkv(2, 333, seqlen_k, 8, 2, head_dim, dtype, "cuda")
    for causal in (False, True):
        check_variant_gradients(q, k, v, f"seqlen_k {seqlen_k} causal {causal}", causal=causal)


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("seqlen_q", [1, 63, 65, 1000])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (1, 1)])
def test_query_tiles_past_the_end_and_gqa_groups(seqlen_q, heads, kv_heads, head_dim):
    # Q and dO rows past seqlen_q come in as TMA's zeros and their lse as +inf (P = 0); a kv head's
    # group of query heads is walked through one [seqlen_q, group, head_dim] descriptor.
    torch.manual_seed(seqlen_q * heads + kv_heads)
    q, k, v = make_qkv(2, seqlen_q, 300, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    for causal in (False, True):
        check_variant_gradients(q, k, v, f"seqlen_q {seqlen_q} {heads}/{kv_heads} causal {causal}", causal=causal)


@pytest.mark.parametrize("seqlen_q", [1, 63, 65, 1000])
@pytest.mark.parametrize("heads,kv_heads", [(8, 1), (4, 4)])
@pytest.mark.parametrize("head_dim", [72, 128])
def test_softcap_with_dq_accumulated_in_the_wide_head_form(seqlen_q, heads, kv_heads, head_dim):
    # d65-d128 with a softcap: 64-key tiles, dQ reduced per query tile from both warpgroups'
    # columns; query rows past the end clipped by the accumulator's descriptor.
    torch.manual_seed(seqlen_q + head_dim)
    q, k, v = make_qkv(2, seqlen_q, 300, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    for causal in (False, True):
        check_variant_gradients(q, k, v, f"softcap seqlen_q {seqlen_q} {heads}/{kv_heads} causal {causal}",
                                causal=causal, softcap=30.0)


@pytest.mark.parametrize("seqlen_q", [1, 65, 1000])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("head_dim", [72, 128])
def test_score_modifications_through_the_hopper_dq_kernel(seqlen_q, heads, kv_heads, head_dim):
    # deterministic=True with a softcap or ALiBi at d65-d128: the split path, whose dQ comes from
    # attn_bwd_dq_sm90 with the softcap's derivative and the ALiBi slope in its dS.
    torch.manual_seed(seqlen_q + 7 * head_dim)
    q, k, v = make_qkv(2, seqlen_q, 700, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    slopes = torch.rand(heads, device="cuda") * 0.3
    for causal in (False, True):
        check_variant_gradients(q, k, v, f"softcap seqlen_q {seqlen_q} causal {causal}", causal=causal,
                                deterministic=True, softcap=30.0)
        check_variant_gradients(q, k, v, f"alibi seqlen_q {seqlen_q} causal {causal}", causal=causal,
                                deterministic=True, alibi_slopes=slopes)


@pytest.mark.parametrize("head_dim", [40, 56, 72, 80, 96, 104, 128, 136, 200, 256])
def test_strided_views_and_padded_head_dims(head_dim):
    torch.manual_seed(head_dim)
    q, k, v = make_qkv(2, 700, 900, 8, 2, head_dim, torch.bfloat16, "cuda", layout="strided")
    check_variant_gradients(q, k, v, f"strided d{head_dim}", causal=True)


@pytest.mark.parametrize("options", [dict(window_size=(100, 37)), dict(softcap=20.0, alibi_slopes="heads")],
                         ids=["window", "softcap-alibi"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_windows_and_score_modifications(options, head_dim):
    torch.manual_seed(5)
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, head_dim, torch.bfloat16, "cuda")
    if options.get("alibi_slopes") == "heads":
        options = dict(options, alibi_slopes=torch.rand(8, device="cuda") * 0.3)
    check_variant_gradients(q, k, v, str(options), causal=True, **options)


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("seqlen_q,seqlen_k,heads,kv_heads", [(1000, 1000, 8, 2), (333, 1000, 4, 4), (1000, 129, 8, 1)])
def test_alibi_without_softcap_runs_its_own_variant(seqlen_q, seqlen_k, heads, kv_heads, head_dim):
    # ALiBi without a softcap: the Hopper kernel's SCORE_MOD alibi_only variants (the 128-key form, its code
    # without the softcap's; at d64 with dQ accumulated unless deterministic), where at d128
    # softcap_alibi ran attn_bwd_dkdv (deterministic) or the wide-head form with dQ accumulated.
    # Gradients against float64 with ALiBi offsets from the diagonal (seqlen_q != seqlen_k),
    # windows and GQA.
    torch.manual_seed(seqlen_q + seqlen_k + heads + head_dim)
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, heads, kv_heads, head_dim, torch.bfloat16, "cuda")
    slopes = torch.rand(2, heads, device="cuda") * 0.3
    names = kernels_launched_by_kernel(lambda: _backward(q, k, v, alibi_slopes=slopes, deterministic=True))
    assert "attn_bwd_dkdv_sm90" in names and "attn_bwd_dkdv" not in names, names
    for options in (dict(causal=True), dict(), dict(window_size=(200, 50))):
        check_variant_gradients(q, k, v, f"alibi {options}", alibi_slopes=slopes, **options)


@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_packed_batch_with_empty_sequences(d):
    # Empty query spans, empty key spans and both: their descriptors have no rows and are never
    # read; keys with no query get dK = dV = 0, and every sequence's gradients are its own.
    lens_q = [0, 5, 3, 130, 64, 1, 0, 200]
    lens_k = [3, 0, 0, 200, 64, 1, 0, 129]
    heads, kv_heads = 4, 2
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(sum(lens_q), heads, d, dtype=torch.bfloat16, device="cuda", generator=g).requires_grad_()
    k = torch.randn(sum(lens_k), kv_heads, d, dtype=torch.bfloat16, device="cuda", generator=g).requires_grad_()
    v = torch.randn(sum(lens_k), kv_heads, d, dtype=torch.bfloat16, device="cuda", generator=g).requires_grad_()
    w = torch.randn(sum(lens_q), heads, d, device="cuda", generator=g)
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    dq, dk, dv = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        qs, ks = int(cu_q[b]), int(cu_k[b])
        got = (dq[qs:qs + lq], dk[ks:ks + lk], dv[ks:ks + lk])
        if lq == 0 or lk == 0:
            for t, name in zip(got, ("dq", "dk", "dv")):
                assert torch.equal(t, torch.zeros_like(t)), f"sequence {b}: {name} of an empty attention"
            continue
        qb, kb, vb = q[None, qs:qs + lq].detach(), k[None, ks:ks + lk].detach(), v[None, ks:ks + lk].detach()
        ref = _out_gradients(qb.double(), kb.double(), vb.double(), w[None, qs:qs + lq].double(), torch.float64)
        low = _out_gradients(qb, kb, vb, w[None, qs:qs + lq], torch.bfloat16)
        check_gradients([t[None] for t in got], ref, low, torch.bfloat16, what=f"sequence {b}")


def _out_gradients(q, k, v, w, dtype):
    """d sum(out * w) / d(q, k, v) of the causal reference (its lse is -inf on rows that see no
    key, so it stays out of the loss)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, _ = attention_reference(q, k, v, None, True, dtype=dtype)
    return torch.autograd.grad((out.to(w.dtype) * w).sum(), (q, k, v))


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("what", ["bias bhqk", "bias 1hqk causal", "mask", "bias+dropout+alibi", "bias window",
                                  "bias rows unaligned", "bias+softcap"])
def test_a_bias_runs_the_hopper_backward(head_dim, what):
    # SCORE_MOD bias_tma (a bias that TMA can read, with dropout and ALiBi, no softcap) in the Hopper
    # dK/dV from d64 to d128 and the Hopper dQ at d128: the bias rows of each query tile come with
    # Q and dO, d bias leaves by TMA stores, dropout's mask is the forward's transposed.
    # seqlen_q != seqlen_k, GQA 8:2 (a bias per head, and a [1, h] one broadcast over the batch,
    # a mask broadcast over the heads), rows that see nothing. A bias whose rows are not 16-byte
    # multiples (900 keys) and a softcap run SCORE_MOD bias_dropout (attn_bwd_dkdv).
    torch.manual_seed(head_dim + len(what))
    b, sq, sk, h, hk = 2, 600, 900 if what == "bias rows unaligned" else 904, 8, 2
    dtype = torch.bfloat16
    q, k, v = make_qkv(b, sq, sk, h, hk, head_dim, dtype, "cuda")
    if what == "mask":
        bias = torch.rand(b, 1, sq, sk, device="cuda") > 0.3
        bias[..., sq // 3, :] = False
    else:
        dims = (1, h) if "1hqk" in what else (b, h)
        bias = (torch.randn(*dims, sq, sk, device="cuda") * 2).to(dtype)
    options = {"causal": "causal" in what}
    if "window" in what:
        options["window_size"] = (200, 30)
    if "alibi" in what:
        options["alibi_slopes"] = torch.rand(h, device="cuda") * 0.1
    if "softcap" in what:
        options["softcap"] = 20.0
    p = 0.2 if "dropout" in what else 0.0
    seed = torch.tensor([0xB1A5 + head_dim], dtype=torch.int64, device="cuda")
    with_bias = what != "mask"
    tensors = (q, k, v, bias) if with_bias else (q, k, v)
    op = torch.ops.fattn.forward.default

    def fattn_fn(q, k, v, bias=bias):
        # The public function draws its own seed: the op with a fixed one lets the reference
        # draw the same mask.
        return op(q, k, v, None, options["causal"], False, *options.get("window_size", (-1, -1)),
                  options.get("softcap", 0.0), options.get("alibi_slopes"), None, None, None,
                  fattn._bias.prepare("test", bias, q, k), p, seed)

    def reference(dtype):
        def fn(q, k, v, bias=bias):
            return attention_reference(q, k, v, None, dropout_p=p, dropout_seed=seed, dtype=dtype, bias=bias,
                                       **options)
        return fn

    hopper = "bias rows unaligned" not in what and "softcap" not in what
    names = kernels_launched_by_kernel(lambda: loss_gradients(fattn_fn, tensors, torch.ones(q.shape, device="cuda"),
                                                 torch.zeros(b, h, sq, device="cuda")))
    assert ("attn_bwd_dkdv_sm90" in names) == hopper, names
    assert ("attn_bwd_dkdv" in names) != hopper, names
    if head_dim == 128:
        assert ("attn_bwd_dq_sm90" in names) == hopper, names
    w_out = torch.randn(q.shape, device="cuda")
    w_lse = torch.randn(b, h, sq, device="cuda")
    if what == "mask":  # rows with lse -inf: keep their weight out of the loss
        w_lse = w_lse * torch.isfinite(reference(torch.float64)(q.double(), k.double(), v.double())[1])
    check_loss_gradients(fattn_fn, reference, tensors, w_out, w_lse, dtype, what=f"{what} d{head_dim}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["d64 1000x1300", "d64 700x700 deterministic", "d120 1000x1300 causal",
                                  "d128 333x2048 left-window", "d128 LIMITx300 causal"])
def test_dense_calls_up_to_the_limit_take_host_made_maps(case, dtype):
    # csrc/attention/backward_cuda.cpp: dense 16-bit calls with plain scores, up to the library's
    # backward_host_maps_up_to_rows() query rows (LIMIT: that many), take Q, K, V and dO as maps
    # the host made in the dK/dV kernel (attn_bwd_dkdv_sm90_maps), and with dQ in the Hopper dQ
    # kernel (d128) Q, K, V, dO and dQ in it (attn_bwd_dq_sm90_maps). The maps clip rows and
    # columns as the kernels' own descriptors do: the same call with dO as a view 8 bytes past a
    # 16-byte boundary (no map takes it; the op copies it, and the kernels make their descriptors)
    # must give the same dK and dV to the bit, and dQ too where no reductions in varying order
    # make it (d64 accumulates dQ unless deterministic); and the gradients are right against
    # float64 (through flash_attn_func, whose dO the maps take).
    words = case.split()
    d = int(words[0][1:])
    sq, sk = (backward_host_maps_up_to_rows() if x == "LIMIT" else int(x) for x in words[1].split("x"))
    deterministic, causal = "deterministic" in words, "causal" in words
    window = (300, -1) if "left-window" in words else (-1, 0 if causal else -1)
    torch.manual_seed(sq + sk + d)
    q, k, v = make_qkv(1 if "LIMIT" in case else 2, sq, sk, 8, 2, d, dtype, "cuda")
    out, lse = torch.ops.fattn.forward(q, k, v, causal=causal, window_left=window[0], window_right=window[1])
    dout = torch.randn_like(out)
    wide = torch.empty(*dout.shape[:-1], d + 4, dtype=dtype, device="cuda")
    wide[..., 4:] = dout
    unaligned = wide[..., 4:]
    assert unaligned.data_ptr() % 16 == 8 and torch.equal(unaligned, dout)

    def backward(g):
        return torch.ops.fattn.backward(g, q, k, v, out, lse, None, None, causal, deterministic, window[0], window[1])

    maps = kernels_launched(lambda: backward(dout))
    own = kernels_launched(lambda: backward(unaligned))
    hopper = {"attn_bwd_dkdv_sm90"} | ({"attn_bwd_dq_sm90"} if d > 64 else set())
    with_maps = {f"{name}_maps" for name in hopper}
    assert with_maps <= maps and not maps & hopper, maps
    assert hopper <= own and not own & with_maps, own
    dq, dk, dv, _ = backward(dout)
    dq_own, dk_own, dv_own, _ = backward(unaligned)
    assert torch.equal(dk, dk_own) and torch.equal(dv, dv_own), case
    if deterministic or d > 64:
        assert torch.equal(dq, dq_own), case
    check_variant_gradients(q, k, v, case, causal=causal, deterministic=deterministic,
                            **({"window_size": window} if "left-window" in words else {}))


@pytest.mark.parametrize("case", ["a row past the limit", "packed", "softcap", "d96", "k broadcast"])
def test_other_backward_calls_keep_the_kernels_own_descriptors(case):
    # Past backward_host_maps_up_to_rows() query rows, packed sequences (a map does not stop at a
    # sequence's end), score modifications (no HOST_MAPS variant) and tensors a map cannot take (a
    # K that broadcasts over the KV heads: stride 0) run the Hopper kernels with their own
    # descriptors. d96: the dK/dV kernel's 96 bucket has no HOST_MAPS variant and keeps them, while
    # its dQ runs in the 128 bucket's Hopper dQ kernel, which takes maps of the 96 columns (zero-filled
    # and clipped to the tensor's head dim as its descriptors are).
    n = backward_host_maps_up_to_rows() + 1 if case == "a row past the limit" else 700
    d = 96 if case == "d96" else 128
    torch.manual_seed(n + d)
    q, k, v = make_qkv(1, n, 300 if case == "a row past the limit" else n, 4, 2, d, torch.bfloat16, "cuda")
    if case == "packed":
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        q, k, v = (t[0].detach().requires_grad_() for t in (q, k, v))
        names = kernels_launched(
            lambda: fattn.flash_attn_varlen_func(q, k, v, cu, cu, n, n).backward(torch.ones(q.shape, device="cuda",
                                                                                             dtype=q.dtype)))
    elif case == "k broadcast":
        k = k[:, :, :1].expand(-1, -1, 2, -1)
        names = kernels_launched(lambda: _backward(q, k, v))
    else:
        names = kernels_launched(lambda: _backward(q, k, v, **({"softcap": 30.0} if case == "softcap" else {})))
    maps = {name for name in names if name.endswith("_maps")}
    assert "attn_bwd_dkdv_sm90" in names, (case, names)
    assert maps == ({"attn_bwd_dq_sm90_maps"} if case == "d96" else set()), (case, names)


def test_maps_are_made_on_threads_that_made_no_cuda_call_yet():
    # The host encodes maps with the driver, which needs a current context: a thread that has
    # made no CUDA call of its own has none (autograd's backward thread before its first op, a
    # worker thread). The forward and backward ops, called first thing on a fresh thread, take
    # their maps there and agree to the bit with the same calls on this thread.
    import threading

    torch.manual_seed(5)
    q, k, v = make_qkv(2, 1000, 1000, 4, 2, 128, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)

    def calls():
        out, lse = torch.ops.fattn.forward(q, k, v, causal=True)
        return (out, lse, *torch.ops.fattn.backward(dout, q, k, v, out, lse, None, None, True, True))

    # On this thread first, its results kept on the host: the thread's outputs then reuse the
    # allocator's cached blocks, so no allocation of its own makes a context current for it.
    here = [t.cpu() for t in calls()]
    result, errors = [], []
    thread = threading.Thread(target=lambda: _record(calls, result, errors))
    thread.start()
    thread.join()
    assert not errors, errors
    assert all(torch.equal(a, b.cpu()) for a, b in zip(here[:5], result[0][:5]))
    names = kernels_launched(calls)
    assert {"attn_fwd_sm90_maps", "attn_bwd_dkdv_sm90_maps", "attn_bwd_dq_sm90_maps"} <= names, names


def _record(fn, result, errors):
    try:
        result.append(fn())
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001: the thread's failure is the test's to report
        errors.append(repr(e))
