"""return_attn_probs=True with dropout: flash-attn's S_dmask, rebuilt for tests.

flash-attn returns, beside out and lse, the probabilities its kernel computed, with the dropout
decision in their sign: S_dmask [batch, heads, seqlen_q rounded up to 128, seqlen_k rounded up
to 128] in q's dtype, exp(s - m) for a kept key, -exp(s - m) for a dropped one, 0 where the
query sees no key and in the rounding margin (m: its kernel's running row max). Its test helpers
turn S_dmask into the keep mask (S >= 0) and the probabilities (|S| times exp(m - lse), per block
of keys). The packed layout puts sequence b's query t at row t and its key j at column j of
S_dmask[b], with batch = the number of sequences and the lengths rounded from max_seqlen_q/k.

fattn's kernels never write the probabilities: they are rebuilt here from q and k with torch
operations on q's device (the scores as fattn.reference defines them, in float32, or float64
for float64 inputs) and the keep
decisions as the kernels draw them (fattn.reference.dropout_keep_at, the same definition). m is
the row's max over all of its keys, so a row is a single block of keys: flash-attn's
normalize_flash_attn_S needs a block width that covers every key (docs say so).

Cost: time and memory in batch x heads x seqlen_q x seqlen_k (one sequence at a time), and a
host read of the seed, and of the offsets in the packed layout. For tests, not for training.
"""

from __future__ import annotations

import torch

from ._checks import lse_dtype
from .reference import attention_scores, dropout_keep_at

ROUNDING = 128


def _rounded(n: int) -> int:
    return (n + ROUNDING - 1) // ROUNDING * ROUNDING


def _signed_probabilities(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """exp(s - row max), negated where the key is dropped; 0 in rows that see no key."""
    row_max = scores.amax(-1, keepdim=True)
    row_max = row_max.masked_fill(row_max == float("-inf"), 0.0)
    probabilities = torch.exp(scores - row_max)
    return torch.where(keep, probabilities, -probabilities)


def _alibi_of(alibi_slopes, b: int):
    return alibi_slopes[b:b + 1] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes


def _fill_sequence(s_dmask, b, q_b, k_b, seed, dropout_p, variant):
    """Writes S_dmask[b] for one sequence: q_b [1, seqlen_q, heads, dim], k_b [1, seqlen_k, kv_heads, dim]."""
    heads, seqlen_q, seqlen_k = q_b.shape[2], q_b.shape[1], k_b.shape[1]
    scores = attention_scores(q_b, k_b, dtype=lse_dtype(q_b.dtype), **variant)[0]  # float32, float64 for float64
    device = q_b.device
    keep = dropout_keep_at(seed, b, torch.arange(heads, device=device)[:, None, None],
                           torch.arange(seqlen_q, device=device)[:, None], torch.arange(seqlen_k, device=device),
                           dropout_p)
    s_dmask[b, :, :seqlen_q, :seqlen_k] = _signed_probabilities(scores, keep)


@torch.no_grad()
def dense(q, k, dropout_p, dropout_seed, softmax_scale, causal, window, softcap, alibi_slopes, q_segment_ids,
          kv_segment_ids, bias, alibi_offset=0):
    """S_dmask of a flash_attn_func call (its op arguments: q, k as the op took them)."""
    batch, seqlen_q, heads, _ = q.shape
    s_dmask = q.new_zeros(batch, heads, _rounded(seqlen_q), _rounded(k.shape[1]))
    for b in range(batch):
        variant = dict(softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap,
                       alibi_slopes=_alibi_of(alibi_slopes, b), alibi_offset=alibi_offset,
                       q_segment_ids=None if q_segment_ids is None else q_segment_ids[b:b + 1],
                       kv_segment_ids=None if kv_segment_ids is None else kv_segment_ids[b:b + 1],
                       bias=None if bias is None else bias[b:b + 1] if bias.shape[0] > 1 else bias)
        _fill_sequence(s_dmask, b, q[b:b + 1], k[b:b + 1], dropout_seed, dropout_p, variant)
    return s_dmask


@torch.no_grad()
def packed(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, dropout_p, dropout_seed,
           softmax_scale, causal, window, softcap, alibi_slopes):
    """S_dmask of a flash_attn_varlen_func call: q [total_q, heads, dim], k [total_k, kv_heads, dim]."""
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    batch, heads = len(starts_q) - 1, q.shape[1]
    s_dmask = q.new_zeros(batch, heads, _rounded(max_seqlen_q), _rounded(max_seqlen_k))
    for b in range(batch):
        keys = starts_k[b + 1] - starts_k[b] if used is None else used[b]
        variant = dict(softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap,
                       alibi_slopes=_alibi_of(alibi_slopes, b))
        _fill_sequence(s_dmask, b, q[starts_q[b]:starts_q[b + 1]][None], k[starts_k[b]:starts_k[b] + keys][None],
                       dropout_seed, dropout_p, variant)
    return s_dmask
