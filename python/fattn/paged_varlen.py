"""flash_attn_varlen_func with block_table: packed query sequences over a paged KV cache
(chunked prefill in serving engines), forward only.

The packed queries are laid out as a left-padded batch [batch, max_seqlen_q, heads, head_dim]
(sequence b's query t at row max_seqlen_q - len_b + t) and handed to fattn::decode with the
page table and each sequence's key count. Left padding keeps the bottom-right alignment of
every sequence: row r = max_seqlen_q - len_b + t sees key j iff j <= r + seqlen_k - max_seqlen_q
= t + seqlen_k - len_b, the varlen rule. The padding rows are computed and dropped. Every step is
a tensor operation sized by shapes and max_seqlen_q alone: no host sync, capturable in a CUDA graph.

fattn::decode speaks of cache_seqlens and k_cache; the caller passed cu_seqlens_k (or seqused_k)
and k. So that every error names the caller's arguments, the layout is checked here first, and
the values too where they can be read without a host sync (CPU tensors, or CUDA tensors under
FATTN_DEBUG_CHECKS=1, the switch that checks decode's values).
"""

from __future__ import annotations

import os

import torch

from . import _forward_only, _head_dim
from ._checks import (
    check_attention_dtype, check_head_groups, check_index_tensor, check_last_dim_contiguous,
    check_public_head_dim, check_same_device, check_same_dtype, fail, shape_of,
)
from ._library import load_library

load_library()
_decode_op = torch.ops.fattn.decode.default
_FN = "fattn.flash_attn_varlen_func"
_NO_BACKWARD = ("fattn.flash_attn_varlen_func with block_table (paged keys) has no backward (it is for "
                "inference): the gradient cannot reach its inputs; pass k and v as packed tensors, without "
                "block_table, where gradients are needed")


def _check_offsets(name, t, length, q):
    check_index_tensor(_FN, name, t, 1, q)
    if t.shape[0] != length:
        fail(_FN, name, " has shape ", shape_of(t), "; expected [", length, "]")


def _check_layout(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k):
    """The caller's tensors, named as the caller passed them; returns batch."""
    if q.dim() != 3:
        fail(_FN, "q has shape ", shape_of(q), "; expected [total_q, heads, head_dim]")
    check_attention_dtype(_FN, "q", q)
    for name, t in (("k", k_cache), ("v", v_cache)):
        if t.dim() != 4:
            fail(_FN, name, " has shape ", shape_of(t), "; with block_table, k and v are a paged cache [num_pages, ",
                 "page_size, kv_heads, head_dim]")
        check_same_device(_FN, name, t, "q", q)
        check_same_dtype(_FN, name, t, "q", q)
        if t.shape[3] != q.shape[2]:
            fail(_FN, name, " has head_dim ", t.shape[3], " but q has ", q.shape[2])
        check_last_dim_contiguous(_FN, name, t, "; call .contiguous() first")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        fail(_FN, "v has shape ", shape_of(v_cache), " but k has ", shape_of(k_cache), "; they must have the same shape")
    check_public_head_dim(_FN, q.shape[2])
    check_head_groups(_FN, q.shape[1], k_cache.shape[2], "k and v")
    page_size = k_cache.shape[1]
    if page_size < 16 or page_size % 16 != 0:
        fail(_FN, "k has pages of ", page_size, " keys (k.size(1) with block_table); expected a multiple of 16")
    check_index_tensor(_FN, "block_table", block_table, 2, q)
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        fail(_FN, "block_table must have a contiguous last dim (stride 1)")
    batch = block_table.shape[0]
    _check_offsets("cu_seqlens_q", cu_seqlens_q, batch + 1, q)
    if seqused_k is not None:
        _check_offsets("seqused_k", seqused_k, batch, q)
    else:
        _check_offsets("cu_seqlens_k", cu_seqlens_k, batch + 1, q)
    if not isinstance(max_seqlen_q, torch.SymInt) and max_seqlen_q < 1:
        fail(_FN, "max_seqlen_q is ", max_seqlen_q, "; expected a positive int (the longest query sequence)")
    return batch


def _values_readable(*tensors) -> bool:
    """Whether the index values can be checked without a host sync (or the caller asked for one)."""
    on_cpu = all(t is None or t.device.type == "cpu" for t in tensors)
    return on_cpu or os.environ.get("FATTN_DEBUG_CHECKS") == "1"


