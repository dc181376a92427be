"""FlashAttention-2 backward kernels.

Three launches, none with atomics, so every mode is bitwise reproducible:

1. attn_bwd_preprocess: delta = rowsum(dout * out) - dlse, fp32 [batch, heads, seqlen_q].
   A gradient flowing into the returned lse only shifts delta (d lse_i / d s_ij = p_ij).
2. attn_bwd_dkdv: one program per (key tile, kv head, batch). It walks the query tiles of
   every q head of its GQA group, recomputes P from the saved lse, and accumulates
   dV = P^T dO and dK = dS^T Q in fp32 registers: GQA sums need no atomics and no expanded K/V.
3. attn_bwd_dq: one program per (query tile, head, batch); walks the visible key tiles and
   accumulates dQ = dS K.

With S = scale * Q K^T and P = softmax(S): dP = dO V^T, dS = P * (dP - delta),
dQ = scale * dS K, dK = scale * dS^T Q. Scores use the log2 domain as in the forward
(qk_scale = scale * log2(e)); the natural-log lse is converted once per tile. Masks,
window ranges, softcap, ALiBi, the bias and the dropout mask are the forward's
(triton_src/masks.py, score_mods.py, dropout.py); the softcap multiplies dS by its derivative 1 - tanh^2 before the
products with Q and K. With dropout (keep mask Z, kept with probability 1 - p):
dV = (P * Z)^T dO / (1 - p), dP = (dO V^T) * Z / (1 - p), and delta uses the dropped out.
The bias's gradient is dS itself (dkdv writes it; the op sums broadcast dims).
"""

import triton
import triton.language as tl

from .arguments import ALIBI, BIAS, DROPOUT, SCORES, SEGMENTS, SEQUENCES, SHAPE, WINDOW
from .dropout import dropout_keep, dropout_seed
from .masks import (
    key_visible, mask_every_tile, segment_ids, segment_span, visible_key_range, visible_query_range,
)
from .score_mods import alibi_slope_log2, bias_log2, modified_scores
from .softmax import lse_log2
from .spec import KernelSpec, Param, f32, f32_tensor, i32, index_tensor, strides, tensor
from .tiles import sequence_span, tile_at, tile_loop_bounds
from .variants import ALIBI_ONLY, BIAS_DROPOUT, BIAS_TMA, PLAIN

