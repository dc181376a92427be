"""Random inputs, devices, the contract's lse dtype, the accuracy rules, output poisoning."""

from __future__ import annotations

import pytest
import torch

from fattn.reference import attention_reference

HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


def device_dtype_params(cpu, cuda):
    """(device, dtype) parameters: `cpu` dtypes on the CPU always, `cuda` dtypes on a GPU where
    there is one; the CUDA cases carry the gpu mark, which the GPU machine's run selects."""
    params = []
    for device, dtypes in (("cpu", cpu), ("cuda", cuda)):
        marks = [requires_gpu, pytest.mark.gpu] if device == "cuda" else []
        params += [pytest.param(device, d, marks=marks, id=f"{device}-{str(d).removeprefix('torch.')}") for d in dtypes]
    return params


def expected_lse_dtype(dtype):
    """The contract, stated by the tests: lse is float32, float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def make_qkv(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, device, layout="contiguous"):
    """Random q, k, v; `layout` "strided" returns non-contiguous views of larger tensors."""
    if layout == "contiguous":
        q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
        k = torch.randn(batch, seqlen_k, kv_heads, head_dim, dtype=dtype, device=device)
        v = torch.randn(batch, seqlen_k, kv_heads, head_dim, dtype=dtype, device=device)
        return q, k, v
    # Views of one fused [batch, seq, heads + 2 * kv_heads, head_dim + 8] buffer:
    # seq and head strides that are not the tensor's own sizes, and a padded row.
    fused_k = torch.randn(batch, seqlen_k, 2 * kv_heads, head_dim + 8, dtype=dtype, device=device)
    q_big = torch.randn(batch, heads, seqlen_q, head_dim, dtype=dtype, device=device)
    q = q_big.transpose(1, 2)  # [b, s, h, d] with the seq stride smaller than the head stride
    k = fused_k[:, :, :kv_heads, :head_dim]
    v = fused_k[:, :, kv_heads:, 8:]
    return q, k, v


def poison_allocator(*shapes_dtypes, device):
    """Leave NaN-filled blocks of these sizes in torch's cache, so that an output
    that the kernel fails to write is seen as NaN instead of stale zeros."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device=device) for shape, dtype in shapes_dtypes]
    del blocks


def check_accuracy(out, lse, q, k, v, softmax_scale, causal, what="", **variant):
    """The flash-attn rule: max |fattn - ref64| <= 2 * max |torch_lowp - ref64| + 1e-5.
    `variant`: attention_reference's window_size, softcap, alibi_slopes."""
    ref64, ref_lse = attention_reference(q.double(), k.double(), v.double(), softmax_scale, causal, **variant)
    low_out, _ = attention_reference(q, k, v, softmax_scale, causal, dtype=q.dtype, **variant)
    assert not torch.isnan(out).any(), f"{what}: NaN in out (unwritten or bad math)"
    err = (out.double() - ref64).abs().max().item()
    base = (low_out.double() - ref64).abs().max().item()
    assert err <= 2 * base + 1e-5, f"{what}: out error {err:.3e} > 2 x torch error {base:.3e} + 1e-5"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: lse -inf pattern differs"
    if finite.any():
        lse_err = (lse[finite].double() - ref_lse[finite].double()).abs().max().item()
        assert lse_err <= 5e-3, f"{what}: lse error {lse_err:.3e}"
    return err, base


