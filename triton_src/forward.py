"""FlashAttention-2 forward kernel.

One program computes one BLOCK_M tile of query rows for one (batch, query head).
It streams the key/value rows of the matching KV head in BLOCK_N tiles, keeping a
running row maximum `m_i`, a running row sum `l_i` and an unnormalised fp32
accumulator; the division by `l_i` happens once, in the epilogue.

Scores live in the log2 domain: the host folds log2(e) into the softmax scale, so
the kernel uses exp2 (one MUFU instruction) instead of exp.

Layout is [batch, seqlen, heads, head_dim] with arbitrary batch/seq/head strides
and a contiguous head_dim, or packed (varlen) [total, heads, head_dim] with sequence b at
rows [cu_seqlens[b], cu_seqlens[b + 1]) (batch stride 0; the grid covers the longest
sequence and tiles past a shorter one's end do nothing). Strides are int64 so tensors past
2**31 elements work.

Masking (causal, sliding window) is split in two loops, as in the Triton tutorial
but with a window on both sides: key tiles that are entirely visible to every row of
the query tile run without any mask, and only the tiles at the window's two edges and
at the end of the keys (one loop that jumps from the left edge to the right) pay for it. Tiles outside the window are never visited, so time
grows with the window, not the sequence.

The score-modifier variants (SCORE_MOD, named in triton_src/variants.py) add the softcap
(softcap * tanh(s / softcap)) and the ALiBi bias (-slope * |i + seqlen_k - seqlen_q + alibi_offset - j|)
to every tile (softcap_alibi); bias_dropout also takes an additive bias and dropout, whose code
softcap_alibi leaves out (it costs registers even when unused). All are runtime values inside, so
one variant serves any mix.
"""

import triton
import triton.language as tl

from .arguments import ALIBI, BIAS, DROPOUT, FP8_INPUTS, SCORES, SEGMENTS, SEQUENCES, SHAPE, SINKS, WINDOW
from .dropout import dropout_keep, dropout_seed
from .fp8 import descale_at, fp8_pointer, fp8_probabilities
from .masks import key_visible, mask_every_tile, segment_ids, segment_span, visible_key_range
from .score_mods import alibi_slope_log2, bias_log2, modified_scores
from .softmax import initial_softmax_state, softmax_finish, softmax_step
from .spec import KernelSpec, f32_tensor, strides, tensor
from .tiles import sequence_span, tile_at, tile_loop_bounds
from .variants import ALIBI_ONLY, BIAS_DROPOUT, BIAS_TMA, PLAIN, SOFTCAP_ALIBI


