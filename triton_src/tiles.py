"""Where a sequence lies in a (packed) batch, and the loops over the tiles of a visible range
(triton_src/masks.py's four bounds).
"""

import triton
import triton.language as tl


@triton.jit
def sequence_span(CuSeqlens, Seqused, batch, seqlen, use_cu_seqlens, use_seqused):
    """(start, length) of sequence `batch` along the sequence dim. Dense layout: (0, seqlen).
    Packed (varlen, use_cu_seqlens != 0): rows [CuSeqlens[b], CuSeqlens[b + 1]). With
    use_seqused != 0 the length is Seqused[b] (the first rows of the span). Nothing is read
    that is not used."""
    packed = use_cu_seqlens != 0
    start = tl.load(CuSeqlens + batch, mask=packed, other=0)
    end = tl.load(CuSeqlens + batch + 1, mask=packed, other=0)
    length = tl.where(packed, end - start, seqlen)
    used = tl.load(Seqused + batch, mask=use_seqused != 0, other=0)
    return start, tl.where(use_seqused != 0, used, length)


@triton.jit
def tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    """(start, stop) of a loop over tiles of a visible range (visible_key_range's or
    visible_query_range's four bounds): the fully visible [full_lo, full_hi), or, MASKED, both
    edges [lo, full_lo) and [full_hi, hi) in one loop, whose index tile_at maps onto the left
    edge first and then jumps to the right. One masked loop body instead of two halves the code
    the masks compile into (the build time of every variant)."""
    if MASKED:
        start = lo
        stop = lo + tl.maximum(full_lo - lo, 0) + tl.cdiv(tl.maximum(hi - full_hi, 0), BLOCK) * BLOCK
    else:
        start = full_lo
        stop = full_hi
    return start, stop


@triton.jit
def tile_at(index, full_lo, full_hi, MASKED: tl.constexpr):
    """The first row or key of the tile that loop index `index` visits (see tile_loop_bounds)."""
    if MASKED:
        index = tl.where(index < full_lo, index, index - full_lo + full_hi)
    return index
