"""Backward on CPU through flash_attn_func: the differentiable lse, dtypes, strided dout,
compiled training, bad input. gradcheck and opcheck run on the shared samples
(test_op_samples.py)."""

import pytest
import torch
from torch.autograd import gradcheck

import fattn
from fattn.reference import attention_reference
from helpers import BACKWARD, check_fake_raises_like_op, make_qkv, recompiles_forbidden


def _leaves(*shape, layout="contiguous"):
    return [t.detach().requires_grad_() for t in make_qkv(*shape, torch.float64, "cpu", layout=layout)]


def test_gradcheck_lse_only():
    q, k, v = _leaves(1, 5, 6, 2, 1, 8)
    assert gradcheck(lambda q, k, v: fattn.flash_attn_func(q, k, v, return_lse=True)[1], (q, k, v), eps=1e-6,
                     atol=1e-6)


def test_matches_autograd_of_reference_with_dlse():
    q, k, v = _leaves(2, 11, 13, 6, 3, 16)
    w_out, w_lse = torch.randn(2, 11, 6, 16, dtype=torch.float64), torch.randn(2, 6, 11, dtype=torch.float64)
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    got = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), (q, k, v))
    ref_out, ref_lse = attention_reference(q, k, v, None, True)
    want = torch.autograd.grad((ref_out * w_out).sum() + (ref_lse.double() * w_lse).sum(), (q, k, v))
    for g, w, name in zip(got, want, "qkv"):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=f"d{name}")


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_gradient_reaches_the_one_input_that_requires_it(which):
    # flash_attn_func skips autograd when no input requires grad: any single one must count.
    q, k, v = make_qkv(1, 5, 6, 2, 1, 8, torch.float64, "cpu")
    inputs = {"q": q, "k": k, "v": v}
    leaf = inputs[which].requires_grad_()
    out = fattn.flash_attn_func(*inputs.values(), causal=True)
    assert out.requires_grad
    got = torch.autograd.grad(out.sum(), leaf)[0]
    want = torch.autograd.grad(attention_reference(*inputs.values(), None, True)[0].sum(), leaf)[0]
    torch.testing.assert_close(got, want)
    with torch.no_grad():
        assert not fattn.flash_attn_func(*inputs.values(), causal=True).requires_grad


def test_gradients_have_input_dtype_and_shape():
    q, k, v = (t.detach().requires_grad_() for t in make_qkv(1, 7, 9, 4, 2, 16, torch.bfloat16, "cpu"))
    fattn.flash_attn_func(q, k, v, causal=True).float().sum().backward()
    for t in (q, k, v):
        assert t.grad.dtype == torch.bfloat16 and t.grad.shape == t.shape


def test_non_contiguous_dout():
    q, k, v = _leaves(1, 6, 6, 2, 2, 8)
    out = fattn.flash_attn_func(q, k, v)
    dout = torch.randn(1, 2, 6, 8, dtype=torch.float64).transpose(1, 2)  # non-contiguous
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = attention_reference(q, k, v)[0]
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_compiled_training_step_no_recompiles():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, dynamic=True, backend="aot_eager")
    def loss_fn(q, k, v):
        out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return (out.square()).sum() + lse.sum()

    for i, seqlen in enumerate((19, 37, 100)):
        q, k, v = (t.requires_grad_() for t in make_qkv(1, seqlen, seqlen + 3, 4, 2, 16, torch.float32, "cpu"))
        with recompiles_forbidden(i):
            loss_fn(q, k, v).backward()
        got = [t.grad for t in (q, k, v)]
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out, lse = attention_reference(q2, k2, v2, None, True, dtype=torch.float32)
        ((out.square()).sum() + lse.sum()).backward()
        for g, w in zip(got, (q2.grad, k2.grad, v2.grad)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def _bwd_args():
    q, k, v = make_qkv(2, 8, 8, 4, 2, 32, torch.float32, "cpu")
    out, lse = torch.ops.fattn.forward(q, k, v)
    return [torch.randn_like(out), q, k, v, out, lse, None, None, False, False]


@pytest.mark.parametrize("index,bad,match", [
    (0, lambda t: t[:, :5], r"dout has shape \[2, 5, 4, 32\] but must match q's shape \[2, 8, 4, 32\]"),
    (0, lambda t: t.double(), r"dout has dtype float64 but q has float32"),
    (4, lambda t: t[:, :, :2], r"out has shape \[2, 8, 2, 32\] but must match q's shape"),
    (5, lambda t: t[:, :, :3], r"lse has shape \[2, 4, 3\] but must be \[batch, heads, seqlen_q\] = \[2, 4, 8\]"),
    (5, lambda t: t.double(), r"lse has dtype float64; expected float32"),
])
def test_backward_bad_input(index, bad, match):
    args = _bwd_args()
    args[index] = bad(args[index])
    check_fake_raises_like_op(BACKWARD, args, match)


def test_backward_bad_dlse():
    args = _bwd_args()
    args[6] = torch.zeros(2, 4, 7)
    check_fake_raises_like_op(BACKWARD, args, r"dlse has shape \[2, 4, 7\]")
