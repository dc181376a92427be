"""Which keys each query sees: the window mask (causal is its right edge at the diagonal), the
visible key and query ranges of a tile and which of their tiles need the mask, and segment ids.
"""

import triton
import triton.language as tl


@triton.jit
def _window(q_idx, seqlen_k, diagonal, window_left, window_right):
    """The window of query q_idx alone, lo <= key <= hi, a negative side being unbounded (lo 0,
    hi seqlen_k - 1); hi may pass the last key."""
    lo = tl.where(window_left >= 0, q_idx + diagonal - window_left, 0)
    hi = tl.where(window_right >= 0, q_idx + diagonal + window_right, seqlen_k - 1)
    return lo, hi


@triton.jit
def key_bounds(q_idx, seqlen_k, diagonal, window_left, window_right):
    """(lo, hi): the keys query q_idx sees, lo <= key <= hi: its window, and no key past the last
    (hi <= seqlen_k - 1). lo may exceed hi (no key)."""
    lo, hi = _window(q_idx, seqlen_k, diagonal, window_left, window_right)
    return lo, tl.minimum(hi, seqlen_k - 1)


@triton.jit
def key_visible(q_idx, k_idx, seqlen_k, diagonal, window_left, window_right):
    """The attention mask, for broadcastable query/key index tensors: key k_idx < seqlen_k is
    visible to query q_idx iff q_idx + diagonal - window_left <= k_idx <= q_idx + diagonal +
    window_right, a negative side being unbounded. diagonal = seqlen_k - seqlen_q aligns the
    window to the bottom-right corner; causal is window_right = 0. The same keys as key_bounds';
    the end of the keys is a third compare per score rather than a clamp per row, which the
    generic dK/dV kernel's registers take better (docs/notes/tuning.md T38)."""
    lo, hi = _window(q_idx, seqlen_k, diagonal, window_left, window_right)
    return (k_idx >= lo) & (k_idx <= hi) & (k_idx < seqlen_k)


