"""Property-based fuzzing (hypothesis) of the attention variants and of ring attention on CPU.

Valid calls drawing sinks, ALiBi, float and boolean biases of every broadcast shape, dropout,
window and softcap together match the float64 reference in out, lse and every gradient (q, k, v,
bias, sinks); a broken variant argument raises an error naming it and leaves every input unchanged;
`fattn.ring.simulate` over drawn worlds, shardings and variants matches the single call, and a
broken ring argument is refused by name. Example counts are printed at the end of the run."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fattn
from fattn import ring
from fattn.reference import attention_reference
from helpers.fuzz import DERANDOMIZE, EXAMPLES, check_rejected, count_example

F64 = torch.float64
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def variant_case(draw):
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        batch=draw(st.integers(1, 2)),
        seqlen_q=draw(st.integers(1, 20)),
        seqlen_k=draw(st.integers(1, 20)),
        kv_heads=draw(st.integers(1, 2)),
        group=draw(st.sampled_from([1, 2])),
        head_dim=draw(st.sampled_from([4, 8, 24])),
        causal=draw(st.booleans()),
        window=(draw(st.integers(-1, 8)), draw(st.integers(-1, 8))),
        softcap=draw(st.sampled_from([0.0, 0.0, 2.0])),
        sinks=draw(st.booleans()),
        alibi=draw(st.sampled_from([None, "heads", "batch_heads"])),
        # which of [batch, heads, seqlen_q, seqlen_k] the bias has (the others broadcast), or none
        bias_dims=draw(st.sampled_from([None, (0, 1, 2, 3), (2, 3), (1, 3), (3,), (0, 2), ()])),
        bias_bool=draw(st.booleans()),
        dropout_p=draw(st.sampled_from([0.0, 0.0, 0.2, 0.6])),
    )


def _variant_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    b, sq, sk, hk, d = c["batch"], c["seqlen_q"], c["seqlen_k"], c["kv_heads"], c["head_dim"]
    h = hk * c["group"]
    q = torch.randn(b, sq, h, d, dtype=F64, generator=g)
    k = torch.randn(b, sk, hk, d, dtype=F64, generator=g)
    v = torch.randn(b, sk, hk, d, dtype=F64, generator=g)
    extras = {}
    if c["sinks"]:
        extras["sinks"] = torch.randn(h, generator=g)
    if c["alibi"]:
        shape = (h,) if c["alibi"] == "heads" else (b, h)
        extras["alibi_slopes"] = torch.rand(shape, generator=g)
    if c["bias_dims"] is not None:
        full = (b, h, sq, sk)
        shape = [full[i] if i in c["bias_dims"] else 1 for i in range(4)]
        if c["bias_bool"]:
            extras["bias"] = torch.rand(shape, generator=g) < 0.7
        else:
            extras["bias"] = torch.randn(shape, dtype=F64, generator=g)
    return q, k, v, extras


@FUZZ
@given(variant_case())
def test_variants_and_their_gradients_match_the_reference(c):
    count_example("flash_attn_func variants fwd+bwd")
    q, k, v, extras = _variant_inputs(c)
    before = [t.clone() for t in (q, k, v, *extras.values())]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    extra, ref_extra = {}, {}
    for name, t in extras.items():
        differentiable = t.is_floating_point() and name != "alibi_slopes"
        extra[name] = t.clone().requires_grad_(differentiable)
        ref_extra[name] = t.clone().requires_grad_(differentiable)
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"])
    # flash_attn_func draws dropout's seed from torch's generator: draw the same one for the reference.
    torch.manual_seed(c["seed"])
    seed = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64) if c["dropout_p"] else None
    torch.manual_seed(c["seed"])
    out, lse, _ = fattn.flash_attn_func(*leaves, c["dropout_p"], return_attn_probs=True, **kw, **extra)
    want, want_lse = attention_reference(*ref_leaves, dropout_p=c["dropout_p"], dropout_seed=seed, **kw, **ref_extra)
    what = {key: c[key] for key in c if key != "seed"}
    assert torch.allclose(out, want, rtol=0, atol=1e-10), (what, (out - want).abs().max())
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite), what
    assert torch.allclose(lse[finite], want_lse[finite], rtol=0, atol=1e-10), what

    g = torch.Generator().manual_seed(c["seed"] + 1)
    w_out, w_lse = torch.randn(out.shape, dtype=F64, generator=g), torch.randn(lse.shape, dtype=F64, generator=g)
    names = ["q", "k", "v"] + [n for n, t in extra.items() if t.requires_grad]
    got = torch.autograd.grad((out * w_out).sum() + (lse.masked_fill(~finite, 0) * w_lse).sum(),
                              leaves + [t for t in extra.values() if t.requires_grad])
    ref = torch.autograd.grad((want * w_out).sum() + (want_lse.masked_fill(~finite, 0) * w_lse).sum(),
                              ref_leaves + [t for t in ref_extra.values() if t.requires_grad])
    for name, a, b in zip(names, got, ref):
        assert torch.allclose(a.double(), b.double(), rtol=0, atol=1e-8 if name == "sinks" else 1e-9), \
            (what, name, (a.double() - b.double()).abs().max())
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, *extras.values()), before)), "an input changed"


# One variant argument broken at a time: (what, change to the call's arguments, a name the error must give).
VARIANT_BREAKS = [
    ("bias rank 5", lambda a: a.update(bias=torch.zeros(1, 1, 1, 1, 1, dtype=F64)), "bias"),
    ("bias that does not broadcast", lambda a: a.update(bias=torch.zeros(a["q"].shape[1] + 1, a["k"].shape[1],
                                                                          dtype=F64)), "bias"),
    ("integer bias", lambda a: a.update(bias=torch.zeros(a["q"].shape[1], a["k"].shape[1], dtype=torch.int32)),
     "bias"),
    ("bias not a tensor", lambda a: a.update(bias=0.5), "bias"),
    ("meta bias", lambda a: a.update(bias=torch.zeros(a["q"].shape[1], a["k"].shape[1], dtype=F64, device="meta")),
     "bias"),
    ("sinks per kv head", lambda a: a.update(sinks=torch.zeros(a["q"].shape[2] + 1)), "sinks"),
    ("sinks of rank 2", lambda a: a.update(sinks=torch.zeros(1, a["q"].shape[2])), "sinks"),
    ("meta sinks", lambda a: a.update(sinks=torch.zeros(a["q"].shape[2], device="meta")), "sinks"),
    ("integer sinks", lambda a: a.update(sinks=torch.zeros(a["q"].shape[2], dtype=torch.int64)), "sinks"),
    ("alibi of rank 3", lambda a: a.update(alibi_slopes=torch.zeros(1, 1, a["q"].shape[2])), "alibi_slopes"),
    ("alibi batch", lambda a: a.update(alibi_slopes=torch.zeros(a["q"].shape[0] + 1, a["q"].shape[2])),
     "alibi_slopes"),
    ("meta alibi", lambda a: a.update(alibi_slopes=torch.zeros(a["q"].shape[2], device="meta")), "alibi_slopes"),
    ("negative dropout", lambda a: a.update(dropout_p=-0.1), "dropout_p"),
    ("dropout of one", lambda a: a.update(dropout_p=1.0), "dropout_p"),
    ("nan dropout", lambda a: a.update(dropout_p=math.nan), "dropout_p"),
    ("dropout as a tensor", lambda a: a.update(dropout_p=torch.tensor(0.1)), "dropout_p"),
    ("infinite softcap", lambda a: a.update(softcap=math.inf), "softcap"),
    ("window below -1", lambda a: a.update(window_size=(-2, 0)), "window"),
]


@FUZZ
@given(variant_case(), st.sampled_from(VARIANT_BREAKS))
def test_variants_reject_a_broken_argument(c, broken):
    what, change, name = broken
    count_example("flash_attn_func variants invalid")
    q, k, v, _ = _variant_inputs(c)
    args = dict(q=q, k=k, v=v)
    change(args)
    check_rejected(fattn.flash_attn_func, args, name, what)


@st.composite
def ring_case(draw):
    world = draw(st.integers(1, 4))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        world=world,
        chunk=draw(st.integers(1, 4)),  # the sequence is 2 * world * chunk long
        sharding=draw(st.sampled_from(ring.SHARDINGS)),
        causal=draw(st.booleans()),
        window=draw(st.sampled_from([(-1, -1), (3, 0), (5, 2), (0, 0), (-1, 4)])),
        softcap=draw(st.sampled_from([0.0, 1.5])),
        sinks=draw(st.booleans()),
        alibi=draw(st.sampled_from([None, "heads", "batch_heads"])),
        group=draw(st.sampled_from([1, 2])),
    )


@FUZZ
@given(ring_case())
def test_ring_simulate_matches_the_single_call(c):
    count_example("ring.simulate valid")
    g = torch.Generator().manual_seed(c["seed"])
    seqlen = 2 * c["world"] * c["chunk"]
    q = torch.randn(2, seqlen, 2 * c["group"], 8, dtype=F64, generator=g)
    k = torch.randn(2, seqlen, 2, 8, dtype=F64, generator=g)
    v = torch.randn(2, seqlen, 2, 8, dtype=F64, generator=g)
    sinks = torch.randn(2 * c["group"], generator=g) if c["sinks"] else None
    slopes = None
    if c["alibi"]:
        slopes = torch.rand((2 * c["group"],) if c["alibi"] == "heads" else (2, 2 * c["group"]), generator=g) * 0.5
    kw = dict(causal=c["causal"], window_size=c["window"], softcap=c["softcap"], sinks=sinks, alibi_slopes=slopes)
    out, lse = ring.simulate(q, k, v, c["world"], sharding=c["sharding"], return_lse=True, **kw)
    want, want_lse = attention_reference(q, k, v, **kw)
    assert torch.allclose(out, want, rtol=0, atol=1e-10), (c, (out - want).abs().max())
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite), c
    assert torch.allclose(lse[finite], want_lse[finite], rtol=0, atol=1e-10), c


RING_BREAKS = [
    ("world 0", lambda a: a.update(world=0), "world"),
    ("negative world", lambda a: a.update(world=-2), "world"),
    ("world as a float", lambda a: a.update(world=2.0), "world"),
    ("world as a bool", lambda a: a.update(world=True), "world"),
    ("unknown sharding", lambda a: a.update(sharding="striped"), "sharding"),
    ("sequence not divisible by 2 * world", lambda a: a.update(world=a["q"].shape[1]), "world"),
    ("k shorter than q", lambda a: a.update(k=a["k"][:, :-2]), "k"),
    ("alibi slopes of the wrong shape", lambda a: a.update(alibi_slopes=torch.ones(3)), "alibi_slopes"),
]


@FUZZ
@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.sampled_from(RING_BREAKS))
def test_ring_rejects_a_broken_argument(seed, world, broken):
    what, change, name = broken
    count_example("ring.simulate invalid")
    g = torch.Generator().manual_seed(seed)
    seqlen = 4 * world
    args = dict(q=torch.randn(1, seqlen, 2, 8, dtype=F64, generator=g),
                k=torch.randn(1, seqlen, 2, 8, dtype=F64, generator=g),
                v=torch.randn(1, seqlen, 2, 8, dtype=F64, generator=g), world=world)
    change(args)
    check_rejected(ring.simulate, args, name, what)