@triton.jit
def attn_bwd_preprocess(
    Out, DO, DLse, Delta,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lseb, stride_lseh, CuSeqlensQ, use_cu_seqlens,
    seqlen_q, head_dim,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    """Grid (cdiv(seqlen_q, BLOCK_M), heads, batch). DLse/Delta: fp32 in the forward's lse layout."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < seqlen_q)[:, None]
    if PAD_D:
        mask = mask & (offs_d < head_dim)[None, :]
    rows = (q_start + offs_m)[:, None].to(tl.int64)
    o = tl.load(Out + batch * stride_ob + head * stride_oh + rows * stride_os + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + rows * stride_dos + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    row_ptr = batch * stride_lseb + head * stride_lseh + q_start + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLse + row_ptr, mask=offs_m < seqlen_q, other=0.0)
    tl.store(Delta + row_ptr, delta, mask=offs_m < seqlen_q)


@triton.jit
def _load_rows(base, rows, stride_s, offs_d, n_rows, head_dim, PAD_D: tl.constexpr):
    """A [len(rows), BLOCK_D] tile; rows past n_rows and padded dims read as 0."""
    mask = (rows < n_rows)[:, None]
    if PAD_D:
        mask = mask & (offs_d < head_dim)[None, :]
    return tl.load(base + rows[:, None].to(tl.int64) * stride_s + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _store_rows(base, tile, rows, stride_s, offs_d, n_rows, head_dim, PAD_D: tl.constexpr):
    mask = (rows < n_rows)[:, None]
    if PAD_D:
        mask = mask & (offs_d < head_dim)[None, :]
    tl.store(base + rows[:, None].to(tl.int64) * stride_s + offs_d[None, :], tile.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _dkdv_query_tiles(
    dk, dv, k, v, q_base, do_base, Lse, Delta, row_base,
    stride_qs, stride_dos, offs_n, offs_d,
    lo, full_lo, full_hi, hi, seqlen_q, seqlen_k, head_dim, diagonal, window_left, window_right,
    qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg_base, kv_seg, use_segments,
    bias_base, stride_biasq, use_bias, dbias_base, stride_dbiasq, write_dbias,
    seed, batch, head, start_n, dropout_threshold, dropout_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr, MASKED: tl.constexpr,
    SCORE_MOD: tl.constexpr,
):
    """Adds query rows of one head to this key tile's dK, dV (transposed math: the key tile is
    the M side of every product): the rows that see the whole tile, [full_lo, full_hi), or,
    MASKED, the two edges [lo, full_lo) and [full_hi, hi) in one loop. kv_seg: the tile's
    keys' segment ids. BIAS_DROPOUT tiles apply the forward's dropout mask (every tile) and, masked
    (a bias masks every tile), add the bias and write dS as d bias (write_dbias != 0). Dropout: dV
    takes the kept probabilities, dP is kept and rescaled the same way, dS = P * (dP - delta)."""
    offs_m = tl.arange(0, BLOCK_M)
    start, stop = tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK_M, MASKED)
    for tile in range(start, stop, BLOCK_M):
        start_m = tile_at(tile, full_lo, full_hi, MASKED)
        rows = start_m + offs_m
        q = _load_rows(q_base, rows, stride_qs, offs_d, seqlen_q, head_dim, PAD_D)
        do = _load_rows(do_base, rows, stride_dos, offs_d, seqlen_q, head_dim, PAD_D)
        lse = lse_log2(Lse + row_base, rows, seqlen_q)
        delta = tl.load(Delta + row_base + rows, mask=rows < seqlen_q, other=0.0)
        qk_t = tl.dot(k, tl.trans(q)) * qk_scale            # [BLOCK_N, BLOCK_M]
        if SCORE_MOD != PLAIN:
            qk_t, dcap_t = modified_scores(qk_t, rows[None, :], offs_n[:, None],
                                           diagonal, softcap_log2, alibi_log2, alibi_offset)
        if MASKED:
            if SCORE_MOD == BIAS_DROPOUT:
                if use_bias != 0:
                    qk_t += bias_log2(bias_base, stride_biasq, rows[None, :], offs_n[:, None], seqlen_q, seqlen_k)
        p_t = tl.math.exp2(qk_t - lse[None, :])
        if MASKED:
            visible = key_visible(rows[None, :], offs_n[:, None], seqlen_k, diagonal, window_left, window_right)
            q_seg = segment_ids(q_seg_base, rows, seqlen_q, use_segments)
            visible = visible & (kv_seg[:, None] == q_seg[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dp_t = tl.dot(v, tl.trans(do))
        p_kept_t = p_t
        if SCORE_MOD == BIAS_DROPOUT:
            if dropout_threshold > 0:
                keep_t = dropout_keep(seed, batch, head, start_m, start_n, dropout_threshold, BLOCK_M, BLOCK_N, True)
                p_kept_t = tl.where(keep_t, p_t * dropout_scale, 0.0)
                dp_t = tl.where(keep_t, dp_t * dropout_scale, 0.0)
        dv += tl.dot(p_kept_t.to(do.dtype), do)
        ds_t = p_t * (dp_t - delta[None, :])
        if MASKED:
            if SCORE_MOD == BIAS_DROPOUT:
                if write_dbias != 0:
                    tl.store(dbias_base + rows[None, :].to(tl.int64) * stride_dbiasq + offs_n[:, None],
                             ds_t.to(dbias_base.dtype.element_ty),
                             mask=(rows < seqlen_q)[None, :] & (offs_n < seqlen_k)[:, None])
        if SCORE_MOD != PLAIN:
            ds_t *= dcap_t
        dk += tl.dot(ds_t.to(q.dtype), q)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(
    Q, K, V, DO, Lse, Delta, DK, DV,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lseb, stride_lseh, CuSeqlensQ, CuSeqlensK, SequsedK, use_cu_seqlens, use_seqused_k,
    seqlen_q, seqlen_k, kv_group_size, head_dim, window_left, window_right,
    Alibi, stride_alibib, stride_alibih, use_alibi, alibi_offset,
    QSegmentIds, KvSegmentIds, stride_qsegb, stride_kvsegb, use_segments, SegmentSpans, stride_spanb,
    qk_scale, softcap_log2, softmax_scale,
    Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold, dropout_scale,
    DBias, stride_dbiasb, stride_dbiash, stride_dbiasq, write_dbias,
    DQAccum, stride_dqab, stride_dqas, stride_dqah,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SCORE_MOD: tl.constexpr, PAD_D: tl.constexpr, ACCUMULATE_DQ: tl.constexpr,
    HOST_MAPS: tl.constexpr = False,
):
    """Grid (cdiv(seqlen_k, BLOCK_N), kv_heads, batch). Bias and dropout as in attn_fwd; with
    write_dbias != 0, dS (the bias's gradient, unreduced) goes to DBias, float32 [batch, heads,
    seqlen_q, seqlen_k] (keys contiguous), which the op zero-fills: pairs no query tile visits stay 0.
    Segment ids as in attn_fwd, with SegmentSpans per key tile of BLOCK_N (the queries it needs).

    ACCUMULATE_DQ is the contract's deterministic=False form: the kernel also adds each tile
    pair's dQ (softmax_scale * dS K) into DQAccum, float32 laid out like Q and zeroed by the op,
    which then launches no attn_bwd_dq; the order of the additions varies between runs.
    SCORE_MOD (triton_src/variants.py): ALIBI_ONLY is SOFTCAP_ALIBI for ALiBi without a softcap
    (softcap_log2 0), whose code leaves the softcap out; BIAS_TMA is BIAS_DROPOUT without a softcap
    for a bias whose rows TMA can read (attn_fwd says when) and, with write_dbias, seqlen_k a multiple of 4 (DBias's rows then
    16-byte multiples too). Only the Hopper implementation (backward_sm90.py) has these:
    configs.json builds no such variant of this kernel. HOST_MAPS, the Hopper implementation's
    alone (here always false): Q, K, V and dO come as TMA maps the host made over the dense
    [batch, seqlen, heads, head_dim] tensors (their strides then unused), not as pointers."""
    tl.static_assert(not HOST_MAPS, "attn_bwd_dkdv takes its tensors as pointers")
    tl.static_assert(not ACCUMULATE_DQ, "attn_bwd_dkdv has no dQ accumulation (configs.json builds none)")
    tl.static_assert(SCORE_MOD != ALIBI_ONLY and SCORE_MOD != BIAS_TMA,
                     "attn_bwd_dkdv has no ALiBi-only or TMA-bias variant (configs.json builds none)")
    pid_n = tl.program_id(0)
    kv_head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    Q += q_start.to(tl.int64) * stride_qs
    DO += q_start.to(tl.int64) * stride_dos
    K += k_start.to(tl.int64) * stride_ks
    V += k_start.to(tl.int64) * stride_vs
    DK += k_start.to(tl.int64) * stride_dks
    DV += k_start.to(tl.int64) * stride_dvs
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_rows(K + batch * stride_kb + kv_head.to(tl.int64) * stride_kh, offs_n, stride_ks, offs_d,
                   seqlen_k, head_dim, PAD_D)
    v = _load_rows(V + batch * stride_vb + kv_head.to(tl.int64) * stride_vh, offs_n, stride_vs, offs_d,
                   seqlen_k, head_dim, PAD_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    diagonal = seqlen_k - seqlen_q
    lo, full_lo, full_hi, hi = visible_query_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                                   BLOCK_M, BLOCK_N)
    seed = dropout_seed(DropoutSeed, dropout_threshold, SCORE_MOD)
    lo, full_lo, full_hi, hi = segment_span(SegmentSpans + batch * stride_spanb, start_n, seqlen_k, lo, full_lo,
                                            full_hi, hi, use_segments, BLOCK_N, BLOCK_M)
    full_lo, full_hi = mask_every_tile(full_lo, full_hi, hi, BLOCK_M, use_bias)
    kv_seg = segment_ids(KvSegmentIds + batch * stride_kvsegb, offs_n, seqlen_k, use_segments)
    q_seg_base = QSegmentIds + batch * stride_qsegb
    for g in range(0, kv_group_size):
        head = (kv_head * kv_group_size + g).to(tl.int64)
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = batch * stride_lseb + head * stride_lseh + q_start
        alibi_log2 = alibi_slope_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi)
        bias_base = Bias + batch * stride_biasb + head * stride_biash
        dbias_base = DBias + batch * stride_dbiasb + head * stride_dbiash
        # The rows that see the whole tile without a mask (masked 0), then the window's two edges
        # with it.
        for masked in tl.static_range(2):
            dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, Lse, Delta, row_base, stride_qs, stride_dos,
                                       offs_n, offs_d, lo, full_lo, full_hi, hi, seqlen_q, seqlen_k, head_dim,
                                       diagonal, window_left, window_right, qk_scale, softcap_log2, alibi_log2,
                                       alibi_offset, q_seg_base, kv_seg, use_segments, bias_base, stride_biasq,
                                       use_bias, dbias_base, stride_dbiasq, write_dbias, seed, batch, head, start_n,
                                       dropout_threshold, dropout_scale, BLOCK_M, BLOCK_N, PAD_D, masked == 1,
                                       SCORE_MOD)

    dk *= softmax_scale
    _store_rows(DK + batch * stride_dkb + kv_head.to(tl.int64) * stride_dkh, dk, offs_n, stride_dks, offs_d,
                seqlen_k, head_dim, PAD_D)
    _store_rows(DV + batch * stride_dvb + kv_head.to(tl.int64) * stride_dvh, dv, offs_n, stride_dvs, offs_d,
                seqlen_k, head_dim, PAD_D)


@triton.jit
def _dq_key_tiles(
    dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_vs,
    start_m, offs_m, offs_d, lo, full_lo, full_hi, hi, seqlen_k, head_dim, diagonal, window_left, window_right,
    qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
    seqlen_q, bias_base, stride_biasq, use_bias, seed, batch, head, dropout_threshold, dropout_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr, MASKED: tl.constexpr,
    SCORE_MOD: tl.constexpr,
):
    """Adds key tiles to this query tile's dQ: the fully visible [full_lo, full_hi), or,
    MASKED, the two edges [lo, full_lo) and [full_hi, hi) in one loop (with the bias and the
    dropout mask, as _dkdv_query_tiles)."""
    offs_n = tl.arange(0, BLOCK_N)
    start, stop = tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK_N, MASKED)
    for tile in range(start, stop, BLOCK_N):
        start_n = tile_at(tile, full_lo, full_hi, MASKED)
        cols = start_n + offs_n
        k = _load_rows(k_base, cols, stride_ks, offs_d, seqlen_k, head_dim, PAD_D)
        v = _load_rows(v_base, cols, stride_vs, offs_d, seqlen_k, head_dim, PAD_D)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        if SCORE_MOD != PLAIN:
            qk, dcap = modified_scores(qk, offs_m[:, None], cols[None, :],
                                       diagonal, softcap_log2, alibi_log2, alibi_offset)
        if MASKED:
            if SCORE_MOD == BIAS_DROPOUT:
                if use_bias != 0:
                    qk += bias_log2(bias_base, stride_biasq, offs_m[:, None], cols[None, :], seqlen_q, seqlen_k)
        p = tl.math.exp2(qk - lse[:, None])
        if MASKED:
            visible = key_visible(offs_m[:, None], cols[None, :], seqlen_k, diagonal, window_left, window_right)
            kv_seg = segment_ids(kv_seg_base, cols, seqlen_k, use_segments)
            visible = visible & (q_seg[:, None] == kv_seg[None, :])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        if SCORE_MOD == BIAS_DROPOUT:
            if dropout_threshold > 0:
                keep = dropout_keep(seed, batch, head, start_m, start_n, dropout_threshold, BLOCK_M, BLOCK_N, False)
                dp = tl.where(keep, dp * dropout_scale, 0.0)
        ds = p * (dp - delta[:, None])
        if SCORE_MOD != PLAIN:
            ds *= dcap
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def attn_bwd_dq(
    Q, K, V, DO, Lse, Delta, DQ,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lseb, stride_lseh, CuSeqlensQ, CuSeqlensK, SequsedK, use_cu_seqlens, use_seqused_k,
    seqlen_q, seqlen_k, kv_group_size, head_dim, window_left, window_right,
    Alibi, stride_alibib, stride_alibih, use_alibi, alibi_offset,
    QSegmentIds, KvSegmentIds, stride_qsegb, stride_kvsegb, use_segments, SegmentSpans, stride_spanb,
    qk_scale, softcap_log2, softmax_scale,
    Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold, dropout_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SCORE_MOD: tl.constexpr, PAD_D: tl.constexpr,
    HOST_MAPS: tl.constexpr = False,
):
    """Grid (cdiv(seqlen_q, BLOCK_M), heads, batch). Bias, dropout and segment ids (SegmentSpans
    per query tile of BLOCK_M) as in attn_fwd. ALIBI_ONLY (ALiBi without a softcap, its code left
    out) and BIAS_TMA (attn_bwd_dkdv's: a bias read by TMA) exist in the Hopper implementation
    (backward_dq_sm90.py) alone, as does HOST_MAPS (here always false): Q, K, V, dO and dQ as TMA
    maps the host made over the dense tensors."""
    tl.static_assert(not HOST_MAPS, "attn_bwd_dq takes its tensors as pointers")
    tl.static_assert(SCORE_MOD != ALIBI_ONLY and SCORE_MOD != BIAS_TMA,
                     "attn_bwd_dq has no ALiBi-only or TMA-bias variant (configs.json builds none)")
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    kv_head = (head // kv_group_size).to(tl.int64)
    head = head.to(tl.int64)
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    Q += q_start.to(tl.int64) * stride_qs
    DO += q_start.to(tl.int64) * stride_dos
    DQ += q_start.to(tl.int64) * stride_dqs
    K += k_start.to(tl.int64) * stride_ks
    V += k_start.to(tl.int64) * stride_vs
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_rows(Q + batch * stride_qb + head * stride_qh, offs_m, stride_qs, offs_d, seqlen_q, head_dim, PAD_D)
    do = _load_rows(DO + batch * stride_dob + head * stride_doh, offs_m, stride_dos, offs_d, seqlen_q, head_dim,
                    PAD_D)
    row_base = batch * stride_lseb + head * stride_lseh + q_start
    lse = lse_log2(Lse + row_base, offs_m, seqlen_q)
    delta = tl.load(Delta + row_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

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
    bias_base = Bias + batch * stride_biasb + head * stride_biash
    # The fully visible key tiles without a mask (masked 0), then the window's two edges with it.
    for masked in tl.static_range(2):
        dq = _dq_key_tiles(dq, q, do, lse, delta, k_base, v_base, stride_ks, stride_vs, pid_m * BLOCK_M, offs_m,
                           offs_d, lo, full_lo, full_hi, hi, seqlen_k, head_dim, diagonal, window_left, window_right,
                           qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
                           seqlen_q, bias_base, stride_biasq, use_bias, seed, batch, head, dropout_threshold,
                           dropout_scale, BLOCK_M, BLOCK_N, PAD_D, masked == 1, SCORE_MOD)
    dq *= softmax_scale
    _store_rows(DQ + batch * stride_dqb + head * stride_dqh, dq, offs_m, stride_dqs, offs_d, seqlen_q, head_dim, PAD_D)


# What both backward passes take after their tensors, as the forward took it; softmax_scale
# (the scale alone, for the gradients' chain rule) is theirs.
_SHARED = [SEQUENCES, SHAPE, WINDOW, ALIBI, SEGMENTS, SCORES, f32("softmax_scale"), BIAS, DROPOUT]

ATTN_BWD_PREPROCESS = KernelSpec(attn_bwd_preprocess, [
    tensor("Out"), tensor("DO"), f32_tensor("DLse"), f32_tensor("Delta"), *strides("o"), *strides("do"),
    *strides("lse", "bh", aligned=False), index_tensor("CuSeqlensQ"), i32("use_cu_seqlens"),
    i32("seqlen_q"), i32("head_dim", multiple_of=8),
])
# Q, K, V and dO may be maps (HOST_MAPS): boxes of the Hopper kernels' tiles, a query tile of
# one head (BLOCK_M rows) and a consumer's half of the key tile (BLOCK_N / 2 keys).
ATTN_BWD_DKDV = KernelSpec(attn_bwd_dkdv, [
    tensor("Q", map_rows="BLOCK_M"), tensor("K", map_rows="BLOCK_N/2"), tensor("V", map_rows="BLOCK_N/2"),
    tensor("DO", map_rows="BLOCK_M"), f32_tensor("Lse"), f32_tensor("Delta"),
    tensor("DK"), tensor("DV"),
    *strides("q"), *strides("k"), *strides("v"), *strides("do"), *strides("dk"), *strides("dv"),
    *strides("lse", "bh", aligned=False), *_SHARED,
    Param("DBias", "*fp32"), *strides("dbias", "bhq", aligned=False), i32("write_dbias"),
    f32_tensor("DQAccum"), *strides("dqa"),
])
# Q, dO and dQ may be maps of a consumer's half of the query tile (BLOCK_M / 2 rows), K and V of
# the key tile (BLOCK_N keys).
ATTN_BWD_DQ = KernelSpec(attn_bwd_dq, [
    tensor("Q", map_rows="BLOCK_M/2"), tensor("K", map_rows="BLOCK_N"), tensor("V", map_rows="BLOCK_N"),
    tensor("DO", map_rows="BLOCK_M/2"), f32_tensor("Lse"), f32_tensor("Delta"), tensor("DQ", map_rows="BLOCK_M/2"),
    *strides("q"), *strides("k"), *strides("v"), *strides("do"), *strides("dq"), *strides("lse", "bh", aligned=False),
    *_SHARED,
])