@triton.jit
def visible_key_range(start_m, seqlen_q, seqlen_k, window_left, window_right,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key ranges of the query tile [start_m, start_m + BLOCK_M): (lo, full_lo, full_hi, hi).

    Keys [full_lo, full_hi) are visible to every row of the tile (no mask needed); the
    keys [lo, full_lo) and [full_hi, hi) need the mask; keys outside [lo, hi) are visible
    to no row. lo, full_lo and full_hi are multiples of BLOCK_N, lo <= full_lo <= full_hi
    <= max(hi, full_lo). Windows as in key_visible.
    """
    diagonal = seqlen_k - seqlen_q
    last_m = start_m + BLOCK_M - 1
    hi = seqlen_k
    lo = seqlen_k * 0
    full_lo = lo
    full_hi = seqlen_k
    if window_right >= 0:
        # Keys past the last row's right edge are invisible to the whole tile; keys up to
        # the first row's edge are visible to every row (on that side).
        hi = tl.minimum(tl.maximum(last_m + diagonal + window_right + 1, 0), seqlen_k)
        full_hi = tl.minimum(tl.maximum(start_m + diagonal + window_right + 1, 0), seqlen_k)
    if window_left >= 0:
        lo = tl.minimum(tl.maximum(start_m + diagonal - window_left, 0), hi)
        full_lo = tl.maximum(last_m + diagonal - window_left, 0)
    # A tile past its sequence's last query (varlen: the grid covers the longest) visits nothing.
    hi = tl.where(start_m < seqlen_q, hi, 0)
    lo = tl.minimum(lo, hi) // BLOCK_N * BLOCK_N
    full_lo = tl.minimum(tl.cdiv(full_lo, BLOCK_N) * BLOCK_N, tl.cdiv(hi, BLOCK_N) * BLOCK_N)
    full_hi = tl.maximum(tl.minimum((full_hi // BLOCK_N) * BLOCK_N, hi), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def visible_query_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query ranges of the key tile [start_n, start_n + BLOCK_N): (lo, full_lo, full_hi, hi),
    the transpose of visible_key_range: rows [full_lo, full_hi) see every key of the tile,
    rows [lo, full_lo) and [full_hi, hi) some, rows outside [lo, hi) none. lo, full_lo and
    full_hi are multiples of BLOCK_M; rows past seqlen_q may be visited (their lse reads as
    +inf, so they add nothing)."""
    diagonal = seqlen_k - seqlen_q
    last_n = start_n + BLOCK_N - 1
    lo = seqlen_q * 0
    full_lo = lo
    hi = seqlen_q
    full_hi = tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M  # rows past seqlen_q add nothing
    if window_right >= 0:  # row i sees key j only if j <= i + diagonal + window_right
        lo = tl.maximum(start_n - diagonal - window_right, 0)
        full_lo = tl.maximum(last_n - diagonal - window_right, 0)
    if window_left >= 0:  # row i sees key j only if j >= i + diagonal - window_left
        hi = tl.minimum(tl.maximum(last_n - diagonal + window_left + 1, 0), seqlen_q)
        full_hi = tl.maximum(start_n - diagonal + window_left + 1, 0) // BLOCK_M * BLOCK_M
    hi = tl.where(start_n < seqlen_k, hi, 0)  # a key tile past its sequence's keys visits nothing
    lo = tl.minimum(lo, hi) // BLOCK_M * BLOCK_M
    full_lo = tl.minimum(tl.cdiv(full_lo, BLOCK_M) * BLOCK_M, tl.cdiv(hi, BLOCK_M) * BLOCK_M)
    full_hi = tl.maximum(tl.minimum(full_hi, tl.cdiv(hi, BLOCK_M) * BLOCK_M), full_lo)
    return lo, full_lo, full_hi, hi


@triton.jit
def segment_ids(base, idx, n, use_segments):
    """Segment ids at base[idx] for idx < n; 0 elsewhere, and everywhere when use_segments is 0
    (nothing is read, and equal ids hide nothing)."""
    return tl.load(base + idx, mask=(idx < n) & (use_segments != 0), other=0)


@triton.jit
def segment_span(span_base, start, seqlen, lo, full_lo, full_hi, hi, use_segments, BLOCK: tl.constexpr,
                 OTHER_BLOCK: tl.constexpr):
    """The visible range of the other side (visible_key_range's or visible_query_range's four
    bounds, multiples of OTHER_BLOCK) under segment ids, from what segments.segment_spans wrote
    for the tile at `start` (tiles of BLOCK rows of a sequence of seqlen): positions outside its
    span are skipped, the tiles inside its run (the other side's positions that share the
    tile's one id) stay unmasked, and every other tile takes the segment mask. Unchanged when
    use_segments is 0 (nothing is read)."""
    if use_segments != 0:
        inside = start < seqlen
        span = span_base + 4 * (start // BLOCK)
        first = tl.load(span, mask=inside, other=0)
        stop = tl.load(span + 1, mask=inside, other=0)
        run_first = tl.load(span + 2, mask=inside, other=0)
        run_stop = tl.load(span + 3, mask=inside, other=0)
        lo = tl.maximum(lo, first // OTHER_BLOCK * OTHER_BLOCK)
        hi = tl.maximum(tl.minimum(hi, stop), lo)
        # The run lies inside the span; its whole tiles inside the unmasked range stay unmasked.
        run_lo = tl.maximum(full_lo, tl.cdiv(run_first, OTHER_BLOCK) * OTHER_BLOCK)
        run_hi = tl.minimum(full_hi, run_stop // OTHER_BLOCK * OTHER_BLOCK)
        end = tl.cdiv(hi, OTHER_BLOCK) * OTHER_BLOCK
        full_lo = tl.where(run_hi > run_lo, run_lo, end)
        full_hi = tl.where(run_hi > run_lo, run_hi, end)
    return lo, full_lo, full_hi, hi


@triton.jit
def mask_every_tile(full_lo, full_hi, hi, BLOCK: tl.constexpr, every_tile):
    """An empty unmasked range when every_tile != 0, so that the masked loop covers the whole
    visible range: a bias (any score may be -inf, so any row of any tile may be empty). Returns
    (full_lo, full_hi)."""
    end = tl.cdiv(hi, BLOCK) * BLOCK
    return tl.where(every_tile != 0, end, full_lo), tl.where(every_tile != 0, end, full_hi)
