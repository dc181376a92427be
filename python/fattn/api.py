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


def merge_attention_states(outs, lses):
    """Combine attention results over disjoint key sets into the result over their union.

    Args:
        outs: partial outputs, a tensor [splits, batch, seqlen_q, heads, head_dim] or a
           sequence of [batch, seqlen_q, heads, head_dim] tensors (fp32, fp16 or bf16).
        lses: their log-sum-exps, [splits, batch, heads, seqlen_q] or a sequence of
           [batch, heads, seqlen_q], float32 (as returned with return_lse=True).

    Returns:
        (out, lse): out in the partials' dtype, lse float32. The merge runs in fp32:
        out = sum_s exp(lse_s - lse) out_s with lse = logsumexp_s lse_s. Partials with
        lse = -inf (they saw no key) are ignored; a row no partial saw gives 0 and -inf.
        Serves split-K decoding, ring attention and cascade inference alike.
    """
    if not isinstance(outs, torch.Tensor):
        outs = torch.stack(list(outs))
    if not isinstance(lses, torch.Tensor):
        lses = torch.stack(list(lses))
    return torch.ops.fattn.merge_attention_states(outs, lses)
