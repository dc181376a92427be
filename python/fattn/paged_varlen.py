"""flash_attn_varlen_func with block_table: packed query sequences over a paged KV cache
(chunked prefill in serving engines), forward only.

The packed queries are laid out as a left-padded batch [batch, max_seqlen_q, heads, head_dim]
(sequence b's query t at row max_seqlen_q - len_b + t) and handed to fattn::decode with the
page table and each sequence's key count. Left padding keeps the bottom-right alignment of
every sequence: row r = max_seqlen_q - len_b + t sees key j iff j <= r + seqlen_k - max_seqlen_q
= t + seqlen_k - len_b, the varlen rule. The padding rows are computed and dropped. Every step is
a tensor operation sized by shapes and max_seqlen_q alone: no host sync, capturable in a CUDA graph.
"""

from __future__ import annotations

import torch

from ._checks import check_index_tensor, fail, shape_of
from ._library import load_library

load_library()
_decode_op = torch.ops.fattn.decode.default
_FN = "fattn.flash_attn_varlen_func"


def _check_offsets(name, t, length, q):
    check_index_tensor(_FN, name, t, 1, q)
    if t.shape[0] != length:
        fail(_FN, name, " has shape ", shape_of(t), "; expected [", length, "]")


def _check_query_offsets(cu_seqlens_q, total_q, max_seqlen_q):
    """On CPU, the values the layout relies on (a CUDA tensor's values stay on the device)."""
    if cu_seqlens_q.device.type != "cpu":
        return
    cu = cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        length = cu[b + 1] - cu[b]
        if cu[b] < 0 or length < 0 or cu[b + 1] > total_q:
            fail(_FN, "cu_seqlens_q[", b, ":", b + 2, "] is ", cu[b:b + 2], "; expected non-decreasing offsets in [0, ",
                 total_q, "]")
        if length > max_seqlen_q:
            fail(_FN, "sequence ", b, " has ", length, " queries, more than max_seqlen_q = ", max_seqlen_q)


def paged_varlen_forward(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, block_table, seqused_k,
                         softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, sinks):
    """(out [total_q, heads, head_dim], lse float32 [heads, total_q]); rows outside every
    sequence get out 0 and lse 0, as in the dense varlen path."""
    if q.dim() != 3:
        fail(_FN, "q has shape ", shape_of(q), "; expected [total_q, heads, head_dim]")
    if block_table.dim() != 2:
        fail(_FN, "block_table has shape ", shape_of(block_table), "; expected [batch, pages_per_seq]")
    batch = block_table.shape[0]
    _check_offsets("cu_seqlens_q", cu_seqlens_q, batch + 1, q)
    if seqused_k is not None:
        _check_offsets("seqused_k", seqused_k, batch, q)
    else:
        _check_offsets("cu_seqlens_k", cu_seqlens_k, batch + 1, q)
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 1:
        fail(_FN, "max_seqlen_q is ", max_seqlen_q, "; expected a positive int (the longest query sequence)")
    total_q, heads, head_dim = q.shape
    _check_query_offsets(cu_seqlens_q, total_q, max_seqlen_q)

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
