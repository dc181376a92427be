"""The online softmax, in the log2 domain (triton_src/constants.py): its running state, one
tile's step, the end-of-loop normalisation, the backward's lse, and the one-pass merge of
partial results by their lse (split-K decoding, ring attention's merge).
"""

import triton
import triton.language as tl

from .constants import LN2, LOG2E


@triton.jit
def softmax_step(m_i, l_i, acc, qk, MAY_BE_EMPTY: tl.constexpr):
    """Folds one tile of scores `qk` [rows, keys] into the running row max `m_i`, row sum
    `l_i` and unnormalised accumulator `acc`: returns the tile's probabilities p (to be
    multiplied by V into acc) and the updated (m_i, l_i, acc).

    MAY_BE_EMPTY: some row may have seen only masked (-inf) scores so far; it keeps m = -inf
    and is shifted by 0 instead, which keeps exp2(-inf - -inf) = NaN out of p and alpha.
    """
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    if MAY_BE_EMPTY:
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    p = tl.math.exp2(qk - m_shift[:, None])
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, acc


@triton.jit
def initial_softmax_state(Sinks, head, use_sinks, BLOCK_M: tl.constexpr):
    """(m_i, l_i) before the first key: -inf and 0; with sinks (use_sinks != 0: one logit per
    query head, float32 at Sinks + head, that joins the softmax denominator and carries no
    value) the head's logit in the log2 domain and exp2(0) = 1. The sink is counted once per
    row this way, whatever the number of key tiles; a row that sees no key then gives out 0
    and lse = sink. `head` is a scalar or one head per row."""
    sink = tl.load(Sinks + head, mask=use_sinks != 0, other=0.0) * LOG2E
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.where(use_sinks != 0, sink, float("-inf"))
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.where(use_sinks != 0, 1.0, 0.0)
    return m_i, l_i


@triton.jit
def softmax_finish(acc, l_i, m_i):
    """(out, lse) of a finished online softmax: out = acc / l_i, lse = natural log of the
    denominator. Rows that saw no key (l_i == 0) give out 0 and lse -inf."""
    empty_row = l_i == 0.0
    out = acc / tl.where(empty_row, 1.0, l_i)[:, None]
    lse = tl.where(empty_row, float("-inf"), (m_i + tl.math.log2(l_i)) * LN2)
    return out, lse


@triton.jit
def lse_log2(lse_base, rows, seqlen_q):
    """The backward's lse, read at lse_base + rows, in the log2 domain; rows that saw no key (-inf)
    or lie past the end get +inf, so that exp2(s - lse) is 0 for them instead of inf or NaN."""
    lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse * LOG2E


@triton.jit
def merge_rescale(m, chunk_max):
    """One step of the one-pass lse merge (partials by their natural-log lse): the running
    maximum after a chunk of partials whose largest lse is `chunk_max`, the shift their
    weights exp(lse - shift) use (0 while every partial so far saw no key, so that -inf
    stays -inf and never becomes NaN), and the factor that rescales what was accumulated."""
    # NaN propagates (a NaN lse must not pass for "no key"): it reaches shift, so the
    # weights, the accumulator and the lse all become NaN.
    m_new = tl.maximum(m, chunk_max, propagate_nan=tl.PropagateNan.ALL)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, shift, tl.exp(m - shift)


@triton.jit
def merge_finish(total, m):
    """(denominator, lse) of a finished merge: out = acc / denominator, lse = m + log(total).
    A row that no partial saw (total == 0) gets denominator 1 (its acc is 0) and lse -inf."""
    empty = total == 0.0
    shift = tl.where(m == float("-inf"), 0.0, m)
    return tl.where(empty, 1.0, total), tl.where(empty, float("-inf"), shift + tl.log(total))
