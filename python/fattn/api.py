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


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    num_splits: int = 0,
    return_lse: bool = False,
):
    """Attention of a few new query tokens over a KV cache (flash decoding), in
    flash-attn's conventions. Inference only (no autograd).

    Args:
        q: [batch, seqlen_q, heads, head_dim] with 1 <= seqlen_q <= 16 (speculative
           decoding), float16 or bfloat16 on CUDA.
        k_cache, v_cache: [batch, capacity, kv_heads, head_dim], or with block_table a
           paged cache [num_pages, page_size, kv_heads, head_dim] (page_size a multiple
           of 16). Updated in place when k/v are given.
        k, v: optional new tokens [batch, seqlen_new, kv_heads, head_dim], written into the
           cache at positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before
           attending. cache_seqlens itself is not advanced: that is the caller's job.
        cache_seqlens: int32 [batch] (or an int for every sequence): keys already in each
           sequence's cache. None means every sequence fills its cache.
        block_table: int32 [batch, pages_per_seq]: key j of sequence b lives in page
           block_table[b, j // page_size] at slot j % page_size.
        softmax_scale: default 1/sqrt(head_dim).
        causal: query t sees key j iff j <= t + seqlen_k - seqlen_q (bottom-right), the
           same as window_size=(left, 0).
        window_size: (left, right) sliding window; -1 is unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        num_splits: split-K chunks per sequence on CUDA; 0 picks them from the shapes and
           the SM count. The grid never depends on cache_seqlens' values, so a decode step
           can be captured in a CUDA graph and replayed with new lengths.
        return_lse: also return lse, float32 [batch, heads, seqlen_q].

    Returns:
        out [batch, seqlen_q, heads, head_dim] in q's dtype, or (out, lse). Rows that see
        no key give out = 0 and lse = -inf.

    On CUDA, an append past a sequence's capacity is dropped and out-of-range
    block_table entries are not detected (checking either needs the device's values,
    a host sync); the CPU implementation raises for both.
    """
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    left, right = window_size
    out, lse = torch.ops.fattn.decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, softmax_scale,
                                      causal, left, right, softcap, num_splits)
    return (out, lse) if return_lse else out
