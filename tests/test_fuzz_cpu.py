"""Property-based fuzzing (hypothesis) of the public functions on CPU: valid calls, drawn over
shapes, GQA ratios, head dims inside and outside the compiled buckets, strided and expanded
views, masks, softcap and the KV-cache options, match the float64 references; invalid calls (one
argument broken at a time, meta tensors included) raise an error naming the argument and leave
every input unchanged. The example count of each property is printed at the end of the run."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fattn
from fattn.reference import attention_reference
from helpers import KVCache, check_paged_varlen, run_decode
from helpers.fuzz import DERANDOMIZE, EXAMPLES, check_rejected, count_example

F64 = torch.float64
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HEAD_DIMS = [1, 7, 8, 16, 24, 40, 64, 80]


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _layout(t, how, g):
    """t's values in the layout `how`: contiguous, a transposed copy viewed back, a slice of a
    wider tensor, or (for k/v) an expanded view along the heads of a single-head tensor."""
    if how == "transposed":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "sliced":
        wide = torch.randn(*t.shape[:-1], t.shape[-1] + 5, dtype=t.dtype, generator=g)
        wide[..., 3:3 + t.shape[-1]] = t
        return wide[..., 3:3 + t.shape[-1]]
    return t


@st.composite
def attention_case(draw):
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        batch=draw(st.integers(1, 2)),
        seqlen_q=draw(st.integers(1, 24)),
        seqlen_k=draw(st.integers(1, 24)),
        kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 3])),
        head_dim=draw(st.sampled_from(HEAD_DIMS)),
        causal=draw(st.booleans()),
        window=(draw(st.integers(-1, 12)), draw(st.integers(-1, 12))),
        softcap=draw(st.sampled_from([0.0, 0.0, 2.5])),
        layouts=[draw(st.sampled_from(["contiguous", "transposed", "sliced"])) for _ in range(3)],
        expanded_kv=draw(st.booleans()),
    )


def _attention_inputs(c):
    g = _generator(c["seed"])
    heads = c["kv_heads"] * c["group"]
    q = torch.randn(c["batch"], c["seqlen_q"], heads, c["head_dim"], dtype=F64, generator=g)
    kv_heads = c["kv_heads"]
    if c["expanded_kv"]:  # one head's keys seen as kv_heads heads: stride 0 along the heads
        k = torch.randn(c["batch"], c["seqlen_k"], 1, c["head_dim"], dtype=F64, generator=g).expand(-1, -1, kv_heads, -1)
        v = torch.randn(c["batch"], c["seqlen_k"], 1, c["head_dim"], dtype=F64, generator=g).expand(-1, -1, kv_heads, -1)
    else:
        k = torch.randn(c["batch"], c["seqlen_k"], kv_heads, c["head_dim"], dtype=F64, generator=g)
        v = torch.randn(c["batch"], c["seqlen_k"], kv_heads, c["head_dim"], dtype=F64, generator=g)
        k, v = _layout(k, c["layouts"][1], g), _layout(v, c["layouts"][2], g)
    return _layout(q, c["layouts"][0], g), k, v


@FUZZ
@given(attention_case())
def test_forward_matches_the_reference(c):
    count_example("flash_attn_func valid")
    q, k, v = _attention_inputs(c)
    before = [t.clone() for t in (q, k, v)]
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    out, lse, _ = fattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    want, want_lse = attention_reference(q, k, v, **kw)
    assert torch.allclose(out, want, rtol=0, atol=1e-10), (out - want).abs().max()
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite], want_lse[finite], rtol=0, atol=1e-10)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before)), "an input changed"


# One argument broken at a time: (what, change to the call's arguments, a name the error must give).
FORWARD_BREAKS = [
    ("q rank", lambda a: a.update(q=a["q"][0]), "q"),
    ("k head_dim", lambda a: a.update(k=a["k"][..., :-1] if a["k"].shape[-1] > 1 else a["k"].repeat(1, 1, 1, 2)), "k"),
    ("v seqlen", lambda a: a.update(v=torch.cat([a["v"], a["v"]], 1)), "v"),
    ("more kv heads than q heads", lambda a: a.update(
        k=torch.randn(*a["k"].shape[:2], a["q"].shape[2] + 1, a["k"].shape[3], dtype=F64),
        v=torch.randn(*a["v"].shape[:2], a["q"].shape[2] + 1, a["v"].shape[3], dtype=F64)), "heads"),
    ("q integer", lambda a: a.update(q=a["q"].to(torch.int32)), "q"),
    ("k dtype", lambda a: a.update(k=a["k"].float()), "k"),
    ("meta v", lambda a: a.update(v=a["v"].to("meta")), "v"),
    ("window of three", lambda a: a.update(window_size=(1, 2, 3)), "window_size"),
    ("negative softcap", lambda a: a.update(softcap=-1.0), "softcap"),
    ("nan scale", lambda a: a.update(softmax_scale=math.nan), "softmax_scale"),
    ("dropout above 1", lambda a: a.update(dropout_p=1.5), "dropout_p"),
    ("sinks shape", lambda a: a.update(sinks=torch.zeros(a["q"].shape[2] + 1)), "sinks"),
    ("alibi shape", lambda a: a.update(alibi_slopes=torch.zeros(a["q"].shape[2] + 1)), "alibi_slopes"),
]


@FUZZ
@given(attention_case(), st.sampled_from(FORWARD_BREAKS))
def test_forward_rejects_a_broken_argument(c, broken):
    what, change, name = broken
    count_example("flash_attn_func invalid")
    q, k, v = _attention_inputs(c)
    args = dict(q=q, k=k, v=v)
    change(args)
    check_rejected(fattn.flash_attn_func, args, name, what)


@st.composite
def decode_case(draw):
    paged = draw(st.booleans())
    rotary = draw(st.sampled_from([None, ("gptj", 8), ("neox", 16)]))
    new = draw(st.integers(1 if rotary else 0, 6))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        lengths=draw(st.lists(st.integers(0, 40), min_size=1, max_size=3)),
        seqlen_q=draw(st.sampled_from([1, 2, 5, 17, 30])),
        kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([16, 24, 40, 64])),
        page_size=draw(st.sampled_from([16, 32])) if paged else None,
        layout=draw(st.sampled_from(["contiguous", "fused", "transposed"])),
        new=new,
        causal=draw(st.booleans()),
        window=(draw(st.integers(-1, 20)), draw(st.integers(-1, 6))),
        softcap=draw(st.sampled_from([0.0, 0.0, 3.0])),
        rotary=rotary,
        leftpad=draw(st.booleans()),
        spare_rows=None if paged else draw(st.sampled_from([None, 2])),
        num_splits=draw(st.sampled_from([0, 1, 3])),
    )


@FUZZ
@given(decode_case())
def test_kvcache_matches_the_reference(c):
    count_example("flash_attn_with_kvcache valid")
    torch.manual_seed(c["seed"])
    batch = len(c["lengths"])
    capacity = max(c["lengths"]) + max(c["new"], c["seqlen_q"]) + 2
    cache = KVCache(batch, capacity, c["kv_heads"], c["head_dim"], F64, "cpu", c["page_size"], c["layout"],
                    spare_rows=c["spare_rows"])
    q = torch.randn(batch, c["seqlen_q"], c["kv_heads"] * c["group"], c["head_dim"], dtype=F64)
    k = v = None
    if c["new"]:
        k = torch.randn(batch, c["new"], c["kv_heads"], c["head_dim"], dtype=F64)
        v = torch.randn_like(k)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    if c["rotary"]:
        layout, rotary_dim = c["rotary"]
        angles = 6.3 * torch.rand(cache.capacity + c["seqlen_q"], rotary_dim // 2, dtype=F64)
        kw.update(rotary_cos=angles.cos(), rotary_sin=angles.sin(), rotary_interleaved=layout == "gptj")
    lengths = torch.tensor(c["lengths"], dtype=torch.int32)
    if c["leftpad"]:
        kw["cache_leftpad"] = (lengths * torch.rand(batch)).to(torch.int32)
    q_before = q.clone()
    run_decode(q, cache, lengths, k, v, what=str(c), num_splits=c["num_splits"], **kw)
    assert torch.equal(q, q_before)


DECODE_BREAKS = [
    ("append past the capacity", lambda a: a.update(cache_seqlens=a["cache_seqlens"] + 1000), "cache"),
    ("negative length", lambda a: a.update(cache_seqlens=a["cache_seqlens"] - 1000), "cache_seqlens"),
    ("leftpad past the capacity", lambda a: a.update(cache_leftpad=torch.full_like(a["cache_seqlens"], 10**6)),
     "cache_leftpad"),
    ("batch_idx out of range", lambda a: a.update(cache_batch_idx=torch.full_like(a["cache_seqlens"], 99)),
     "cache_batch_idx"),
    ("rotary table too short", lambda a: a.update(rotary_cos=torch.ones(3, 4, dtype=F64),
                                                  rotary_sin=torch.zeros(3, 4, dtype=F64)), "rotary_cos"),
    ("k heads", lambda a: a.update(k=torch.cat([a["k"], a["k"]], 2)), "k"),
    ("q dtype", lambda a: a.update(q=a["q"].float()), "q"),
    ("meta cache_seqlens", lambda a: a.update(cache_seqlens=a["cache_seqlens"].to("meta")), "cache_seqlens"),
    ("int64 lengths", lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), "cache_seqlens"),
    ("v without k", lambda a: a.update(k=None), "k"),
]


@FUZZ
@given(st.integers(0, 2**31 - 1), st.booleans(), st.sampled_from(DECODE_BREAKS))
def test_kvcache_rejects_a_broken_argument_before_writing(seed, paged, broken):
    what, change, name = broken
    count_example("flash_attn_with_kvcache invalid")
    torch.manual_seed(seed)
    cache = KVCache(2, 48, 2, 32, F64, "cpu", 16 if paged else None)
    args = dict(q=torch.randn(2, 3, 4, 32, dtype=F64), k_cache=cache.k_cache, v_cache=cache.v_cache,
                k=torch.randn(2, 2, 2, 32, dtype=F64), v=torch.randn(2, 2, 2, 32, dtype=F64),
                cache_seqlens=torch.tensor([5, 40], dtype=torch.int32), block_table=cache.block_table)
    change(args)
    if paged and name == "cache_batch_idx":
        args["block_table"] = None  # batch_idx picks rows of a contiguous cache
        args["k_cache"], args["v_cache"] = torch.randn(2, 48, 2, 32, dtype=F64), torch.randn(2, 48, 2, 32, dtype=F64)
    check_rejected(lambda **a: fattn.flash_attn_with_kvcache(**a, causal=True), args, name, what)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 20), min_size=1, max_size=4),
       st.lists(st.integers(1, 30), min_size=4, max_size=4), st.sampled_from([1, 2, 4]), st.booleans(),
       st.sampled_from([(-1, -1), (6, 0), (3, 2)]))
def test_varlen_matches_the_reference(seed, lens_q, lens_k, group, causal, window):
    count_example("flash_attn_varlen_func valid")
    g = _generator(seed)
    lens_k = lens_k[:len(lens_q)]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]) + 1, 2 * group, 24, dtype=F64, generator=g)
    k = torch.randn(int(cu_k[-1]), 2, 24, dtype=F64, generator=g)
    v = torch.randn(int(cu_k[-1]), 2, 24, dtype=F64, generator=g)
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                            window_size=window, return_lse=True)
    for b in range(len(lens_q)):
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lens_q[b] == 0:
            continue
        want, want_lse = attention_reference(q[rows][None], k[keys][None], v[keys][None], causal=causal,
                                             window_size=window)
        assert torch.allclose(out[rows], want[0], rtol=0, atol=1e-10)
        finite = torch.isfinite(want_lse[0])
        assert torch.equal(torch.isfinite(lse[:, rows]), finite)
        assert torch.allclose(lse[:, rows][finite], want_lse[0][finite], rtol=0, atol=1e-10)
    assert (out[int(cu_q[-1]):] == 0).all()


@FUZZ
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(1, 20), min_size=1, max_size=3),
       st.lists(st.integers(1, 70), min_size=3, max_size=3), st.sampled_from([16, 32]), st.booleans())
def test_paged_varlen_matches_the_reference(seed, lens_q, lens_k, page_size, causal):
    count_example("flash_attn_varlen_func block_table valid")
    torch.manual_seed(seed)
    check_paged_varlen(lens_q, lens_k[:len(lens_q)], 4, 2, 16, page_size, F64, "cpu", causal=causal)


@FUZZ
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.sampled_from([8, 24]),
       st.floats(0.0, 0.5))
def test_merge_matches_the_reference(seed, splits, batch, seqlen_q, head_dim, empty_fraction):
    count_example("merge_attention_states valid")
    g = _generator(seed)
    outs = torch.randn(splits, batch, seqlen_q, 2, head_dim, generator=g)
    lses = 3 * torch.randn(splits, batch, 2, seqlen_q, generator=g)
    lses[torch.rand(lses.shape, generator=g) < empty_fraction] = float("-inf")
    before = (outs.clone(), lses.clone())
    out, lse = fattn.merge_attention_states(outs, lses)
    want_lse = torch.logsumexp(lses.double(), 0)
    weights = torch.exp(lses.double() - want_lse).nan_to_num(0.0)  # [splits, batch, heads, seqlen_q]
    want = (weights.permute(0, 1, 3, 2)[..., None] * outs.double()).sum(0)
    assert torch.allclose(out.double(), want, rtol=0, atol=1e-5)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(want_lse))
    assert torch.allclose(lse.double()[torch.isfinite(want_lse)], want_lse[torch.isfinite(want_lse)], atol=1e-5)
    assert torch.equal(outs, before[0]) and torch.equal(lses, before[1])
