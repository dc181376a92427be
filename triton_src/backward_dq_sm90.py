"""The Hopper (sm_90) dQ kernel, in Gluon: attn_bwd_dq's contract (backward.py: the same arguments,
grid and results) with forward_sm90.py's structure turned to the gradient. Per query tile of
BLOCK_M = 128 rows, two consumer warpgroups own 64 rows each and, per visited key tile:
S = Q K^T and dP = dO V^T, P = exp2(S - lse), dS = P (dP - delta), dQ += dS K, with dS in
registers as the last product's A operand.

- a producer warp loads both halves of the Q and dO tiles, then every visited K and V tile by TMA
  into a ring of STAGES slots (mbarriers for "ready" and, two consumer arrivals each, "empty");
- ping-pong: the consumers take turns (the `turn` mbarriers) issuing their three products of an
  iteration, S(j), dP(j) and dQ += dS(j-1) K(j-1), so that one warpgroup's elementwise work runs
  while the other's products use the tensor cores; each consumer waits for S(j) and dP(j) only
  and computes dS(j) while dS(j-1) K(j-1) still runs. K(j) is held until that product, V(j)
  released as soon as dP(j) is done.

Tiles are visited as in attn_bwd_dq: the fully visible ones first without a mask, then the
window's edges and the end of the keys (forward_sm90._key_tiles). Supported (SCORE_MOD,
triton_src/variants.py): plain and softcap_alibi, windows and causal, GQA, varlen, segment ids;
configs.json keeps bias_dropout (any bias, dropout alone) on attn_bwd_dq. alibi_only, ALiBi
without a softcap, and bias_tma, a bias that TMA can read (bias_sm90.py) with dropout and ALiBi
and no softcap, are this kernel's alone (attn_bwd_dq's contract). The op guarantees what TMA needs, as for the forward.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from .backward import ATTN_BWD_DQ
from .bias_sm90 import add_bias, bias_tma_args, invalidate_bias_slots, load_bias
from .dropout_sm90 import dropout_keep
from .forward_sm90 import _invalidate_ring, _key_tiles, _key_value_ring, _load_key_tile, _tile_start, head_alibi_log2
from .masks import key_visible, segment_ids
from .row_tiles import load_rows, store_rows
from .score_mods import alibi_scores, modified_scores
from .softmax import lse_log2
from .spec import KernelSpec
from .tiles import sequence_span
from .variants import ALIBI_ONLY, BIAS_DROPOUT, BIAS_TMA, PLAIN, SOFTCAP_ALIBI


@gluon.jit
def _load(q_src, do_src, k_src, v_src, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty,
          v_empty, start_m, lo, full_lo, full_hi, n_full, n_tiles, bias_load,
          HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp: both halves of Q and dO (one barrier per half), then each visited
    tile's K and V into the ring, and with BIAS_TMA (bias_load not empty) its bias rows of
    each half (bias_sm90.load_bias). The *_src are row_tiles.py's sources."""
    if n_tiles > 0:
        for half in gl.static_range(2):
            mbarrier.expect(q_ready.index(half), q_src[0].block_type.nbytes + do_src[0].block_type.nbytes)
            load_rows(q_src, start_m + half * HALF_M, q_ready.index(half), q_smem.index(half))
            load_rows(do_src, start_m + half * HALF_M, q_ready.index(half), do_smem.index(half))
    for i in range(n_tiles):
        start_n = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_N)
        _load_key_tile(k_src, v_src, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, i, start_n, STAGES)
        if len(bias_load) > 0:
            load_bias(bias_load, i, start_m, start_n, 2, HALF_M)


