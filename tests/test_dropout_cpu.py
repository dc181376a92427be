"""Dropout on CPU: the op's keep-mask is the one written independently in fattn.reference (numpy
Philox), forward and gradients match the reference for one seed, alone and with bias, window,
softcap, sinks, GQA and packed sequences; the same seed gives the same output, another seed
another; torch.manual_seed reproduces a call; the mean over many draws converges to the output
without dropout; the kept fraction matches 1 - p; opcheck and gradcheck; bad input."""

import pytest
import torch
from torch.autograd import gradcheck
from torch.library import opcheck

import fattn
from fattn.reference import attention_reference, dropout_keep_mask
from helpers import FORWARD, check_fake_raises_like_op

F64 = torch.float64
VARLEN_FORWARD = torch.ops.fattn.varlen_forward.default


def _problem(seed=0, batch=2, seqlen_q=9, seqlen_k=21, heads=4, kv_heads=2, head_dim=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, head_dim, generator=g, dtype=F64)
    k = torch.randn(batch, seqlen_k, kv_heads, head_dim, generator=g, dtype=F64)
    v = torch.randn(batch, seqlen_k, kv_heads, head_dim, generator=g, dtype=F64)
    return q, k, v


def _seed(value):
    return torch.tensor([value], dtype=torch.int64)


def _forward(q, k, v, p, seed, causal=False, **kw):
    """The op with dropout, keyword variant arguments in the schema's order."""
    return FORWARD(q, k, v, None, causal, False, *kw.get("window", (-1, -1)), kw.get("softcap", 0.0), None, None,
                   None, kw.get("sinks"), kw.get("bias"), p, seed)


def test_identity_values_reveal_the_keep_mask_of_the_reference():
    # v = one-hot keys: out[b, i, h, j] = P_ij * keep_ij / (1 - p), so out != 0 exactly where kept.
    batch, heads, seqlen = 2, 3, 40
    q = torch.randn(batch, seqlen, heads, 48, dtype=F64) * 0.1
    k = torch.randn(batch, seqlen, heads, 48, dtype=F64) * 0.1
    v = torch.eye(seqlen, 48, dtype=F64)[None, :, None, :].expand(batch, seqlen, heads, 48).contiguous()
    for p, seed in ((0.1, -7), (0.5, 2**62 + 12345), (0.9, 99)):
        out, _ = _forward(q, k, v, p, _seed(seed))
        kept = (out[..., :seqlen] != 0).permute(0, 2, 1, 3)  # [batch, heads, seqlen_q, seqlen_k]
        want, keep_probability = dropout_keep_mask(seed, batch, heads, seqlen, seqlen, p)
        assert torch.equal(kept, want), f"p={p} seed={seed}"
        assert abs(kept.double().mean().item() - keep_probability) < 0.05


@pytest.mark.parametrize("variant", [dict(), dict(causal=True), dict(window=(3, 2), softcap=1.5),
                                     dict(sinks=True, causal=True), dict(bias=True)], ids=str)
def test_forward_and_gradients_match_the_reference(variant):
    q, k, v = _problem(seed=1)
    seed = _seed(123456789)
    options = dict(variant)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(4)
    bias = torch.randn(2, 1, 9, 21, dtype=F64, requires_grad=True) if options.pop("bias", False) else None
    causal = options.pop("causal", False)
    window = options.pop("window", (-1, -1))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([bias] if bias is not None else [])
    out, lse = _forward(*leaves[:3], 0.3, seed, causal, window=window, bias=bias, **options)
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref_bias = ref_leaves[3] if bias is not None else None
    ref_out, ref_lse = attention_reference(*ref_leaves[:3], None, causal, window_size=window, bias=ref_bias,
                                           dropout_p=0.3, dropout_seed=seed, **options)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves)
    want = torch.autograd.grad((ref_out * w_out).sum() + (ref_lse * w_lse).sum(), ref_leaves)
    for g, w, name in zip(got, want, ("dq", "dk", "dv", "dbias")):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=name)


def test_gradcheck_with_dropout():
    q, k, v = _problem(seed=2, seqlen_q=5, seqlen_k=11)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    seed = _seed(5)
    assert gradcheck(lambda q, k, v: _forward(q, k, v, 0.4, seed, True), leaves, eps=1e-6, atol=1e-6)


