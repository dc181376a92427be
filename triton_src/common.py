"""@triton.jit pieces shared by the kernel families: the online softmax, its end-of-loop
normalisation, the lse merge, the causal key range, and the constants they use.

Scores live in the log2 domain everywhere (the host folds log2(e) into the scale and the
kernels use exp2, one MUFU instruction); lse leaves the kernels as a natural log.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): natural-log values into the log2 domain
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log2-domain values back to natural logs


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
def softmax_finish(acc, l_i, m_i):
    """(out, lse) of a finished online softmax: out = acc / l_i, lse = natural log of the
    denominator. Rows that saw no key (l_i == 0) give out 0 and lse -inf."""
    empty_row = l_i == 0.0
    out = acc / tl.where(empty_row, 1.0, l_i)[:, None]
    lse = tl.where(empty_row, float("-inf"), (m_i + tl.math.log2(l_i)) * LN2)
    return out, lse


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


@triton.jit
def visible_key_range(start_m, seqlen_q, seqlen_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr):
    """Key ranges of the query tile [start_m, start_m + BLOCK_M): (full_stop, stop).

    Keys [0, full_stop) are visible to every row of the tile (no mask needed; full_stop
    is a multiple of BLOCK_N); keys [full_stop, stop) need the mask; keys from stop on
    are visible to no row. Causal is aligned bottom-right: row i sees key j iff
    j <= i + seqlen_k - seqlen_q.
    """
    diagonal = seqlen_k - seqlen_q
    if CAUSAL:
        # Keys past the last row's diagonal are invisible to the whole tile.
        stop = tl.minimum(tl.maximum(start_m + BLOCK_M + diagonal, 0), seqlen_k)
        # Keys up to the first row's diagonal are visible to every row.
        full_stop = tl.minimum(tl.maximum(start_m + 1 + diagonal, 0), stop)
    else:
        stop = seqlen_k
        full_stop = seqlen_k
    return (full_stop // BLOCK_N) * BLOCK_N, stop