def grads_of(fn, q, k, v, w_out, w_lse):
    """d(sum(out * w_out) + sum(lse * w_lse)) / d(q, k, v) for (out, lse) = fn(q, k, v)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    loss = (out.to(w_out.dtype) * w_out).sum() + (lse.to(w_lse.dtype) * w_lse).sum()
    return torch.autograd.grad(loss, (q, k, v))


def check_variant_gradients(q, k, v, what, causal=False, deterministic=False, **variant):
    """fattn's dq, dk, dv of sum(out * w_out) + sum(lse * w_lse), with random weights, against
    float64 autograd through the reference, by check_gradients' rule. `variant`: the keyword
    arguments flash_attn_func and attention_reference share (window_size, softcap, alibi_slopes,
    segment ids). Rows that see no key (lse -inf in the reference) get no lse weight."""
    import fattn

    ref_lse = attention_reference(q.double(), k.double(), v.double(), None, causal, **variant)[1]
    w_out = torch.randn(q.shape, device=q.device)
    w_lse = torch.randn(ref_lse.shape, device=q.device).masked_fill(torch.isinf(ref_lse), 0)
    got = grads_of(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True,
                                                         deterministic=deterministic, **variant),
                   q, k, v, w_out, w_lse)
    ref = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=torch.float64, **variant),
                   q.double(), k.double(), v.double(), w_out.double(), w_lse.double())
    low = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=q.dtype, **variant),
                   q, k, v, w_out, w_lse)
    check_gradients(got, ref, low, q.dtype, what=what)


def loss_gradients(fn, tensors, w_out, w_lse):
    """float64 d(sum(out * w_out) + sum(lse * w_lse)) / d tensors for (out, lse) = fn(*tensors)."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    out, lse = fn(*leaves)
    loss = (out.to(w_out.dtype) * w_out).sum() + (lse.to(w_lse.dtype) * w_lse).sum()
    return [g.double() for g in torch.autograd.grad(loss, leaves)]


def check_loss_gradients(fn, reference, tensors, w_out, w_lse, dtype, what=""):
    """fattn's gradients of sum(out * w_out) + sum(lse * w_lse) against float64's by
    check_gradients' rule: fn(*tensors) -> (out, lse) is fattn's, reference(dtype) the reference
    computed in a dtype. tensors: q, k, v and optionally a bias, whose gradient takes the same
    rule."""
    got = loss_gradients(fn, tensors, w_out, w_lse)
    ref = loss_gradients(reference(torch.float64), [t.double() if t.is_floating_point() else t for t in tensors],
                         w_out.double(), w_lse.double())
    low = loss_gradients(reference(dtype), tensors, w_out, w_lse)
    check_gradients([g.to(dtype) for g in got[:3]], ref[:3], low[:3], dtype, what=what)
    if len(tensors) > 3:
        assert got[3].shape == tensors[3].shape
        err, base = (got[3] - ref[3]).abs().max().item(), (low[3] - ref[3]).abs().max().item()
        rounding = 0.5 * torch.finfo(dtype).eps * ref[3].abs().max().item()
        assert err <= 2 * base + 1e-5 + rounding, f"{what} dbias {err:.3e} > 2 x {base:.3e} + 1e-5 + {rounding:.3e}"


def check_gradients(got, ref, low, dtype, what=""):
    """The 2x rule for gradients: max |got - ref64| <= 2 * max |low - ref64| + 1e-5, plus half
    an ulp of `dtype` at the gradient's largest value. `low` is torch's own gradient in `dtype`.

    The half ulp is the rounding of the stored gradient (and of dS before its matmul, as in
    FlashAttention) that no kernel avoids: on a tensor of a few dozen elements (seqlen 1, one
    head) torch's own error is too small a sample to bound it; seen on the H100, dk 4.9e-4
    against 2 x 1.8e-4 with |dk| up to ~1 in float16."""
    for g, r, l, name in zip(got, ref, low, ("dq", "dk", "dv")):
        assert g.dtype == dtype and g.shape == r.shape, f"{what} {name}: {g.dtype} {tuple(g.shape)}"
        assert not torch.isnan(g).any(), f"{what} {name}: NaN"
        if not g.numel():
            continue
        err = (g.double() - r.double()).abs().max().item()
        base = (l.double() - r.double()).abs().max().item()
        rounding = 0.5 * torch.finfo(dtype).eps * r.abs().max().item()
        assert err <= 2 * base + 1e-5 + rounding, (
            f"{what} {name}: error {err:.3e} > 2 x torch error {base:.3e} + 1e-5 + {rounding:.3e}")