def test_same_seed_same_output_other_seed_other_output_and_manual_seed_reproduces():
    q, k, v = _problem(seed=3)
    a = _forward(q, k, v, 0.3, _seed(1))[0]
    assert torch.equal(a, _forward(q, k, v, 0.3, _seed(1))[0])
    assert not torch.equal(a, _forward(q, k, v, 0.3, _seed(2))[0])
    torch.manual_seed(7)
    x = fattn.flash_attn_func(q, k, v, 0.3)
    y = fattn.flash_attn_func(q, k, v, 0.3)  # the generator moved on: a new mask
    torch.manual_seed(7)
    assert torch.equal(x, fattn.flash_attn_func(q, k, v, 0.3))
    assert not torch.equal(x, y)


def test_mean_over_draws_converges_to_the_output_without_dropout():
    q, k, v = _problem(seed=4, batch=1, seqlen_q=4, seqlen_k=16, heads=2, kv_heads=2, head_dim=8)
    plain = fattn.flash_attn_func(q, k, v)
    draws = 1500
    total = torch.zeros_like(plain)
    for s in range(draws):
        total += _forward(q, k, v, 0.5, _seed(s))[0]
    mean = total / draws
    # Each output is a sum of 16 terms kept with probability 1/2: the mean's standard error is
    # about |v| sqrt(P^2 sum) / sqrt(draws); the bound is several of those.
    assert (mean - plain).abs().max().item() < 0.1
    single = _forward(q, k, v, 0.5, _seed(0))[0]
    assert (single - plain).abs().max().item() > 0.1  # one draw is far from it: the test can fail


def test_packed_equal_length_sequences_draw_the_dense_mask():
    # Sequence b of a packed batch uses batch index b and rows/keys from its own start, so equal
    # lengths reproduce the dense call with the same seed.
    q, k, v = _problem(seed=5, seqlen_q=12, seqlen_k=12)
    seed = _seed(424242)
    dense, dense_lse = _forward(q, k, v, 0.25, seed, True)
    cu = torch.tensor([0, 12, 24], dtype=torch.int32)
    packed, packed_lse = VARLEN_FORWARD(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 12, 12, None, None,
                                        True, False, -1, -1, 0.0, None, None, 0.25, seed)
    torch.testing.assert_close(packed.view_as(dense), dense, rtol=0, atol=0)
    leaves = [t.flatten(0, 1).clone().requires_grad_() for t in (q, k, v)]
    out = fattn.flash_attn_varlen_func(*leaves, cu, cu, 12, 12, 0.25, causal=True)
    dq, dk, dv = torch.autograd.grad(out.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_opcheck_dense_and_packed():
    q, k, v = _problem(seed=6)
    opcheck(FORWARD, (q, k, v, None, True, False, -1, -1, 0.0, None, None, None, None, None, 0.2, _seed(3)))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    args = (q[0], k[0, :9], v[0, :9], cu, cu, 5, 5, None, None, False, False, -1, -1, 0.0, None, None, 0.2, _seed(3))
    opcheck(VARLEN_FORWARD, args)


def _bad_dropout_calls():
    q, k, v = _problem()
    base = (q, k, v, None, False, False, -1, -1, 0.0, None, None, None, None, None)
    yield "p-negative", base + (-0.1, _seed(1)), "dropout_p is -0.1; expected 0 <= dropout_p < 1"
    yield "p-one", base + (1.0, _seed(1)), "dropout_p is 1; expected 0 <= dropout_p < 1"
    yield "no-seed", base + (0.1, None), "dropout_p > 0 needs dropout_seed"
    yield "seed-dtype", base + (0.1, torch.tensor([1], dtype=torch.int32)), "dropout_seed has dtype int32"
    yield "seed-shape", base + (0.1, torch.tensor([1, 2])), r"dropout_seed has shape \[2\]"
    yield "seed-device", base + (0.1, torch.tensor([1], device="meta")), "dropout_seed is on meta"


@pytest.mark.parametrize("name,args,message", list(_bad_dropout_calls()), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_dropout_raises_naming_it_and_the_fake_agrees(name, args, message):
    with pytest.raises(RuntimeError, match=message):
        FORWARD(*args)
    check_fake_raises_like_op(FORWARD, args)


def test_public_functions_check_the_probability():
    q, k, v = _problem()
    for p in (-0.5, 1.0, 2):
        with pytest.raises(RuntimeError, match="dropout_p is"):
            fattn.flash_attn_func(q, k, v, p)
