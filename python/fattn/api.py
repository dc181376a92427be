"""The public Python API, in flash-attn's conventions. Differentiable through
fattn::backward (registered in _autograd.py)."""

from __future__ import annotations

import torch


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
):
    """Scaled dot-product attention, FlashAttention-2 style.

    Args:
        q: [batch, seqlen_q, heads, head_dim], float16 or bfloat16 on CUDA
           (float32/float64 also accepted on CPU, where a reference implementation runs).
        k, v: [batch, seqlen_k, kv_heads, head_dim]; heads must be a multiple of
           kv_heads (GQA/MQA). Any batch/seq/head strides; the last dim contiguous.
        softmax_scale: multiplies q @ k^T before the softmax; default 1/sqrt(head_dim).
        causal: mask keys after the query's position, aligned to the bottom-right
           corner when seqlen_q != seqlen_k (query i sees key j iff
           j <= i + seqlen_k - seqlen_q). Rows that see no key give 0.
        return_lse: also return the log-sum-exp of the scaled scores,
           float32 [batch, heads, seqlen_q] (natural log, -inf for empty rows;
           float64 for float64 inputs on CPU).
           It is differentiable: a gradient flowing into lse reaches q and k.
        deterministic: ask for a bitwise reproducible backward. The current
           backward kernels use no atomics, so every mode is reproducible.

    Returns:
        out [batch, seqlen_q, heads, head_dim] in q's dtype, or (out, lse).
    """
    out, lse = torch.ops.fattn.forward(q, k, v, softmax_scale, causal, deterministic)
    return (out, lse) if return_lse else out
