"""@triton.jit helpers shared by the kernel families."""

import triton
import triton.language as tl


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
