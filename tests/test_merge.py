"""fattn.merge_attention_states: attention over key chunks, merged, equals attention over all keys.
opcheck and the fake run on the shared samples (test_op_samples.py)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn
from fattn.reference import attention_reference
from helpers import MERGE, check_fake_raises_like_op, expected_lse_dtype, make_qkv, requires_gpu
from helpers.samples import merge_samples


def _chunked(q, k, v, bounds, causal=False, dtype=None):
    """Partial (out, lse) of q over each key chunk [a, b) of `bounds`."""
    outs, lses = [], []
    for a, b in bounds:
        out, lse = attention_reference(q, k[:, a:b], v[:, a:b], None, False, dtype=torch.float64)
        outs.append(out.to(dtype or q.dtype))
        lses.append(lse.to(expected_lse_dtype(dtype or q.dtype)))
    return outs, lses


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_merge_equals_full_attention_cpu(splits):
    q, k, v = make_qkv(2, 7, 50, 4, 2, 16, torch.float64, "cpu")
    edges = torch.linspace(0, 50, splits + 1).long().tolist()
    outs, lses = _chunked(q, k, v, list(zip(edges[:-1], edges[1:])))
    out, lse = fattn.merge_attention_states(outs, lses)
    want_out, want_lse = attention_reference(q, k, v)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_minus_inf_partials_are_ignored_even_with_garbage_outputs():
    q, k, v = make_qkv(1, 5, 20, 2, 2, 8, torch.float64, "cpu")
    outs, lses = _chunked(q, k, v, [(0, 12), (12, 20)])
    outs.append(torch.full_like(outs[0], float("nan")))  # a part that saw no key
    lses.append(torch.full_like(lses[0], float("-inf")))
    out, lse = fattn.merge_attention_states(outs, lses)
    torch.testing.assert_close(out, attention_reference(q, k, v)[0])
    # A row that no part saw: out 0, lse -inf.
    out, lse = fattn.merge_attention_states(outs[2:], lses[2:])
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_merge_compiles_fullgraph():
    f = torch.compile(lambda o, l: fattn.merge_attention_states(o, l), fullgraph=True, dynamic=True)
    for s in (5, 9, 13):
        outs, lses = torch.randn(2, 1, s, 2, 8), torch.randn(2, 1, 2, s)
        got = f(outs, lses)
        want = torch.ops.fattn.merge_attention_states(outs, lses)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("bad,match", [
    (lambda o, l: (o[0], l), r"outs must be a 5-D tensor \[splits, batch, seqlen_q, heads, head_dim\]"),
    (lambda o, l: (o, l[:, :, :, :3]), r"lses has shape \[2, 1, 2, 3\] but must be \[splits, batch, heads, seqlen_q\]"),
    (lambda o, l: (o, l.double()), r"lses has dtype float64; expected float32"),
    (lambda o, l: (o.int(), l), r"outs has dtype int32"),
    (lambda o, l: (o[..., :12], l), r"head_dim 12 is not supported"),
])
def test_merge_bad_input(bad, match):
    outs, lses = torch.randn(2, 1, 4, 2, 16), torch.randn(2, 1, 2, 4)
    check_fake_raises_like_op(MERGE, bad(outs, lses), match)


def test_merge_fake_applies_the_cuda_rules():
    # Fake CUDA tensors need no GPU: float64 partials are for the CPU definition only.
    with FakeTensorMode():
        outs, lses = torch.randn(2, 1, 4, 2, 16, device="cuda"), torch.randn(2, 1, 2, 4, device="cuda")
        out, lse = MERGE(outs, lses)
        assert out.device == outs.device and lse.dtype == torch.float32
        with pytest.raises(RuntimeError, match=r"outs has dtype float64; expected float32, float16 or bfloat16"):
            MERGE(outs.double(), lses.double())
        with pytest.raises(RuntimeError, match=r"lses is on cpu but outs is on cuda:0"):
            MERGE(outs, torch.randn(2, 1, 2, 4))


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("partial_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_merge_gpu_matches_cpu_definition(d, partial_dtype):
    torch.manual_seed(d)
    splits, b, s, h = 4, 2, 333, 6
    outs = torch.randn(splits, b, s, h, d, device="cuda").to(partial_dtype)
    lses = torch.randn(splits, b, h, s, device="cuda") * 3
    lses[1, :, :, :100] = float("-inf")
    lses[:, 1, 2, 7] = float("-inf")  # a row no part saw
    outs[1, :, :100] = float("nan")
    out, lse = fattn.merge_attention_states(outs, lses)
    want_out, want_lse = torch.ops.fattn.merge_attention_states(outs.cpu().double(), lses.cpu().double())
    assert out.dtype == partial_dtype and lse.dtype == torch.float32
    tol = 1e-5 if partial_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.cpu().double(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=1e-5, rtol=1e-5)
    assert out[1, 7, 2].eq(0).all() and lse[1, 2, 7] == float("-inf")


@requires_gpu
@pytest.mark.gpu
def test_flash_attn_over_chunks_merges_to_full_attention_gpu():
    q, k, v = make_qkv(2, 200, 1000, 8, 2, 128, torch.bfloat16, "cuda")
    parts = [fattn.flash_attn_func(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in ((0, 300), (300, 1000))]
    out, lse = fattn.merge_attention_states([p[0].float() for p in parts], [p[1] for p in parts])
    full_out, full_lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    torch.testing.assert_close(out, full_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, full_lse, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- gradients

def _merge_reference(outs, lses):
    """The merge written in torch ops, differentiable by autograd, -inf partials included (the
    shift by the row max is detached: lse and the weights do not depend on it)."""
    shift = lses.detach().amax(0)
    shift = torch.where(torch.isinf(shift), 0.0, shift)
    e = torch.exp(lses - shift)  # 0 for -inf partials
    denom = e.sum(0)
    seen = denom > 0
    safe_denom = torch.where(seen, denom, 1.0)
    lse = torch.where(seen, torch.log(safe_denom) + shift, float("-inf"))
    w = (e / safe_denom).transpose(-1, -2).unsqueeze(-1)
    out = (w * torch.where(w > 0, outs, 0.0)).sum(0)
    return out.to(outs.dtype), lse


def _plain_reference(outs, lses):
    """The formula as written: logsumexp and an exp-weighted sum (finite lses only)."""
    lse = torch.logsumexp(lses, 0)
    return (torch.exp(lses - lse).transpose(-1, -2).unsqueeze(-1) * outs).sum(0), lse


def _partials(splits, batch=2, seqlen_q=5, heads=3, head_dim=8, dtype=torch.float64, device="cpu", unseen=True,
              seed=0):
    """Random (outs, lses); with `unseen`, partial 0 saw no key in some rows (its out there is
    NaN, as a kernel may leave it) and row (batch 0, head 1, query 2) was seen by no partial."""
    g = torch.Generator().manual_seed(seed)
    outs = torch.randn(splits, batch, seqlen_q, heads, head_dim, generator=g, dtype=torch.float64)
    lses = 2 * torch.randn(splits, batch, heads, seqlen_q, generator=g, dtype=torch.float64)
    if unseen:
        lses[0, :, :, ::2] = float("-inf")
        outs[0, :, ::2] = float("nan")
        lses[:, 0, 1, 2] = float("-inf")
    return outs.to(device, dtype), lses.to(device, expected_lse_dtype(dtype))


def _finite(fn):
    """fn with the -inf lse of rows no partial saw replaced by 0 (finite differences of -inf are NaN)."""
    def f(*args):
        out, lse = fn(*args)
        return out, torch.where(torch.isinf(lse), 0.0, lse)
    return f


def _grads(fn, inputs, dout=None, dlse=None):
    """d (out . dout + lse . dlse) / d inputs through fn, None for an input it does not reach;
    rows with lse = -inf get no lse gradient."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    out, lse = fn(*inputs)
    loss = 0
    if dout is not None:
        loss = loss + (out.double() * dout.double()).sum()
    if dlse is not None:
        loss = loss + torch.where(torch.isinf(lse), 0.0, lse.double() * dlse.double()).sum()
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@pytest.mark.parametrize("head_dim", [8, 12, 5])
@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_merge_gradcheck_cpu(splits, head_dim):
    outs, lses = _partials(splits, head_dim=head_dim, unseen=splits > 1)
    if splits == 1:
        lses[0, 0, 1, 2] = float("-inf")  # the row no partial saw
    outs.requires_grad_(), lses.requires_grad_()
    f = _finite(fattn.merge_attention_states)
    assert torch.autograd.gradcheck(f, (outs, lses), eps=1e-6, atol=1e-8)
    if head_dim == 5:  # second order: the backward is differentiable (the smallest size: it is slow)
        assert torch.autograd.gradgradcheck(f, (outs, lses), eps=1e-6, atol=1e-8)
    # The list form: the gradient reaches each element through torch.stack.
    g = _finite(lambda *t: fattn.merge_attention_states(t[:splits], t[splits:]))
    parts = [o.detach().clone().requires_grad_() for o in outs] + [l.detach().clone().requires_grad_() for l in lses]
    assert torch.autograd.gradcheck(g, parts, eps=1e-6, atol=1e-8)


