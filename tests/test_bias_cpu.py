"""The additive bias and boolean masks on CPU: forward and every gradient (dbias summed over the
broadcast dims) against the float64 reference, alone and with window, softcap, ALiBi, sinks, GQA
and segment ids; rows masked entirely; the public function's conversions; gradcheck; bad input,
with the fakes raising the op's errors."""

import pytest
import torch
from torch.autograd import gradcheck

import fattn
from fattn.reference import attention_reference
from helpers import FORWARD, check_fake_raises_like_op

F64 = torch.float64
# (batch, heads, seqlen_q, seqlen_k) dims of the bias: 1 = broadcast
BIAS_SHAPES = {"full": (2, 4, 9, 13), "heads": (1, 4, 9, 13), "batch": (2, 1, 9, 13), "keys-only": (2, 1, 1, 13),
               "2d": (9, 13)}
VARIANTS = [dict(), dict(causal=True), dict(window_size=(3, 2), softcap=1.5), dict(causal=True, alibi=True),
            dict(sinks=True), dict(segments=True, causal=True)]


def _problem(seed=0, seqlen_q=9, seqlen_k=13, heads=4, kv_heads=2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, heads, 16, generator=g, dtype=F64)
    k = torch.randn(2, seqlen_k, kv_heads, 16, generator=g, dtype=F64)
    v = torch.randn(2, seqlen_k, kv_heads, 16, generator=g, dtype=F64)
    return q, k, v


def _options(variant, q, k):
    options = dict(variant)
    heads = q.shape[2]
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(heads) * 0.3
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(heads)
    if options.pop("segments", False):
        ids = (torch.arange(q.shape[1]) >= 4).int()[None].expand(2, -1).contiguous()
        options["q_segment_ids"] = ids
        options["kv_segment_ids"] = (torch.arange(k.shape[1]) >= 8).int()[None].expand(2, -1).contiguous()
    return options


def _grads(fn, leaves, w_out, w_lse):
    out, lse = fn(*leaves)
    return out, lse, torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("bias_kind", list(BIAS_SHAPES))
def test_forward_and_gradients_match_the_reference(bias_kind, variant):
    q, k, v = _problem()
    options = _options(variant, q, k)
    bias = torch.randn(BIAS_SHAPES[bias_kind], dtype=F64)
    w_out, w_lse = torch.randn(q.shape, dtype=F64), torch.randn(2, 4, 9, dtype=F64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out, lse, got = _grads(lambda q, k, v, b: fattn.flash_attn_func(q, k, v, return_lse=True, bias=b, **options),
                           leaves, w_out, w_lse)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    causal = options.pop("causal", False)
    ref_out, ref_lse, want = _grads(lambda q, k, v, b: attention_reference(q, k, v, None, causal, bias=b, **options),
                                    ref_leaves, w_out, w_lse)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    for g, w, name in zip(got, want, ("dq", "dk", "dv", "dbias")):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=name)