def _check_values(total_q, max_seqlen_q, num_pages, page_size, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k):
    """The values decode would refuse, named as the caller passed them."""
    cu_q = cu_seqlens_q.tolist()
    for b in range(len(cu_q) - 1):
        length = cu_q[b + 1] - cu_q[b]
        if cu_q[b] < 0 or length < 0 or cu_q[b + 1] > total_q:
            fail(_FN, "cu_seqlens_q[", b, ":", b + 2, "] is ", cu_q[b:b + 2], "; expected non-decreasing offsets in [0, ",
                 total_q, "]")
        if length > max_seqlen_q:
            fail(_FN, "sequence ", b, " has ", length, " queries, more than max_seqlen_q = ", max_seqlen_q)
    if seqused_k is not None:
        keys, name = seqused_k.tolist(), "seqused_k[{b}] is {n}"
    else:
        cu_k = cu_seqlens_k.tolist()
        keys, name = [cu_k[b + 1] - cu_k[b] for b in range(len(cu_k) - 1)], "cu_seqlens_k[{b} + 1] - cu_seqlens_k[{b}] is {n}"
    table = block_table.tolist()
    capacity = block_table.shape[1] * page_size
    for b, n in enumerate(keys):
        if n < 0:
            fail(_FN, name.format(b=b, n=n), "; expected a key count >= 0")
        if n > capacity:
            fail(_FN, "sequence ", b, " has ", n, " keys but block_table holds ", block_table.shape[1], " pages of ",
                 page_size, " per sequence (", capacity, " keys); give block_table more columns")
        for p in range(-(-n // page_size)):
            if not 0 <= table[b][p] < num_pages:
                fail(_FN, "block_table[", b, ", ", p, "] is ", table[b][p], "; expected a page index of k in [0, ",
                     num_pages, ")")


def paged_varlen_forward(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k,
                         softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sinks):
    """(out [total_q, heads, head_dim], lse float32 [heads, total_q]); rows outside every
    sequence get out 0 and lse 0, as in the dense varlen path."""
    batch = _check_layout(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k)
    if _values_readable(cu_seqlens_q, cu_seqlens_k, block_table, seqused_k):
        _check_values(q.shape[0], max_seqlen_q, k_cache.shape[0], k_cache.shape[1], cu_seqlens_q, cu_seqlens_k,
                      block_table, seqused_k)
    padding = _head_dim.Padding(q, k_cache, v_cache)  # a head dim that is not a multiple of 8

    def attend():
        padded_q, padded_k, padded_v = padding.inputs(q, k_cache, v_cache)
        return _left_padded_decode(padded_q, padded_k, padded_v, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   block_table, seqused_k, padding.scale(softmax_scale), causal, window_left,
                                   window_right, softcap, alibi_slopes, sinks)

    out, lse = _forward_only.call(_NO_BACKWARD, attend, (q, k_cache, v_cache, alibi_slopes, sinks))
    return padding.output(out), lse


def _left_padded_decode(q, k_cache, v_cache, batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k,
                        softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sinks):
    total_q, heads, head_dim = q.shape
    starts = cu_seqlens_q[:-1].long()
    pad = max_seqlen_q - (cu_seqlens_q[1:].long() - starts)              # [batch] left padding rows
    rows = torch.arange(max_seqlen_q, device=q.device)
    source = starts[:, None] + rows[None, :] - pad[:, None]              # [batch, max_seqlen_q]
    real = rows[None, :] >= pad[:, None]
    last = max(total_q - 1, 0)
    q_padded = q.new_zeros(1, heads, head_dim).expand(batch, max_seqlen_q, heads, head_dim) if total_q == 0 else \
        q[source.clamp(0, last)]
    seqlens_k = seqused_k if seqused_k is not None else (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    out_padded, lse_padded = _decode_op(
        q_padded.contiguous(), k_cache, v_cache, None, None, None, None, seqlens_k, None, None, block_table,
        softmax_scale, causal, window_left, window_right, softcap, True, alibi_slopes, 0, sinks)
    # Scatter the real rows back; padding rows land on a spare row past the end.
    target = torch.where(real, source, total_q).flatten()
    out = q.new_zeros(total_q + 1, heads, head_dim)
    out.index_copy_(0, target, out_padded.flatten(0, 1))
    lse = lse_padded.new_zeros(total_q + 1, heads)
    lse.index_copy_(0, target, lse_padded.transpose(1, 2).flatten(0, 1))
    return out[:total_q], lse[:total_q].t().contiguous()