def test_merge_gradients_of_unseen_partials_are_exactly_zero():
    outs, lses = _partials(3)
    dout = torch.randn(outs.shape[1:], dtype=torch.float64)
    dlse = torch.randn(lses.shape[1:], dtype=torch.float64)
    douts, dlses = _grads(fattn.merge_attention_states, (outs, lses), dout, dlse)
    assert torch.isfinite(douts).all() and torch.isfinite(dlses).all()
    assert douts[0, :, ::2].eq(0).all() and dlses[0, :, :, ::2].eq(0).all()
    assert douts[:, 0, 2, 1].eq(0).all() and dlses[:, 0, 1, 2].eq(0).all()
    # A partial that saw no key in some rows still gets gradients in the rows it saw.
    assert douts[0, :, 1::2].ne(0).all() and dlses[0, :, :, 1::2].ne(0).all()
    # Everywhere, the float64 reference's.
    want = _grads(_merge_reference, (outs, lses), dout, dlse)
    torch.testing.assert_close(douts, want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dlses, want[1], rtol=1e-12, atol=1e-12)
    # Also with a gradient that is not 0 where lse = -inf (it has nothing to reach).
    dlse[0, 1, 2] = 1e30
    assert _grads(fattn.merge_attention_states, (outs, lses), dout, dlse)[1][:, 0, 1, 2].eq(0).all()