def test_boolean_mask_hides_keys_and_empties_rows():
    q, k, v = _problem(seed=1)
    mask = torch.rand(2, 1, 9, 13, generator=torch.Generator().manual_seed(5)) > 0.4
    mask[1, 0, 4] = False  # a row that sees nothing
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True, bias=mask)
    ref_out, ref_lse = attention_reference(q, k, v, bias=mask)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert torch.all(out[1, 4] == 0) and torch.all(lse[1, :, 4] == float("-inf"))
    # Gradients stay finite, and the empty row's are zero.
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fattn.flash_attn_func(*leaves, bias=mask)
    dq, dk, dv = torch.autograd.grad(out.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert torch.all(dq[1, 4] == 0)


def test_a_float32_bias_with_float64_inputs_is_converted_and_its_gradient_comes_back_in_float32():
    q, k, v = _problem(seed=2)
    bias = torch.randn(1, 4, 9, 13, requires_grad=True)
    out = fattn.flash_attn_func(q, k, v, bias=bias)
    (dbias,) = torch.autograd.grad(out.sum(), bias)
    assert dbias.dtype == torch.float32 and dbias.shape == bias.shape
    ref_bias = bias.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(attention_reference(q, k, v, bias=ref_bias)[0].sum(), ref_bias)
    torch.testing.assert_close(dbias, want.float(), rtol=1e-6, atol=1e-6)


def test_gradcheck_through_the_op_with_a_broadcast_bias():
    q, k, v = _problem(seed=3, seqlen_q=5, seqlen_k=7)
    bias = torch.randn(2, 1, 5, 7, dtype=F64)
    leaves = [t.requires_grad_() for t in (q, k, v, bias)]
    assert gradcheck(lambda q, k, v, b: FORWARD(q, k, v, None, True, False, -1, -1, 1.5, None, None, None, None, b),
                     leaves, eps=1e-6, atol=1e-6)


def test_backward_op_returns_the_unreduced_bias_gradient_only_when_asked():
    q, k, v = _problem(seed=4)
    bias = torch.randn(1, 1, 9, 13, dtype=F64)
    out, lse = FORWARD(q, k, v, None, False, False, -1, -1, 0.0, None, None, None, None, bias)
    dout = torch.randn_like(out)
    backward = torch.ops.fattn.backward.default
    *_, dbias = backward(dout, q, k, v, out, lse, None, None, False, False, -1, -1, 0.0, None, None, None, bias, True)
    assert dbias.shape == (2, 4, 9, 13) and dbias.dtype == F64
    *_, none = backward(dout, q, k, v, out, lse, None, None, False, False, -1, -1, 0.0, None, None, None, bias, False)
    assert none.shape == (0,)


def _bad_bias_calls():
    q, k, v = _problem()
    base = (q, k, v, None, False, False, -1, -1, 0.0, None, None, None, None)
    yield "dtype", base + (torch.randn(2, 4, 9, 13),), "bias has dtype float32 but q has float64"
    yield "rank", base + (torch.randn(4, 9, 13, dtype=F64),), "bias has shape [4, 9, 13]"
    yield "keys", base + (torch.randn(2, 4, 9, 12, dtype=F64),), "bias has shape [2, 4, 9, 12]"
    yield "heads", base + (torch.randn(2, 3, 9, 13, dtype=F64),), "bias has shape [2, 3, 9, 13]"
    yield "strided", base + (torch.randn(2, 4, 13, 9, dtype=F64).transpose(2, 3),), "bias must have contiguous keys"
    yield "device", base + (torch.randn(2, 4, 9, 13, dtype=F64, device="meta"),), "bias is on meta"


@pytest.mark.parametrize("name,args,message", list(_bad_bias_calls()), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_bias_raises_naming_it_and_the_fake_agrees(name, args, message):
    with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        FORWARD(*args)
    check_fake_raises_like_op(FORWARD, args)


def test_public_function_rejects_a_bias_that_does_not_broadcast():
    q, k, v = _problem()
    with pytest.raises(RuntimeError, match=r"does not broadcast to \[batch, heads, seqlen_q, seqlen_k\]"):
        fattn.flash_attn_func(q, k, v, bias=torch.randn(3, 9, 13, dtype=F64))
    with pytest.raises(RuntimeError, match="expected a float dtype or bool"):
        fattn.flash_attn_func(q, k, v, bias=torch.ones(9, 13, dtype=torch.int32))


def test_backward_asking_for_dbias_without_a_bias_raises():
    q, k, v = _problem()
    out, lse = FORWARD(q, k, v)
    args = (torch.randn_like(out), q, k, v, out, lse, None, None, False, False, -1, -1, 0.0, None, None, None, None,
            True)
    with pytest.raises(RuntimeError, match="bias_grad=True needs a bias"):
        torch.ops.fattn.backward.default(*args)
    check_fake_raises_like_op(torch.ops.fattn.backward.default, args)
