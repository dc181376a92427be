"""@triton.jit pieces shared by the kernel families: the online softmax, its end-of-loop
normalisation, the lse merge, the causal key range, and the constants they use.

Scores live in the log2 domain everywhere (the host folds log2(e) into the scale and the
kernels use exp2, one MUFU instruction); lse leaves the kernels as a natural log.
"""

import os

import triton
import triton.language as tl

# Set when Triton's interpreter runs the kernels (CPU, numpy), which cannot execute inline PTX.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")
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
def key_visible(q_idx, k_idx, seqlen_k, diagonal, window_left, window_right):
    """The attention mask, for broadcastable query/key index tensors: key k_idx < seqlen_k is
    visible to query q_idx iff q_idx + diagonal - window_left <= k_idx <= q_idx + diagonal +
    window_right, a negative side being unbounded. diagonal = seqlen_k - seqlen_q aligns the
    window to the bottom-right corner; causal is window_right = 0."""
    lo = tl.where(window_left >= 0, q_idx + diagonal - window_left, 0)
    hi = tl.where(window_right >= 0, q_idx + diagonal + window_right, seqlen_k - 1)
    return (k_idx >= lo) & (k_idx <= hi) & (k_idx < seqlen_k)


@triton.jit
def lse_log2(lse_base, rows, seqlen_q):
    """The backward's lse, read at lse_base + rows, in the log2 domain; rows that saw no key (-inf)
    or lie past the end get +inf, so that exp2(s - lse) is 0 for them instead of inf or NaN."""
    lse = tl.load(lse_base + rows, mask=rows < seqlen_q, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse * LOG2E


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


@triton.jit
def bias_log2(bias_base, stride_biasq, rows, cols, seqlen_q, seqlen_k):
    """The additive bias of the scores at (rows, cols), broadcastable index tensors, in the log2
    domain; 0 outside the sequence. bias_base points at the (batch, head)'s [seqlen_q, seqlen_k]
    matrix, keys contiguous, stride_biasq 0 for a bias broadcast over the queries. -inf hides a
    key (a boolean mask's False)."""
    ptrs = bias_base + rows.to(tl.int64) * stride_biasq + cols
    bias = tl.load(ptrs, mask=(rows < seqlen_q) & (cols < seqlen_k), other=0.0)
    return bias.to(tl.float32) * LOG2E


@triton.jit
def _call_grid_to_tile_view(w, KEYS_FIRST: tl.constexpr):
    """dropout_keep's call grid [KG, 4, RG, 8] (KEYS_FIRST) or [RG, 8, KG, 4] with size-1 dims
    where the 7-d tile view has a, b and s."""
    if KEYS_FIRST:
        return w[:, None, :, None, :, None, :]
    else:
        return w[:, None, :, :, None, :, None]


@triton.jit
def dropout_keep(seed, batch, head, row0, key0, threshold,
                 BLOCK_ROWS: tl.constexpr, BLOCK_KEYS: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """The dropout keep-mask of query rows row0 + arange(BLOCK_ROWS) and keys key0 +
    arange(BLOCK_KEYS) (row0, key0 and both sizes multiples of 16, rows and keys counted from
    the sequence's start): bool [BLOCK_ROWS, BLOCK_KEYS], or [BLOCK_KEYS, BLOCK_ROWS] when
    KEYS_FIRST (the dK/dV kernel's transposed tiles).

    One Philox-4x32-10 call (Triton's tl.philox, keyed by the 64-bit `seed`) gives eight 16-bit
    draws to the 2 x 4 block of rows {i, i + 8} x keys {k, k + 1, k + 8, k + 9} (i % 16 < 8,
    k % 16 < 8, k even), at counter (key group (k // 16) * 4 + (k % 8) // 2, row group
    (i // 16) * 8 + i % 8, head, batch); row i + 8a and key k + 8b + s take half s (low 16 bits
    for s = 0) of word 2a + b. A key is kept when its draw >= threshold = round(dropout_p * 2**16).

    Why this block: it is what one thread holds of a tensor-core accumulator tile (rows r and
    r + 8, key pairs 8j + 2t + {0, 1}), so each call is made once, by the thread that uses all
    of its draws; the compiler lays the call grid out as a slice of that accumulator. The mask
    depends on the coordinates only, never on the tiling, so the backward and
    csrc/attention/dropout.cpp (the CPU implementation) regenerate it exactly."""
    RG: tl.constexpr = BLOCK_ROWS // 16
    KG: tl.constexpr = BLOCK_KEYS // 16
    # The call grid, one entry per Philox call: (row group, i % 8) x (key group, (k % 8) // 2).
    if KEYS_FIRST:
        key_group = (key0 // 16 + tl.arange(0, KG))[:, None, None, None] * 4 + tl.arange(0, 4)[None, :, None, None]
        row_group = (row0 // 16 + tl.arange(0, RG))[None, None, :, None] * 8 + tl.arange(0, 8)[None, None, None, :]
    else:
        row_group = (row0 // 16 + tl.arange(0, RG))[:, None, None, None] * 8 + tl.arange(0, 8)[None, :, None, None]
        key_group = (key0 // 16 + tl.arange(0, KG))[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    zero = row_group * 0 + key_group * 0
    c0 = (zero + key_group).to(tl.uint32, bitcast=True)
    c1 = (zero + row_group).to(tl.uint32, bitcast=True)
    c2 = (zero + head).to(tl.uint32)
    c3 = (zero + batch).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    # Spread each call over its 8 elements: a = (i // 8) % 2, b = (k // 8) % 2, s = k % 2, in a
    # 7-d view of the tile whose reshape is the tile itself.
    w0 = _call_grid_to_tile_view(w0, KEYS_FIRST)
    w1 = _call_grid_to_tile_view(w1, KEYS_FIRST)
    w2 = _call_grid_to_tile_view(w2, KEYS_FIRST)
    w3 = _call_grid_to_tile_view(w3, KEYS_FIRST)
    two = tl.arange(0, 2)
    if KEYS_FIRST:  # [KG, b, 4, s, RG, a, 8]
        a = two[None, None, None, None, None, :, None]
        b = two[None, :, None, None, None, None, None]
        s = two[None, None, None, :, None, None, None]
    else:  # [RG, a, 8, KG, b, 4, s]
        a = two[None, :, None, None, None, None, None]
        b = two[None, None, None, None, :, None, None]
        s = two[None, None, None, None, None, None, :]
    word = tl.where(a == 0, tl.where(b == 0, w0, w1), tl.where(b == 0, w2, w3))
    draws = (word >> (s * 16).to(tl.uint32)) & 0xFFFF
    keep = draws >= threshold.to(tl.uint32)
    if KEYS_FIRST:
        return tl.reshape(keep, [BLOCK_KEYS, BLOCK_ROWS])
    else:
        return tl.reshape(keep, [BLOCK_ROWS, BLOCK_KEYS])


@triton.jit
def softcap_tanh(x):
    """tanh(x), for the softcap.

    On the GPU one tanh.approx.f32 (sm_75+; relative error about 2**-11, below bf16's and
    at fp16's rounding of a score): the softmax already spends one MUFU op per score on
    exp2, and 1 - 2 / (exp(2x) + 1) would add two more (ex2, rcp), which made the softcap
    MUFU-bound. Triton's interpreter cannot run PTX, so there the formula stands in for it.
    """
    if INTERPRETED:
        return 1.0 - 2.0 / (tl.math.exp2(x * (2 * LOG2E)) + 1.0)
    else:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def alibi_slope_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi):
    """The head's ALiBi slope in the log2 domain; 0 when use_alibi is 0 (nothing is read)."""
    ptr = Alibi + batch.to(tl.int64) * stride_alibib + head.to(tl.int64) * stride_alibih
    return tl.load(ptr, mask=use_alibi != 0, other=0.0) * LOG2E


@triton.jit
def modified_scores(qk, q_idx, k_idx, diagonal, softcap_log2, alibi_log2, alibi_offset):
    """(scores, dscores/dqk) after the softcap and the ALiBi bias, in the log2 domain.

    With softcap_log2 = softcap * log2(e) > 0, `qk` is q.k * scale / softcap and the score is
    softcap * tanh(qk); otherwise `qk` is already the score. ALiBi subtracts
    slope * |q_idx + diagonal + alibi_offset - k_idx| (alibi_log2 = slope * log2(e); 0 adds
    nothing; alibi_offset moves ALiBi's distances apart from the masks' diagonal). The
    second value is the softcap's derivative factor (1 - tanh^2), which the backward applies
    to dS; 1 without a softcap.
    """
    if softcap_log2 > 0:
        t = softcap_tanh(qk)
        scores = softcap_log2 * t
        dscores = 1.0 - t * t
    else:
        scores = qk
        dscores = qk * 0.0 + 1.0
    # Unconditional: a runtime branch around it (skipping it for a softcap alone) measured 5 %
    # faster with the softcap alone but 12 % slower with ALiBi, forward and backward.
    return alibi_scores(scores, q_idx, k_idx, diagonal, alibi_log2, alibi_offset), dscores


@triton.jit
def alibi_scores(scores, q_idx, k_idx, diagonal, alibi_log2, alibi_offset):
    """The log2-domain scores minus ALiBi's slope * |q_idx + diagonal + alibi_offset - k_idx|
    (modified_scores' second step; alone, for kernels built for ALiBi without a softcap)."""
    # The offset goes on the key side: on the query side it kept a second copy of the query
    # positions live through the loops (more spills in 9-11 of 20 sm_90 variants; docs/notes/ring.md R6).
    # Positions become floats before they meet: one conversion per row and per key of the tile
    # instead of one per score (integer-to-float conversions run at a quarter of the FMA rate),
    # and the distance is one FADD whose absolute value is free. Exact below 2**24 positions.
    q_pos = (q_idx + diagonal).to(tl.float32)
    k_pos = (k_idx - alibi_offset).to(tl.float32)
    return scores - alibi_log2 * tl.abs(q_pos - k_pos)


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