@pytest.mark.parametrize("form", ["stacked", "list"])
@pytest.mark.parametrize("used", ["out", "lse", "both"])
def test_merge_gradient_equals_the_formulas(form, used):
    outs, lses = _partials(4, batch=2, seqlen_q=9, heads=3, head_dim=32, dtype=torch.float32, unseen=False, seed=1)
    dout = torch.randn(outs.shape[1:]) if used in ("out", "both") else None
    dlse = torch.randn(lses.shape[1:]) if used in ("lse", "both") else None
    if form == "stacked":
        inputs, fn = (outs, lses), fattn.merge_attention_states
    else:
        inputs = (*outs, *lses)
        fn = lambda *t: fattn.merge_attention_states(list(t[:4]), list(t[4:]))  # noqa: E731
    got = _grads(fn, inputs, dout, dlse)
    want = _grads(lambda *t: _plain_reference(torch.stack(t[:4]), torch.stack(t[4:])) if form == "list"
                  else _plain_reference(*t), inputs, dout, dlse)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:  # only lse was used: out's formula does not reach outs
            assert g is None or g.eq(0).all(), f"input {i}"
            continue
        assert g is not None and g.dtype == inputs[i].dtype, f"input {i}"
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"input {i}: {m}")


@pytest.mark.parametrize("form", ["stacked", "list"])
def test_merge_backward_leaves_no_input_without_a_gradient(form):
    outs, lses = _partials(3, dtype=torch.float32)
    if form == "stacked":
        leaves = [outs.requires_grad_(), lses.requires_grad_()]
        out, lse = fattn.merge_attention_states(*leaves)
    else:
        leaves = [t.clone().requires_grad_() for t in (*outs, *lses)]
        out, lse = fattn.merge_attention_states(leaves[:3], leaves[3:])
    (out.sum() + torch.where(torch.isinf(lse), 0.0, lse).sum()).backward()
    for i, t in enumerate(leaves):
        assert t.grad is not None and torch.isfinite(t.grad).all(), f"input {i}"
    assert leaves[-1].grad.abs().sum() > 0


def _check_gradients(outs, lses, dout, dlse):
    """The gradients against the float64 reference's. d outs = w * dout, rounded once to the
    partials' dtype. d lses uses the out that the forward returned, rounded to that dtype: it may
    differ from the reference's by what that rounding explains, w_s * |dout| . |out - exact out|,
    and by float32 arithmetic."""
    douts, dlses = _grads(fattn.merge_attention_states, (outs, lses), dout, dlse)
    assert douts.dtype == outs.dtype and dlses.dtype == lses.dtype
    out = fattn.merge_attention_states(outs, lses)[0].cpu().double()
    outs, lses, dout, dlse = (t.cpu().double() for t in (outs, lses, dout, dlse))
    want_douts, want_dlses = _grads(_merge_reference, (outs, lses), dout, dlse)
    want_out, want_lse = _merge_reference(outs, lses)
    rounding = torch.finfo(douts.dtype).eps  # twice the unit roundoff
    torch.testing.assert_close(douts.cpu().double(), want_douts, rtol=rounding, atol=1e-6)
    w = torch.exp(lses - torch.where(torch.isinf(want_lse), 0.0, want_lse))
    explained = w * (dout.abs() * (out - want_out).abs()).sum(-1).transpose(-1, -2)
    error = (dlses.cpu().double() - want_dlses).abs()
    assert (error <= explained + 1e-5 * (1 + want_dlses.abs())).all(), f"max error {error.max():g}"
    return douts, dlses


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("head_dim", [16, 20, 256])
def test_merge_gradients_keep_the_inputs_dtypes_cpu(dtype, head_dim):
    outs, lses = _partials(4, seqlen_q=33, head_dim=head_dim, dtype=dtype, seed=head_dim)
    dout = torch.randn(outs.shape[1:]).to(dtype)
    dlse = torch.randn(lses.shape[1:]).to(lses.dtype)
    _check_gradients(outs, lses, dout, dlse)


