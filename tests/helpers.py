"""Shared pieces of the tests: random inputs, the accuracy rule, output poisoning."""

from __future__ import annotations

import torch

from fattn.reference import attention_reference


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


def check_accuracy(out, lse, q, k, v, softmax_scale, causal, what=""):
    """The flash-attn rule: max |fattn - ref64| <= 2 * max |torch_lowp - ref64| + 1e-5."""
    ref64, ref_lse = attention_reference(q.double(), k.double(), v.double(), softmax_scale, causal)
    low_out, _ = attention_reference(q, k, v, softmax_scale, causal, dtype=q.dtype)
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