@gluon.jit
def _score_gradient(s, dp, j, start_n, rows, offs_n, lse, delta, n_full, seqlen_k, diagonal, window_left,
                    window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base,
                    use_segments, mods, row0, SCORE_MOD: gl.constexpr):
    """dS of key tile j from its S and dP: attn_bwd_dq's _dq_key_tiles between the products.
    BIAS_TMA adds the bias from the warpgroup's slot and drops dP where the forward dropped P
    (mods: the slot and the dropout's arguments; row0, the warpgroup's first row)."""
    cols = start_n + offs_n
    s = s * qk_scale
    if SCORE_MOD != PLAIN:
        # The rows stay put through this kernel's loop, so the offset joins their diagonal once; on
        # the key side it cost a subtraction per column and tile (4-5 % of dQ's time at d128).
        if SCORE_MOD == ALIBI_ONLY or SCORE_MOD == BIAS_TMA:  # none of the softcap's code
            s = alibi_scores(s, rows[:, None], cols[None, :], diagonal + alibi_offset, alibi_log2, 0)
            if SCORE_MOD == BIAS_TMA:
                s = add_bias(s, mods[0], j)
        else:
            s, dcap = modified_scores(s, rows[:, None], cols[None, :], diagonal + alibi_offset, softcap_log2,
                                      alibi_log2, 0)
    p = gl.exp2(s - lse[:, None])
    if j >= n_full:
        # The mask before the segment ids' runtime branch, as in the forward's _scores (mask bits
        # kept live across it are packed into registers and out again).
        p = gl.where(key_visible(rows[:, None], cols[None, :], seqlen_k, diagonal, window_left, window_right), p, 0.0)
        if use_segments != 0:
            kv_seg = segment_ids(kv_seg_base, cols, seqlen_k, use_segments)
            p = gl.where(q_seg[:, None] == kv_seg[None, :], p, 0.0)
    if SCORE_MOD == SOFTCAP_ALIBI:
        p = p * dcap  # the softcap's derivative
    if SCORE_MOD == BIAS_TMA:
        seed, batch, head, threshold, scale = mods[1], mods[2], mods[3], mods[4], mods[5]
        layout: gl.constexpr = dp.type.layout
        if threshold > 0:
            keep = dropout_keep(seed, batch, head, row0, start_n, threshold, layout, dp.shape[0], dp.shape[1], False)
            dp = gl.where(keep, dp * scale, 0.0)
    return p * (dp - delta[:, None])