def test_merge_second_order_matches_the_reference():
    outs, lses = _partials(3, head_dim=12)
    outs, lses = outs.requires_grad_(), lses.requires_grad_()
    dout = torch.randn(outs.shape[1:], dtype=torch.float64)
    dlse = torch.randn(lses.shape[1:], dtype=torch.float64)
    results = []
    for fn in (fattn.merge_attention_states, _merge_reference):
        out, lse = fn(outs, lses)
        loss = (out * dout).sum() + torch.where(torch.isinf(lse), 0.0, lse * dlse).sum()
        douts, dlses = torch.autograd.grad(loss, (outs, lses), create_graph=True)
        results.append(torch.autograd.grad((douts ** 2).sum() + (dlses ** 2).sum(), (outs, lses)))
    for got, want in zip(*results):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dynamic", [False, True])
def test_merge_compiled_training_matches_eager(dynamic):
    def step(outs, lses, dout, dlse):
        out, lse = fattn.merge_attention_states(outs, lses)
        return (out * dout).sum() + torch.where(torch.isinf(lse), 0.0, lse * dlse).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    for seqlen_q, head_dim in ((5, 16), (9, 12)):
        outs, lses = _partials(3, seqlen_q=seqlen_q, head_dim=head_dim, dtype=torch.float32)
        dout, dlse = torch.randn(outs.shape[1:]), torch.randn(lses.shape[1:])
        grads = []
        for fn in (compiled, step):
            o, l = outs.clone().requires_grad_(), lses.clone().requires_grad_()
            fn(o, l, dout, dlse).backward()
            grads.append((o.grad, l.grad))
        for got, want in zip(*grads):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head_dim", [1, 5, 12, 20, 33, 255])
def test_merge_any_head_dim(head_dim):
    outs, lses = _partials(3, head_dim=head_dim)
    out, lse = fattn.merge_attention_states(outs, lses)
    assert out.shape == outs.shape[1:]
    want_out, want_lse = _merge_reference(outs, lses)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    # The op on explicitly padded partials: the same numbers.
    padded_out, padded_lse = MERGE(torch.nn.functional.pad(outs, (0, -head_dim % 8)), lses)
    assert torch.equal(out, padded_out[..., :head_dim]) and torch.equal(lse, padded_lse)
    # Gradients flow back through the padding.
    dout, dlse = torch.randn(out.shape, dtype=torch.float64), torch.randn(lse.shape, dtype=torch.float64)
    got = _grads(fattn.merge_attention_states, (outs, lses), dout, dlse)
    want = _grads(_merge_reference, (outs, lses), dout, dlse)
    assert got[0].shape == outs.shape
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # The list form as well (float32 partials).
    parts = [o.float() for o in outs]
    out32, _ = fattn.merge_attention_states(parts, list(lses.float()))
    torch.testing.assert_close(out32.double(), want_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim", [0, 264])
def test_merge_head_dims_out_of_range_still_raise(head_dim):
    outs, lses = torch.randn(2, 1, 3, 2, head_dim), torch.randn(2, 1, 2, 3)
    with pytest.raises(RuntimeError, match=rf"head_dim {head_dim} is not supported"):
        fattn.merge_attention_states(outs, lses)


def test_merge_opcheck_with_gradients():
    """opcheck on the shared samples with inputs that require grad: the registered autograd,
    eager and traced (aot_dispatch), against the op."""
    for sample in merge_samples("cpu", torch.float64):
        args = tuple(a.detach().requires_grad_() for a in sample.args)
        torch.library.opcheck(MERGE, args)


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [20, 64, 256])
def test_merge_gradients_gpu(dtype, head_dim):
    outs, lses = _partials(4, batch=2, seqlen_q=77, heads=4, head_dim=head_dim, dtype=dtype, device="cuda", seed=3)
    dout = torch.randn(outs.shape[1:], device="cuda").to(dtype)
    dlse = torch.randn(lses.shape[1:], device="cuda")
    douts, dlses = _check_gradients(outs, lses, dout, dlse)
    assert douts.is_cuda and dlses.is_cuda
    assert douts[0, :, ::2].eq(0).all() and dlses[0, :, :, ::2].eq(0).all()
