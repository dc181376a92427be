"""The additive bias: what flash_attn_func accepts (any float dtype, boolean masks, any rank up to 4
broadcastable to [batch, heads, seqlen_q, seqlen_k]) turned into what fattn::forward takes (q's
dtype, 4-D, keys contiguous, size-1 dims broadcast by stride 0), and its gradient summed back
over the broadcast dims."""

from __future__ import annotations

import torch

from ._checks import fail, shape_of


def prepare(fn: str, bias, q, k):
    """The op's bias for a public call's `bias`; None stays None. Conversions are differentiable
    (autograd carries the gradient back to the caller's tensor)."""
    if bias is None:
        return None
    op = f"fattn.{fn}"
    if not isinstance(bias, torch.Tensor):
        fail(op, "bias must be a tensor, got ", type(bias).__name__)
    if bias.dim() > 4:
        fail(op, "bias has shape ", shape_of(bias), "; expected at most 4 dims, broadcastable to [batch, heads, "
             "seqlen_q, seqlen_k]")
    full = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    if any(n not in (1, f) for n, f in zip(bias.shape, full)):
        fail(op, "bias has shape ", shape_of(bias), ", which does not broadcast to [batch, heads, seqlen_q, "
             "seqlen_k] = [", ", ".join(str(f) for f in full), "]")
    if bias.dtype == torch.bool:  # True = attend
        bias = torch.zeros((), dtype=q.dtype, device=bias.device).masked_fill(~bias, float("-inf"))
    elif not bias.is_floating_point():
        fail(op, "bias has dtype ", str(bias.dtype).removeprefix("torch."), "; expected a float dtype or bool")
    else:
        bias = bias.to(q.dtype)
    if bias.shape[3] != full[3]:  # broadcast over the keys: the kernels read keys contiguously
        bias = bias.expand(*bias.shape[:3], full[3])
    if full[3] > 1 and bias.stride(3) != 1:
        # (an empty tensor counts as contiguous whatever its strides, so .contiguous() keeps them)
        bias = bias.clone(memory_format=torch.contiguous_format) if bias.numel() == 0 else bias.contiguous()
    return bias


def reduce_gradient(dbias_full, bias):
    """d loss / d bias from the op's unreduced [batch, heads, seqlen_q, seqlen_k] gradient."""
    dims = [d for d in range(4) if bias.shape[d] == 1 and dbias_full.shape[d] != 1]
    grad = dbias_full.sum(dims, keepdim=True) if dims else dbias_full
    return grad.to(bias.dtype)