@gluon.jit
def _gradient(q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, turn, dq_src,
              Lse, Delta, row_base, q_seg_base, kv_seg_base, use_segments, start_m, lo, full_lo, full_hi, n_full,
              n_tiles, seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_log2, alibi_log2,
              alibi_offset, softmax_scale, mods,
              HALF: gl.constexpr, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              STAGES: gl.constexpr, SCORE_MOD: gl.constexpr):
    """One consumer warpgroup: rows [start_m + HALF * HALF_M, + HALF_M) through every visited
    key tile, then its rows of dQ. Iteration j issues S(j), dP(j) and dQ += dS(j-1) K(j-1) in its
    turn, waits for the first two, computes dS(j) while the third runs, then waits for it: no
    wgmma is in flight across the loop's back edge (forward_sm90.py says why)."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    if HALF == 1:
        mbarrier.arrive(turn.index(0), count=1)  # the first warpgroup issues first
    row0 = start_m + HALF * HALF_M
    rows = row0 + gl.arange(0, HALF_M, layout=row_layout)
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    diagonal = seqlen_k - seqlen_q
    q_seg = segment_ids(q_seg_base, rows, seqlen_q, use_segments)
    lse = lse_log2(Lse + row_base, rows, seqlen_q)
    delta = gl.load(Delta + row_base + rows, mask=rows < seqlen_q, other=0.0)
    dq = gl.zeros([HALF_M, BLOCK_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, layout=s_layout)
    q_tile = q_smem.index(HALF)
    do_tile = do_smem.index(HALF)

    if n_tiles > 0:
        mbarrier.wait(q_ready.index(HALF), 0)
        mbarrier.wait(k_ready.index(0), 0)
        s = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(0), 0)
        dp = warpgroup_mma(do_tile, v_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s, dp = warpgroup_mma_wait(0, deps=(s, dp))
        mbarrier.arrive(v_empty.index(0), count=1)
        start_n = _tile_start(0, lo, full_lo, full_hi, n_full, BLOCK_N)
        ds = _score_gradient(s, dp, 0, start_n, rows, offs_n, lse, delta, n_full, seqlen_k, diagonal, window_left,
                             window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base,
                             use_segments, mods, row0, SCORE_MOD)
        ds_op = gl.convert_layout(ds.to(dtype), a_layout)
        turn_phase = 0
        for j in range(1, n_tiles):
            mbarrier.wait(turn.index(HALF), turn_phase)
            stage = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_ready.index(stage), (j // STAGES) & 1)
            s = warpgroup_mma(q_tile, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(stage), (j // STAGES) & 1)
            dp = warpgroup_mma(do_tile, v_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_op, k_smem.index(prev), dq, is_async=True)
            mbarrier.arrive(turn.index(1 - HALF), count=1)
            turn_phase ^= 1

            # dS(j) overlaps dS(j-1) K(j-1): wait for S(j) and dP(j) only (issued first).
            s, dp = warpgroup_mma_wait(1, deps=(s, dp))
            mbarrier.arrive(v_empty.index(stage), count=1)
            start_n = _tile_start(j, lo, full_lo, full_hi, n_full, BLOCK_N)
            ds = _score_gradient(s, dp, j, start_n, rows, offs_n, lse, delta, n_full, seqlen_k, diagonal,
                                 window_left, window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg,
                                 kv_seg_base, use_segments, mods, row0, SCORE_MOD)
            # dS(j-1)'s registers are the running product's operand until it finishes.
            dq = warpgroup_mma_wait(0, deps=(dq, ))
            mbarrier.arrive(k_empty.index(prev), count=1)
            ds_op = gl.convert_layout(ds.to(dtype), a_layout)
        last = (n_tiles - 1) % STAGES
        dq = warpgroup_mma(ds_op, k_smem.index(last), dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        mbarrier.arrive(k_empty.index(last), count=1)

    # dQ through this half's Q buffer (its last product is done) and TMA, which clips rows past
    # the sequence and columns past head_dim. A half past the sequence's end stores nothing.
    if row0 < seqlen_q:
        q_tile.store((dq * softmax_scale).to(dtype))
        fence_async_shared()
        store_rows(dq_src, row0, q_tile)
        tma.store_wait(0)


def _kernel_name(specialization) -> str:
    """The compiled function's name: attn_bwd_dq_sm90_maps for the HOST_MAPS variants (a profile
    tells the forms apart)."""
    return "attn_bwd_dq_sm90_maps" if specialization.constants.get("HOST_MAPS") else "attn_bwd_dq_sm90"


@gluon.jit(repr=_kernel_name)
def attn_bwd_dq_sm90(
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
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
    SCORE_MOD: gl.constexpr, PAD_D: gl.constexpr,
    HOST_MAPS: gl.constexpr = False,
):
    """attn_bwd_dq's contract (see its docstring) for SCORE_MOD PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY and
    BIAS_TMA (a bias read by TMA, dropout, ALiBi). Launched with 4 warps (the first consumer warpgroup); warp_specialize
    adds the second consumer and the producer warp. HOST_MAPS: Q, K, V, dO and dQ are TMA maps the
    host made over the dense tensors (row_tiles.py), so the program makes no descriptor."""
    gl.static_assert(SCORE_MOD != BIAS_DROPOUT, "attn_bwd_dq_sm90 reads a bias by TMA alone (bias_tma)")
    gl.static_assert(not HOST_MAPS or SCORE_MOD != BIAS_TMA, "host-made maps: no bias")
    # K(j-1) is held through iteration j, so a third slot keeps K(j+1) loading; four, because
    # the slot and phase arithmetic then needs no division by three (1.01-1.04x, docs/notes/tuning.md T19).
    STAGES: gl.constexpr = 4
    HALF_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = Q.dtype if HOST_MAPS else Q.dtype.element_ty
    gl.static_assert(HALF_M == 64, "two consumer warpgroups of 64 query rows")

    head = gl.program_id(1)
    batch = gl.program_id(2).to(gl.int64)
    kv_head = head // kv_group_size
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    # With a right edge, later query tiles see more keys: run them first, so the short ones fill
    # the tail (as attn_fwd).
    pid = gl.program_id(0)
    start_m = gl.where(window_right >= 0, gl.num_programs(0) - 1 - pid, pid) * BLOCK_M
    lo, full_lo, full_hi, n_full, n_tiles = _key_tiles(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                       use_segments, SegmentSpans + batch * stride_spanb,
                                                       BLOCK_M, BLOCK_N)

    swizzle: gl.constexpr = 128 if BLOCK_D * 2 >= 128 else BLOCK_D * 2
    tile_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
    # Each tensor's rows as row_tiles.py's sources: the host's maps at this (batch, head), or
    # descriptors made here over this (sequence, head).
    if HOST_MAPS:
        q_src = (Q, batch.to(gl.int32), head)
        do_src = (DO, batch.to(gl.int32), head)
        dq_src = (DQ, batch.to(gl.int32), head)
        k_src = (K, batch.to(gl.int32), kv_head)
        v_src = (V, batch.to(gl.int32), kv_head)
    else:
        q_base = Q + batch * stride_qb + q_start.to(gl.int64) * stride_qs + head.to(gl.int64) * stride_qh
        do_base = DO + batch * stride_dob + q_start.to(gl.int64) * stride_dos + head.to(gl.int64) * stride_doh
        dq_base = DQ + batch * stride_dqb + q_start.to(gl.int64) * stride_dqs + head.to(gl.int64) * stride_dqh
        k_base = K + batch * stride_kb + k_start.to(gl.int64) * stride_ks + kv_head.to(gl.int64) * stride_kh
        v_base = V + batch * stride_vb + k_start.to(gl.int64) * stride_vs + kv_head.to(gl.int64) * stride_vh
        q_src = (tma.make_tensor_descriptor(q_base, [seqlen_q, head_dim], [stride_qs, 1], [HALF_M, BLOCK_D],
                                            tile_layout),)
        do_src = (tma.make_tensor_descriptor(do_base, [seqlen_q, head_dim], [stride_dos, 1], [HALF_M, BLOCK_D],
                                             tile_layout),)
        dq_src = (tma.make_tensor_descriptor(dq_base, [seqlen_q, head_dim], [stride_dqs, 1], [HALF_M, BLOCK_D],
                                             tile_layout),)
        k_src = (tma.make_tensor_descriptor(k_base, [seqlen_k, head_dim], [stride_ks, 1], [BLOCK_N, BLOCK_D],
                                            tile_layout),)
        v_src = (tma.make_tensor_descriptor(v_base, [seqlen_k, head_dim], [stride_vs, 1], [BLOCK_N, BLOCK_D],
                                            tile_layout),)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, BLOCK_D], tile_layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, HALF_M, BLOCK_D], tile_layout)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _key_value_ring(dtype, STAGES, BLOCK_N, BLOCK_D, tile_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(q_ready.index(b), count=1)
        mbarrier.init(turn.index(b), count=1)

    alibi_log2 = head_alibi_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi, qk_scale * 0.0,
                                 SCORE_MOD)
    q_seg_base = QSegmentIds + batch * stride_qsegb
    kv_seg_base = KvSegmentIds + batch * stride_kvsegb
    row_base = batch * stride_lseb + head.to(gl.int64) * stride_lseh + q_start
    # BIAS_TMA's bias (by TMA, bias_sm90.py) and dropout, as in forward_sm90.py: bias_load for
    # the producer, per consumer its slot and the dropout's arguments. Empty tuples otherwise.
    bias_load, mods_0, mods_1 = (), (), ()
    if SCORE_MOD == BIAS_TMA:
        bias_load, mods_0, mods_1, _ = bias_tma_args(
            Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold, dropout_scale,
            batch, head, seqlen_q, seqlen_k, dtype, 2, HALF_M, BLOCK_N)

    gl.warp_specialize([
        (_gradient, (q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, turn, dq_src,
                     Lse, Delta, row_base, q_seg_base, kv_seg_base, use_segments, start_m, lo, full_lo, full_hi,
                     n_full, n_tiles, seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_log2,
                     alibi_log2, alibi_offset, softmax_scale, mods_0, 0, HALF_M, BLOCK_N, BLOCK_D, STAGES,
                     SCORE_MOD)),
        (_gradient, (q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready, k_empty, v_empty, turn, dq_src,
                     Lse, Delta, row_base, q_seg_base, kv_seg_base, use_segments, start_m, lo, full_lo, full_hi,
                     n_full, n_tiles, seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_log2,
                     alibi_log2, alibi_offset, softmax_scale, mods_1, 1, HALF_M, BLOCK_N, BLOCK_D, STAGES,
                     SCORE_MOD)),
        (_load, (q_src, do_src, k_src, v_src, q_smem, do_smem, k_smem, v_smem, q_ready, k_ready, v_ready,
                 k_empty, v_empty, start_m, lo, full_lo, full_hi, n_full, n_tiles, bias_load, HALF_M, BLOCK_N,
                 STAGES)),
    ], [4, 1], [240, 24])

    for b in gl.static_range(2):
        mbarrier.invalidate(q_ready.index(b))
        mbarrier.invalidate(turn.index(b))
    _invalidate_ring(k_ready, v_ready, k_empty, v_empty, STAGES)
    if SCORE_MOD == BIAS_TMA:
        invalidate_bias_slots(bias_load, 2)


# attn_bwd_dq's contract: its parameters (the spec checks the function against them) and constexprs.
ATTN_BWD_DQ_SM90 = KernelSpec(attn_bwd_dq_sm90, ATTN_BWD_DQ.items)
assert ATTN_BWD_DQ_SM90.constexprs == ATTN_BWD_DQ.constexprs, "attn_bwd_dq_sm90 must take attn_bwd_dq's constexprs"
