"""Plain PyTorch attention in any precision: the yardstick for tests and benchmarks.

Same conventions as fattn (layout [batch, seqlen, heads, head_dim], GQA by head
groups, bottom-right causal, lse -inf and out 0 for rows that see no key).
"""

from __future__ import annotations

import math

import torch


def attention_reference(q, k, v, softmax_scale=None, causal=False, dtype=torch.float64):
    """(out, lse) computed in `dtype` (float64 by default) with a materialised score matrix."""
    out_dtype = q.dtype
    q, k, v = (t.to(dtype) for t in (q, k, v))
    heads, kv_heads, head_dim = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    if causal:
        row = torch.arange(seqlen_q, device=q.device)[:, None]
        col = torch.arange(seqlen_k, device=q.device)[None, :]
        scores = scores.masked_fill(col > row + (seqlen_k - seqlen_q), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # empty rows: exp(-inf - -inf)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    # lse follows fattn's contract: float32, float64 for float64 inputs.
    return out.to(out_dtype), lse.to(torch.float64 if out_dtype == torch.float64 else torch.float32)