@triton.jit
def _attend_key_tiles(
    acc, l_i, m_i, q,
    k_tile_ptrs, v_tile_ptrs, stride_ks, stride_vs,
    start_m, offs_m, offs_n, offs_d,
    lo, full_lo, full_hi, hi, seqlen_k, head_dim, diagonal, window_left, window_right,
    qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
    seqlen_q, bias_base, stride_biasq, use_bias, seed, batch, head, dropout_threshold, p_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr, MASKED: tl.constexpr,
    SCORE_MOD: tl.constexpr,
):
    """Folds key tiles into the running softmax state: the fully visible [full_lo, full_hi),
    or, MASKED, the two edges [lo, full_lo) and [full_hi, hi) in one loop.

    `k_tile_ptrs`/`v_tile_ptrs` are the tile's pointers at key row 0. MASKED tiles apply
    key_visible (window, causal, end of the keys) and the segment ids (q_seg per row against
    the keys' ids at kv_seg_base); the others are visible to every row. SOFTCAP_ALIBI adds the
    softcap and ALiBi to every tile; BIAS_DROPOUT also zeroes the dropped probabilities of every
    tile in what reaches V (the row sums keep them: dropout acts after the softmax) and adds a
    bias, which makes every tile masked (mask_every_tile): loaded in the unmasked loop, the bias
    tile made ptxas serialize the wgmma pipeline.

    FP8 K and V (the kernel's FP8 flag) take the probabilities to V in e4m3, times p_scale
    (fp8_probabilities); the row sums keep them in fp32. FP8 V^T is zero past each sequence's
    end up to a whole tile (fp8_transpose_v), so its loads mask the head dim alone: a mask along
    its contiguous keys would load it byte by byte.
    """
    d_in_range = offs_d < head_dim
    start, stop = tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK_N, MASKED)
    for tile in range(start, stop, BLOCK_N):
        start_n = tile_at(tile, full_lo, full_hi, MASKED)
        cols = start_n + offs_n
        k_ptrs = k_tile_ptrs + tl.cast(start_n, tl.int64) * stride_ks
        if v_tile_ptrs.dtype.element_ty.is_fp8():
            # V^T's keys are contiguous (stride_vs is 1), and tiles start at multiples of BLOCK_N
            # (visible_key_range; FP8 takes no segment ids): say so, or its loads go byte by byte.
            v_ptrs = v_tile_ptrs + tl.multiple_of(tl.cast(start_n, tl.int64), 16)
        else:
            v_ptrs = v_tile_ptrs + tl.cast(start_n, tl.int64) * stride_vs
        if MASKED:
            k_mask = (cols[None, :] < seqlen_k) & d_in_range[:, None]
            v_mask = (cols[:, None] < seqlen_k) & d_in_range[None, :]
            k = tl.load(k_ptrs, mask=k_mask, other=0.0)
        elif PAD_D:
            k = tl.load(k_ptrs, mask=d_in_range[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)

        qk = tl.dot(q, k) * qk_scale
        if SCORE_MOD != PLAIN:
            qk, _ = modified_scores(qk, offs_m[:, None], cols[None, :],
                                    diagonal, softcap_log2, alibi_log2, alibi_offset)
        if MASKED:
            if SCORE_MOD == BIAS_DROPOUT:
                if use_bias != 0:
                    qk += bias_log2(bias_base, stride_biasq, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k)
            visible = key_visible(offs_m[:, None], cols[None, :], seqlen_k, diagonal, window_left, window_right)
            kv_seg = segment_ids(kv_seg_base, cols, seqlen_k, use_segments)
            visible = visible & (q_seg[:, None] == kv_seg[None, :])
            qk = tl.where(visible, qk, float("-inf"))
        p, m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, MASKED)
        if SCORE_MOD == BIAS_DROPOUT:
            if dropout_threshold > 0:
                keep = dropout_keep(seed, batch, head, start_m, start_n, dropout_threshold, BLOCK_M, BLOCK_N, False)
                p = tl.where(keep, p, 0.0)

        if MASKED and not v_tile_ptrs.dtype.element_ty.is_fp8():
            v = tl.load(v_ptrs, mask=v_mask, other=0.0)
        elif PAD_D:
            v = tl.load(v_ptrs, mask=d_in_range[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
        if v.dtype.is_fp8():
            acc = tl.dot(fp8_probabilities(p, p_scale), v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def attn_fwd(
    Q, K, V, Out, Lse,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lseb, stride_lseh,
    CuSeqlensQ, CuSeqlensK, SequsedK, use_cu_seqlens, use_seqused_k,
    seqlen_q, seqlen_k, kv_group_size, head_dim, window_left, window_right,
    Alibi, stride_alibib, stride_alibih, use_alibi, alibi_offset,
    QSegmentIds, KvSegmentIds, stride_qsegb, stride_kvsegb, use_segments, SegmentSpans, stride_spanb,
    qk_scale, softcap_log2, Sinks, use_sinks,
    Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold, dropout_scale,
    QDescale, KDescale, VDescale, stride_qdescaleb, stride_qdescaleh, stride_kdescaleb, stride_kdescaleh,
    stride_vdescaleb, stride_vdescaleh, q_descale_group, p_scale, stride_vd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SCORE_MOD: tl.constexpr, PAD_D: tl.constexpr, TILE_LOOP: tl.constexpr, FP8: tl.constexpr,
    HOST_MAPS: tl.constexpr = False,
):
    """Grid: (cdiv(seqlen_q, BLOCK_M), heads, batch): one program per query tile. TILE_LOOP
    (programs that loop over query tiles, for a shorter first axis) is the Hopper
    implementation's; here it is always false.

    Lse is float32, natural log, at Lse + batch * stride_lseb + head * stride_lseh + row
    ([batch, heads, seqlen_q], or [heads, total_q] packed). kv_group_size = q heads per kv
    head (GQA). seqlen_q/k are the dense lengths; packed sequences take theirs from
    sequence_span (CuSeqlensQ/K, SequsedK). window_left/right: -1 unbounded, causal is window_right = 0.
    qk_scale is softmax_scale * log2(e), or softmax_scale / softcap with a softcap, whose
    softcap_log2 = softcap * log2(e) (0 without). ALiBi slopes (float32, natural-log units)
    are read at Alibi + batch * stride_alibib + head * stride_alibih when use_alibi != 0;
    alibi_offset shifts the query positions in ALiBi's distance alone (the masks keep
    diagonal = seqlen_k - seqlen_q), so that a piece of a longer sequence (a ring attention
    step) sees the distances of its global positions.
    With use_segments != 0 (dense layout only), query i of sequence b sees key j only if
    QSegmentIds[b, i] == KvSegmentIds[b, j] (int32, rows contiguous): SegmentSpans + b *
    stride_spanb holds segments.segment_spans' output per query tile of BLOCK_M rows, which
    masks.segment_span turns into the keys visited and the tiles left unmasked.
    With use_sinks != 0, Sinks holds one float32 logit per query head that joins every row's
    denominator (initial_softmax_state).
    SCORE_MOD (triton_src/variants.py): ALIBI_ONLY is SOFTCAP_ALIBI for ALiBi without a softcap
    (softcap_log2 0), whose code leaves the softcap out: the Hopper implementation's alone (configs.json).
    BIAS_DROPOUT variants also take a bias (use_bias != 0; dense layout only; every tile masked):
    Bias + batch * stride_biasb + head * stride_biash + row * stride_biasq + key, in q's dtype,
    added to the scores (natural-log units); and dropout (dropout_threshold > 0): keys are dropped per
    dropout_keep with the int64 seed at DropoutSeed, and out is scaled by dropout_scale =
    1 / keep probability. BIAS_TMA is BIAS_DROPOUT for a bias whose rows TMA can read: a nonzero
    stride_biasq and every stride a multiple of 16 bytes from a 16-byte aligned Bias (the op asks
    for it first where the build has it): the Hopper implementation's alone.
    FP8 1 or 2: Q, K and V hold float8 (e4m3fn, e5m2; triton_src/fp8.py) values that stand for
    themselves times QDescale[batch, head // q_descale_group], KDescale[batch, kv_head] and
    VDescale[batch, kv_head] (float32, any strides); both products run on FP8 tensor cores, the
    probabilities scaled by p_scale for the second. Out is the variant's 16-bit dtype. V is then
    fp8_transpose_v's V^T (triton_src/fp8.py: key j of sequence b, dim d at V + batch * stride_vb
    + kv_head * stride_vh + d * stride_vd + j; stride_vs unused): the second product's FP8 operand
    must be K-major in shared memory, and built from rows of V that tile was written one byte at a
    time, unpipelined (3.6x slower at d128 on the H100). With FP8 0 none of these are read.
    HOST_MAPS (the Hopper implementation's alone; here always false): Q, K, V and Out come as TMA
    maps the host made over the dense [batch, seqlen, heads, head_dim] tensors (their strides are
    then unused), not as pointers.
    """
    tl.static_assert(not TILE_LOOP, "attn_fwd runs one query tile per program")
    tl.static_assert(not HOST_MAPS, "attn_fwd takes its tensors as pointers")
    tl.static_assert(SCORE_MOD != ALIBI_ONLY and SCORE_MOD != BIAS_TMA,
                     "attn_fwd has no ALiBi-only or TMA-bias variant (configs.json builds none)")
    tl.static_assert(FP8 == 0 or SCORE_MOD == PLAIN or SCORE_MOD == SOFTCAP_ALIBI,
                     "FP8 inputs take no bias or dropout")
    Q = fp8_pointer(Q, FP8)
    K = fp8_pointer(K, FP8)
    V = fp8_pointer(V, FP8)
    num_m_tiles = tl.num_programs(0)
    # With a right edge, later query tiles are heavier: run them first, so the short ones
    # fill the tail.
    pid_m = tl.where(window_right >= 0, num_m_tiles - 1 - tl.program_id(0), tl.program_id(0))
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    kv_head = head // kv_group_size
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    if FP8:
        # V^T's rows hold stride_vd keys (max_seqlen_k's tiles): a sequence longer than the caller
        # promised reads no further (16-bit V is read where it lies).
        seqlen_k = tl.minimum(seqlen_k, stride_vd.to(tl.int32))

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_in_range = offs_m < seqlen_q
    d_in_range = offs_d < head_dim

    q_base = Q + batch * stride_qb + q_start.to(tl.int64) * stride_qs + head.to(tl.int64) * stride_qh
    k_base = K + batch * stride_kb + k_start.to(tl.int64) * stride_ks + kv_head.to(tl.int64) * stride_kh
    v_base = V + batch * stride_vb + k_start.to(tl.int64) * stride_vs + kv_head.to(tl.int64) * stride_vh

    q_ptrs = q_base + offs_m[:, None].to(tl.int64) * stride_qs + offs_d[None, :]
    if PAD_D:
        q = tl.load(q_ptrs, mask=row_in_range[:, None] & d_in_range[None, :], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=row_in_range[:, None], other=0.0)

    # K is read transposed ([BLOCK_D, BLOCK_N]) so that q @ k needs no permute.
    k_tile_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_ks + offs_d[:, None]
    if FP8:
        # V^T from fp8_transpose_v: each sequence's keys start a row (no k_start), keys contiguous.
        v_base = V + batch * stride_vb + kv_head.to(tl.int64) * stride_vh
        v_tile_ptrs = v_base + offs_n[:, None] + offs_d[None, :].to(tl.int64) * stride_vd
        v_key_stride = 1
    else:
        v_tile_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vs + offs_d[None, :]
        v_key_stride = stride_vs

    m_i, l_i = initial_softmax_state(Sinks, head, use_sinks, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if FP8:
        # The descales of q and k scale every score: fold them into the scale.
        qk_scale *= (descale_at(QDescale, batch, head // q_descale_group, stride_qdescaleb, stride_qdescaleh)
                     * descale_at(KDescale, batch, kv_head, stride_kdescaleb, stride_kdescaleh))
    diagonal = seqlen_k - seqlen_q
    alibi_log2 = alibi_slope_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi)
    lo, full_lo, full_hi, hi = visible_key_range(pid_m * BLOCK_M, seqlen_q, seqlen_k, window_left, window_right,
                                                 BLOCK_M, BLOCK_N)
    seed = dropout_seed(DropoutSeed, dropout_threshold, SCORE_MOD)
    lo, full_lo, full_hi, hi = segment_span(SegmentSpans + batch * stride_spanb, pid_m * BLOCK_M, seqlen_q, lo,
                                            full_lo, full_hi, hi, use_segments, BLOCK_M, BLOCK_N)
    full_lo, full_hi = mask_every_tile(full_lo, full_hi, hi, BLOCK_N, use_bias)
    q_seg = segment_ids(QSegmentIds + batch * stride_qsegb, offs_m, seqlen_q, use_segments)
    kv_seg_base = KvSegmentIds + batch * stride_kvsegb
    bias_base = Bias + batch * stride_biasb + head.to(tl.int64) * stride_biash
    # The fully visible middle without a mask (masked 0), then the window's two edges (and the
    # end of the keys) with it.
    for masked in tl.static_range(2):
        acc, l_i, m_i = _attend_key_tiles(
            acc, l_i, m_i, q, k_tile_ptrs, v_tile_ptrs, stride_ks, v_key_stride, pid_m * BLOCK_M, offs_m, offs_n,
            offs_d, lo, full_lo, full_hi, hi, seqlen_k, head_dim, diagonal, window_left, window_right, qk_scale,
            softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments, seqlen_q, bias_base,
            stride_biasq, use_bias, seed, batch, head, dropout_threshold, p_scale, BLOCK_M, BLOCK_N, PAD_D,
            masked == 1, SCORE_MOD)
    if SCORE_MOD == BIAS_DROPOUT:
        acc *= dropout_scale  # 1 without dropout
    if FP8:
        acc *= descale_at(VDescale, batch, kv_head, stride_vdescaleb, stride_vdescaleh) / p_scale

    # Rows that saw no key (outside every window, or causal with seqlen_q > seqlen_k) give
    # out 0 and lse -inf.
    out, lse = softmax_finish(acc, l_i, m_i)

    o_ptrs = (Out + batch * stride_ob + head.to(tl.int64) * stride_oh
              + (q_start + offs_m)[:, None].to(tl.int64) * stride_os + offs_d[None, :])
    if PAD_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_in_range[:, None] & d_in_range[None, :])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_in_range[:, None])
    lse_ptrs = Lse + batch * stride_lseb + head.to(tl.int64) * stride_lseh + q_start + offs_m
    tl.store(lse_ptrs, lse, mask=row_in_range)


# Q, K, V and Out may be maps (HOST_MAPS): boxes of the Hopper kernel's tiles, 64 query rows per
# consumer warpgroup and BLOCK_N keys.
ATTN_FWD = KernelSpec(attn_fwd, [
    tensor("Q", map_rows=64), tensor("K", map_rows="BLOCK_N"), tensor("V", map_rows="BLOCK_N"),
    tensor("Out", map_rows=64), f32_tensor("Lse"),
    *strides("q"), *strides("k"), *strides("v"), *strides("o"), *strides("lse", "bh", aligned=False),
    SEQUENCES, SHAPE, WINDOW, ALIBI, SEGMENTS, SCORES, SINKS, BIAS, DROPOUT, FP8_INPUTS,
])
