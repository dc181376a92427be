"""Property-based fuzzing of what a port from flash-attn meets (hypothesis, CPU; the settings and
the example counts of tests/test_fuzz_cpu.py): window_size and the scalar arguments in every form
flash-attn takes, one window rule for every entry point; non-finite values that reach the outputs;
gradients that are computed or refused, never dropped; pages that two sequences append into;
paged varlen errors that name the caller's arguments; empty problems with broadcast biases."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fattn
from fattn.reference import attention_reference
from helpers import KVCache, paged_varlen_inputs
from helpers.fuzz import DERANDOMIZE, EXAMPLES, check_rejected, count_example

F64 = torch.float64
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAN, INF = float("nan"), float("inf")


def _randn(g, *shape):
    return torch.randn(*shape, dtype=F64, generator=g)


def _entry_points(g):
    """name -> fn(**kw) of every public function that takes window_size, on one random problem."""
    q, k, v = _randn(g, 2, 9, 4, 16), _randn(g, 2, 11, 2, 16), _randn(g, 2, 11, 2, 16)
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 5, 11], dtype=torch.int32)
    caches = _randn(g, 2, 32, 2, 16), _randn(g, 2, 32, 2, 16)
    paged = paged_varlen_inputs([4, 6], [30, 50], 4, 2, 16, 16, F64, "cpu")
    return {
        "flash_attn_func": lambda **kw: fattn.flash_attn_func(q, k, v, **kw),
        "flash_attn_varlen_func": lambda **kw: fattn.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 5, 6,
                                                                            **kw),
        "flash_attn_with_kvcache": lambda **kw: fattn.flash_attn_with_kvcache(q, *caches, cache_seqlens=20, **kw),
        "paged varlen": lambda **kw: fattn.flash_attn_varlen_func(*paged[:5], 6, 50, block_table=paged[5], **kw),
    }


_SIDES = st.one_of(st.integers(-9, 40), st.sampled_from([-1, -2, 2**31, 2**62, 2**63 - 1, 2**64, 2**70]))


def _in_form(left, right, form):
    if form == "tensor" and all(-2**63 <= s < 2**63 for s in (left, right)):
        return torch.tensor([left, right])
    if form == "numpy" and all(-2**63 <= s < 2**63 for s in (left, right)):
        return (np.int64(left), np.int64(right))
    return [left, right] if form == "list" else (left, right)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.sampled_from(["flash_attn_func", "flash_attn_varlen_func",
                                                   "flash_attn_with_kvcache", "paged varlen"]),
       _SIDES, _SIDES, st.sampled_from(["tuple", "list", "tensor", "numpy"]), st.booleans())
def test_one_window_rule_in_every_form(seed, entry, left, right, form, causal):
    count_example("window_size forms and rule")
    call = _entry_points(torch.Generator().manual_seed(seed))[entry]
    window = _in_form(left, right, form)
    if left < -1 or right < -1:
        with pytest.raises(RuntimeError, match=r"window_size is .*expected each side -1 \(unbounded\) or >= 0"):
            call(window_size=window, causal=causal)
        return
    # A side wider than any sequence here bounds nothing: the same as -1.
    plain = tuple(-1 if s > 1000 else s for s in (left, right))
    assert torch.equal(call(window_size=window, causal=causal), call(window_size=plain, causal=causal))


@st.composite
def poisoned_case(draw):
    return dict(seed=draw(st.integers(0, 2**31 - 1)), where=draw(st.sampled_from(["q", "k", "bias", "slope", "sink"])),
                value=draw(st.sampled_from([NAN, INF, -INF])), causal=draw(st.booleans()),
                seqlen_q=draw(st.integers(1, 9)), seqlen_k=draw(st.integers(1, 9)), group=draw(st.sampled_from([1, 2])))


@FUZZ
@given(poisoned_case())
def test_a_non_finite_value_reaches_the_outputs_as_the_reference_says(c):
    """NaN or an infinity in q, k, a bias, a sink or an ALiBi slope: the CPU implementation and the
    reference agree on every output, NaNs included; no NaN turns into a row that sees no key."""
    count_example("non-finite inputs")
    g = torch.Generator().manual_seed(c["seed"])
    heads = 2 * c["group"]
    q, k, v = _randn(g, 2, c["seqlen_q"], heads, 8), _randn(g, 2, c["seqlen_k"], 2, 8), _randn(g, 2, c["seqlen_k"], 2, 8)
    kw = dict(causal=c["causal"], alibi_slopes=torch.rand(heads, generator=g) * 0.5,
              bias=_randn(g, 2, heads, c["seqlen_q"], c["seqlen_k"]), sinks=torch.randn(heads, generator=g))
    pick = [int(torch.randint(n, (1,), generator=g)) for n in (2, c["seqlen_q"], heads, 8, c["seqlen_k"])]
    b, i, h, d, j = pick
    if c["where"] == "q":
        q[b, i, h, d] = c["value"]
    elif c["where"] == "k":
        k[b, j, h % 2, d] = c["value"]
    elif c["where"] == "bias":
        kw["bias"][b, h, i, j] = c["value"]
    elif c["where"] == "slope":
        kw["alibi_slopes"][h] = c["value"]
    else:
        kw["sinks"][h] = c["value"]
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, **kw)
    want, want_lse = attention_reference(q, k, v, **kw)
    assert torch.equal(lse.isnan(), want_lse.isnan()), "NaN rows of lse differ from the reference's"
    assert torch.equal(out.isnan(), want.isnan()), "NaN entries of out differ from the reference's"
    assert torch.allclose(lse.nan_to_num(0.0), want_lse.nan_to_num(0.0), rtol=0, atol=1e-10)
    assert torch.allclose(out.nan_to_num(0.0), want.nan_to_num(0.0), rtol=0, atol=1e-10)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.lists(st.booleans(), min_size=2, max_size=2),
       st.booleans(), st.sampled_from([5, 8, 13]))
def test_merge_gradients_reach_every_input(seed, splits, needs, as_list, head_dim):
    """merge_attention_states under autograd: every input that requires grad gets the gradient of
    the plain logsumexp formula."""
    count_example("merge_attention_states gradients")
    g = torch.Generator().manual_seed(seed)
    outs, lses = _randn(g, splits, 1, 3, 2, head_dim), 2 * _randn(g, splits, 1, 2, 3)
    lses[torch.rand(lses.shape, generator=g) < 0.2] = -INF
    outs.requires_grad_(needs[0] or not needs[1])
    lses.requires_grad_(needs[1])
    w_out, w_lse = _randn(g, 1, 3, 2, head_dim), _randn(g, 1, 2, 3)
    args = (list(outs.unbind(0)), list(lses.unbind(0))) if as_list else (outs, lses)
    out, lse = fattn.merge_attention_states(*args)
    got = torch.autograd.grad((out * w_out).sum() + (lse.nan_to_num(0.0, 0.0, 0.0) * w_lse).sum(),
                              [t for t in (outs, lses) if t.requires_grad])
    want_lse = torch.logsumexp(lses, 0)
    safe = torch.where(want_lse == -INF, 0.0, want_lse)
    weights = torch.exp(lses - safe)
    want_out = (weights.permute(0, 1, 3, 2)[..., None] * outs).sum(0)
    total = (want_out * w_out).sum() + (torch.where(want_lse == -INF, 0.0, want_lse) * w_lse).sum()
    want = torch.autograd.grad(total, [t for t in (outs, lses) if t.requires_grad])
    for a, b in zip(got, want):
        assert a is not None and torch.allclose(a, b.nan_to_num(0.0), rtol=1e-9, atol=1e-9)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.sampled_from(["flash_attn_with_kvcache", "paged varlen"]),
       st.sampled_from(["q", "k", "v"]))
def test_forward_only_functions_refuse_the_backward(seed, entry, which):
    count_example("forward-only backward refused")
    g = torch.Generator().manual_seed(seed)
    if entry == "paged varlen":
        q, k, v, cu_q, cu_k, table = paged_varlen_inputs([3, 5], [20, 33], 4, 2, 16, 16, F64, "cpu")
        inputs = {"q": q, "k": k, "v": v}
        inputs[which] = inputs[which].requires_grad_()
        out = fattn.flash_attn_varlen_func(inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, 5, 33,
                                           block_table=table)
    else:
        inputs = {"q": _randn(g, 2, 3, 4, 16), "k": _randn(g, 2, 2, 2, 16), "v": _randn(g, 2, 2, 2, 16)}
        inputs[which] = inputs[which].requires_grad_()
        out = fattn.flash_attn_with_kvcache(inputs["q"], _randn(g, 2, 32, 2, 16), _randn(g, 2, 32, 2, 16),
                                            inputs["k"], inputs["v"], cache_seqlens=7)
    with pytest.raises(RuntimeError, match="has no backward"):
        out.sum().backward()


@FUZZ
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 40), min_size=2, max_size=3), st.integers(0, 4),
       st.integers(0, 2), st.integers(0, 2), st.integers(0, 2))
def test_pages_one_sequence_appends_into_belong_to_it_alone(seed, lengths, new, victim, thief, column):
    """Two sequences share a page (one block_table entry copied over another's): refused when a
    sequence appends into a page another one uses, before any write; otherwise the call runs."""
    count_example("shared appended pages")
    torch.manual_seed(seed)
    batch = len(lengths)
    victim, thief = victim % batch, thief % batch
    cache = KVCache(batch, 48, 2, 16, F64, "cpu", page_size=16)
    table = cache.block_table
    table[thief, column] = table[victim, column]
    q = torch.randn(batch, 1, 4, 16, dtype=F64)
    k = v = None
    if new:
        k, v = torch.randn(batch, new, 2, 16, dtype=F64), torch.randn(batch, new, 2, 16, dtype=F64)

    def pages(b, first, stop):  # the pages of key positions [first, stop) of sequence b
        return {int(table[b, p]) for p in range(first // 16, -(-stop // 16))} if stop > first else set()

    conflict = any(pages(a, lengths[a], lengths[a] + new) & pages(b, 0, lengths[b] + new)
                   for a in range(batch) for b in range(batch) if a != b) if new else False
    call = lambda **a: fattn.flash_attn_with_kvcache(**a)  # noqa: E731
    args = dict(q=q, k_cache=cache.k_cache, v_cache=cache.v_cache, k=k, v=v, block_table=table,
                cache_seqlens=torch.tensor(lengths, dtype=torch.int32))
    if conflict:
        check_rejected(call, args, "block_table", "an appended page another sequence uses")
    else:
        call(**args)


PAGED_BREAKS = [
    ("negative key count", lambda a: a.update(cu_seqlens_k=torch.tensor([0, 30, 20], dtype=torch.int32)),
     "cu_seqlens_k"),
    ("more keys than block_table holds", lambda a: a.update(cu_seqlens_k=torch.tensor([0, 30, 300], dtype=torch.int32)),
     "block_table"),
    ("negative seqused_k", lambda a: a.update(seqused_k=torch.tensor([-3, 5], dtype=torch.int32)), "seqused_k"),
    ("page out of range", lambda a: a["block_table"].__setitem__((1, 0), 10**4), "block_table"),
    ("k dtype", lambda a: a.update(k=a["k"].float()), "k"),
    ("v shape", lambda a: a.update(v=a["v"][:, :, :1]), "v"),
    ("pages of 8 keys", lambda a: a.update(k=a["k"].reshape(-1, 8, 2, 16), v=a["v"].reshape(-1, 8, 2, 16)), "k"),
    ("int64 block_table", lambda a: a.update(block_table=a["block_table"].long()), "block_table"),
    ("cu_seqlens_q size", lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"][:2]), "cu_seqlens_q"),
]


@FUZZ
@given(st.integers(0, 2**31 - 1), st.sampled_from(PAGED_BREAKS))
def test_paged_varlen_errors_name_the_caller_s_arguments(seed, broken):
    what, change, name = broken
    count_example("paged varlen invalid")
    torch.manual_seed(seed)
    q, k, v, cu_q, cu_k, table = paged_varlen_inputs([3, 5], [20, 33], 4, 2, 16, 16, F64, "cpu")
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=33,
                block_table=table)
    change(args)
    check_rejected(fattn.flash_attn_varlen_func, args, name, what)
    with pytest.raises(RuntimeError) as error:
        fattn.flash_attn_varlen_func(**args)
    assert "cache_seqlens" not in str(error.value) and "k_cache" not in str(error.value), str(error.value)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 3), min_size=3, max_size=3),
       st.lists(st.booleans(), min_size=4, max_size=4), st.booleans())
def test_empty_problems_take_broadcast_biases(seed, sizes, broadcast, requires_grad):
    """A problem with no batch, query or key (any of them 0) and a bias of size-1 dims: no error,
    the shapes of the contract, and gradients of the same shapes."""
    count_example("empty problems with broadcast biases")
    batch, seqlen_q, seqlen_k = sizes
    g = torch.Generator().manual_seed(seed)
    q, k, v = (_randn(g, batch, s, 2, 16).requires_grad_(requires_grad) for s in (seqlen_q, seqlen_k, seqlen_k))
    shape = [1 if b else n for b, n in zip(broadcast, (batch, 2, seqlen_q, seqlen_k))]
    bias = _randn(g, *shape).requires_grad_(requires_grad)
    out, lse = fattn.flash_attn_func(q, k, v, bias=bias, return_lse=True)
    assert out.shape == q.shape and lse.shape == (batch, 2, seqlen_q)
    want, want_lse = attention_reference(q, k, v, bias=bias)
    assert torch.allclose(out, want, rtol=0, atol=1e-10) and torch.equal(lse.isinf(), want_lse.isinf())
    if requires_grad and out.numel():
        grads = torch.autograd.grad(out.sum(), (q, k, v, bias), allow_unused=False)
        assert [t.shape for t in grads] == [t.shape for t in (q, k, v, bias)]


_INT_FORMS = [int, np.int32, np.int64, lambda n: torch.tensor(n), lambda n: torch.tensor(n, dtype=torch.int32)]
_FLOAT_FORMS = [float, np.float32, np.float64]


@FUZZ
@given(st.integers(0, 2**31 - 1), st.sampled_from(_INT_FORMS), st.sampled_from(_FLOAT_FORMS), st.integers(1, 30),
       st.sampled_from([None, "float", "str", "bool"]))
def test_scalars_in_every_form_flash_attn_takes(seed, int_form, float_form, cached, wrong):
    """Lengths as ints, numpy ints or 0-d integer tensors, scales as Python or numpy floats: the same
    results as plain Python numbers; a float, a string or a bool where an int belongs is a TypeError
    that names the argument."""
    count_example("scalar argument forms")
    g = torch.Generator().manual_seed(seed)
    q, k, v = _randn(g, 11, 4, 16), _randn(g, 13, 2, 16), _randn(g, 13, 2, 16)
    cu_q, cu_k = torch.tensor([0, 5, 11], dtype=torch.int32), torch.tensor([0, 6, 13], dtype=torch.int32)
    want = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, softmax_scale=0.25, causal=True)
    got = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, int_form(6), int_form(7), softmax_scale=float_form(0.25),
                                       causal=True)
    assert torch.equal(got, want)
    caches = _randn(g, 1, 32, 2, 16), _randn(g, 1, 32, 2, 16)
    want = fattn.flash_attn_with_kvcache(q[None, :2], *caches, cache_seqlens=cached, softcap=2.0)
    scalar = int_form if int_form in (int, np.int32, np.int64) else np.int64  # (a tensor is one length per sequence)
    got = fattn.flash_attn_with_kvcache(q[None, :2], *caches, cache_seqlens=scalar(cached), softcap=float_form(2.0))
    assert torch.equal(got, want)
    if wrong is not None:
        bad = {"float": 6.0, "str": "6", "bool": True}[wrong]
        with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
            fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, bad, 7)
