"""The Hopper (sm_90) dK/dV kernel, in Gluon: attn_bwd_dkdv's contract (backward.py: the same
arguments, grid and results) with forward_sm90.py's structure. Per key tile of BLOCK_N = 128
keys, two consumer warpgroups own 64 keys each; with the keys as the M side of every product
(transposed math, as attn_bwd_dkdv), per visited query tile:
S^T = K Q^T and dP^T = V dO^T, P^T = exp2(S^T - lse), dV += P^T dO, dS^T = P^T (dP^T - delta),
dK += dS^T Q, with P^T and dS^T in registers as the A operands.

- a producer warpgroup (PRODUCER_WARPS says why not one warp) loads the key tile's K and V once,
  then every visited query tile of every head of the GQA group: Q and dO by TMA (one descriptor
  each over [seqlen_q, kv_group_size, head_dim], so GQA walks its heads without rebuilding
  descriptors), and the tile's lse (in the log2 domain, +inf for rows that saw no key or lie past
  the end) and delta, which it loads and stores into shared memory itself, into a ring of STAGES
  slots;
- each consumer issues S^T and dP^T together, computes P^T as soon as S^T is done and issues
  dV's product before it waits for dP^T, then dS^T and dK's product; no wgmma is in flight
  across the loop's back edge (forward_sm90.py says why).

With BLOCK_N = 64, the wide-head form (_accumulate_wide), for where two 64 x BLOCK_D float32
accumulators per warpgroup do not fit its registers with everything else (configs.json: d256,
and d128 with softcap/ALiBi and dQ accumulated): the key tile is 64 keys
shared by both warpgroups, which split the head dim of dK and dV instead. Each computes S and dP
of its 32 keys (queries as M), stores its rows of P^T and dS^T into shared memory, and once both
halves are there (an mbarrier with one arrival per warpgroup, double-buffered) issues
dV += P^T dO and dK += dS^T Q for all 64 keys and its half of the columns.

ACCUMULATE_DQ (deterministic=False, both forms up to d128): dQ is added to a float32 accumulator
by bulk TMA reductions (_reduce_dq). In the two-warpgroup form each warpgroup reduces its own
keys' part, dQ = dS K(its keys), over all the columns (_accumulate_dq), so the warpgroups never
wait for each other; in the wide form they share dS^T through shared memory and each computes
half of the columns over all the tile's keys.

A 96 bucket (two-warpgroup form, no dQ accumulation) runs the head dim in two pieces, 64 + 32
columns, each with its own descriptors, tiles and products (forward_sm90.py's split).

Supported (SCORE_MOD, triton_src/variants.py): plain and softcap_alibi, windows and causal, GQA,
varlen, segment ids; configs.json keeps bias_dropout (any bias, dropout alone) on attn_bwd_dkdv.
alibi_only is ALiBi without a softcap, this kernel's alone: without the softcap's tanh and
derivative tile, the 128-key form's consumers fit their registers at d128 with ALiBi (attn_bwd_dkdv's contract says
so). bias_tma, its own too (the two-warpgroup form without dQ accumulation), is a bias that TMA
can read, with dropout and ALiBi and no softcap: the producer loads each query tile's bias rows
into its Q/dO slot, each consumer adds its keys' rows to S^T, writes dS^T as d bias through a
float32 staging tile and TMA stores, and draws the dropout mask transposed (dropout_sm90.py).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.experimental.gluon.language._core import builtin
from triton._C.libtriton import ir

from .backward import ATTN_BWD_DKDV
from .constants import LOG2E
from .dropout_sm90 import dropout_keep
from .masks import key_visible, segment_ids, segment_span, visible_query_range
from .row_tiles import load_group_rows, load_rows
from .score_mods import alibi_scores, modified_scores
from .softmax import lse_log2
from .spec import KernelSpec
from .tiles import sequence_span, tile_at, tile_loop_bounds
from .variants import ALIBI_ONLY, BIAS_DROPOUT, BIAS_TMA, PLAIN, SOFTCAP_ALIBI

# A warpgroup, though one warp could issue the loads: Triton orders a partition's shared-memory
# stores before its mbarrier arrival (one elected thread) by a named barrier when the partition
# has several warps, by bar.warp.sync when it has one, which compute-sanitizer's racecheck does
# not take for ordering (docs/notes/tuning.md T12). setmaxnreg works per warpgroup, so the kernel has 12 warps
# either way.
PRODUCER_WARPS = gl.constexpr(4)


@gluon.jit
def _query_tiles(start_n, seqlen_q, seqlen_k, window_left, window_right, use_segments, span_base,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """attn_bwd_dkdv's query tiles for the key tile at start_n as one sequence: (lo, full_lo,
    full_hi, n_full, n_tiles). Tile i < n_full starts at row full_lo + i * BLOCK_M and needs no
    mask; the others are the masked edges, [lo, full_lo) then [full_hi, hi) (_tile_start).
    Segment ids as masks.segment_span says, from the key tile's span at span_base."""
    lo, full_lo, full_hi, hi = visible_query_range(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                                   BLOCK_M, BLOCK_N)
    lo, full_lo, full_hi, hi = segment_span(span_base, start_n, seqlen_k, lo, full_lo, full_hi, hi, use_segments,
                                            BLOCK_N, BLOCK_M)
    # A key tile that runs past its sequence's keys holds rows that are not its own (the next
    # sequence's, in a packed batch): each of its query tiles takes the mask, so that P and dS are
    # 0 there and the dQ accumulated from them (ACCUMULATE_DQ) takes nothing from those rows.
    full_hi = gl.where(start_n + BLOCK_N > seqlen_k, full_lo, full_hi)
    start, stop = tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK_M, True)
    n_full = (full_hi - full_lo) // BLOCK_M
    return lo, full_lo, full_hi, n_full, n_full + (stop - start) // BLOCK_M


@gluon.jit
def _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_M: gl.constexpr):
    """First row of the i-th tile of _query_tiles' sequence."""
    return gl.where(i < n_full, full_lo + i * BLOCK_M, tile_at(lo + (i - n_full) * BLOCK_M, full_lo, full_hi, True))


@gluon.jit
def _group_tile(t, g, i, n_tiles, CARRIED: gl.constexpr):
    """Iteration t's (head of the group, query tile), t = g * n_tiles + i. CARRIED: from the
    previous iteration's (g, i), the pair after it, with no division by the runtime n_tiles
    (the loop starts them at (0, -1)); else from t."""
    if CARRIED:
        first = i + 1 == n_tiles
        g = gl.where(first, g + 1, g)
        i = gl.where(first, 0, i + 1)
    else:
        g = t // n_tiles
        i = t - g * n_tiles
    return g, i


@gluon.jit
def _load(k_src, v_src, q_src, do_src, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
          kv_ready, ready, empty, Lse, Delta, row_base, stride_lseh, start_n, seqlen_q, kv_group_size,
          lo, full_lo, full_hi, n_full, n_tiles, k_src1, v_src1, q_src1, do_src1, k_smem1, v_smem1, q_smem1,
          do_smem1, bias_load, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
          CARRIED: gl.constexpr, D1: gl.constexpr):
    """The producer warp: both halves of K and V, then every head's visited Q, dO, lse and delta
    tiles. A slot's `ready` barrier takes two arrivals: the TMA transaction's and this warp's
    after it stored lse and delta; a fresh `empty` barrier passes a wait on parity 1. With D1 > 0
    every tile also has its second head-dim piece (the *1 sources and buffers), loaded on the
    same barriers, and with BIAS_TMA (bias_load not empty, a bias) the tile's bias rows for
    both halves of the keys (_load_bias_rows). The *_src are row_tiles.py's sources; Q's and dO's
    cover the GQA group's heads."""
    row_layout: gl.constexpr = gl.BlockedLayout([1], [32], [PRODUCER_WARPS], [0])
    if n_tiles > 0:
        kv_bytes: gl.constexpr = k_src[0].block_type.nbytes + v_src[0].block_type.nbytes
        if D1 > 0:
            mbarrier.expect(kv_ready, 2 * (kv_bytes + k_src1[0].block_type.nbytes + v_src1[0].block_type.nbytes))
        else:
            mbarrier.expect(kv_ready, 2 * kv_bytes)
        for half in gl.static_range(2):
            load_rows(k_src, start_n + half * HALF_N, kv_ready, k_smem.index(half))
            load_rows(v_src, start_n + half * HALF_N, kv_ready, v_smem.index(half))
            if D1 > 0:
                load_rows(k_src1, start_n + half * HALF_N, kv_ready, k_smem1.index(half))
                load_rows(v_src1, start_n + half * HALF_N, kv_ready, v_smem1.index(half))
    offs_m = gl.arange(0, BLOCK_M, layout=row_layout)
    g = n_tiles * 0
    i = g - 1
    for t in range(n_tiles * kv_group_size):
        g, i = _group_tile(t, g, i, n_tiles, CARRIED)
        stage = t % STAGES
        start_m = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_M)
        rows = start_m + offs_m
        head_base = row_base + g.to(gl.int64) * stride_lseh
        lse = lse_log2(Lse + head_base, rows, seqlen_q)
        delta = gl.load(Delta + head_base + rows, mask=rows < seqlen_q, other=0.0)
        mbarrier.wait(empty.index(stage), ((t // STAGES) & 1) ^ 1)
        QDO_BYTES: gl.constexpr = q_src[0].block_type.nbytes + do_src[0].block_type.nbytes
        QDO1_BYTES: gl.constexpr = q_src1[0].block_type.nbytes + do_src1[0].block_type.nbytes if D1 > 0 else 0
        if len(bias_load) > 0:
            _load_bias_rows(bias_load, ready.index(stage), stage, start_m, g, start_n, QDO_BYTES + QDO1_BYTES)
        else:
            mbarrier.expect(ready.index(stage), QDO_BYTES + QDO1_BYTES)
        if D1 > 0:
            load_group_rows(q_src1, start_m, g, ready.index(stage), q_smem1.index(stage))
            load_group_rows(do_src1, start_m, g, ready.index(stage), do_smem1.index(stage))
        load_group_rows(q_src, start_m, g, ready.index(stage), q_smem.index(stage))
        load_group_rows(do_src, start_m, g, ready.index(stage), do_smem.index(stage))
        lse_smem.index(stage).store(lse)
        delta_smem.index(stage).store(delta)
        mbarrier.arrive(ready.index(stage), count=1)


@gluon.jit
def _load_bias_rows(bias_load, ready, stage, start_m, g, start_n, OTHER_BYTES: gl.constexpr):
    """The `ready` barrier's byte count for a slot (OTHER_BYTES, Q's and dO's, plus the bias's when
    there is one: one expect, as the barrier counts one arrival for it) and the load of the query
    tile's bias rows for the whole key tile, [BLOCK_M, 1, BLOCK_N] of head g of the group (head 0
    of a bias broadcast over the heads), into the slot's bias buffer."""
    desc, smem, use_bias, head_step = bias_load
    if use_bias != 0:
        mbarrier.expect(ready, OTHER_BYTES + desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [start_m, g * head_step, start_n], ready, smem.index(stage))
    else:
        mbarrier.expect(ready, OTHER_BYTES)


@gluon.jit
def _bias_rows_t(s_t, mods, stage, HALF: gl.constexpr, HALF_N: gl.constexpr):
    """The log2-domain scores S^T of this warpgroup's keys plus their bias (the slot's rows of the
    query tile, transposed: keys as rows), or S^T without a bias. mods: _accumulate's."""
    smem, use_bias = mods[0], mods[1]
    if use_bias != 0:
        tile = smem.index(stage)
        tile = tile.reshape([tile.shape[0], tile.shape[2]]).slice(HALF * HALF_N, HALF_N, dim=1).permute((1, 0))
        s_t = s_t + tile.load(s_t.type.layout).to(gl.float32) * LOG2E
    return s_t


@gluon.jit
def _store_dbias_t(ds_t, mods, start_m, g, key0):
    """d bias, dS^T of this warpgroup's keys and the query tile, into DBias (float32, its rows the
    queries) through the warpgroup's staging tile and TMA stores of 32 columns each (a swizzled
    box spans at most 128 bytes of a row), which clip rows and keys past the sequence's ends.
    Nothing unless write_dbias."""
    desc, staging, write_dbias = mods[2], mods[3], mods[4]
    if write_dbias != 0:
        tma.store_wait(0)  # the last tile's stores have read the staging tile
        staging.reshape([staging.shape[0], staging.shape[2]]).permute((1, 0)).store(ds_t)
        fence_async_shared()
        for c in gl.static_range(staging.shape[2] // 32):
            tma.async_copy_shared_to_global(desc, [start_m, g, key0 + c * 32], staging.slice(c * 32, 32, dim=2))


@gluon.jit
def _dropout_t(p_t, mods, start_m, key0, head):
    """(keep, scale) of the dropout on P^T of this warpgroup's keys and the query tile at start_m:
    the forward's mask transposed (dropout_sm90.dropout_keep) and 1 / keep probability; every
    score kept, at scale 1, without dropout."""
    seed, batch, threshold, scale, scratch = mods[5], mods[6], mods[7], mods[8], mods[9]
    layout: gl.constexpr = p_t.type.layout
    if threshold > 0:
        keep_t = dropout_keep(seed, batch, head, start_m, key0, threshold, layout, p_t.shape[1], p_t.shape[0], True,
                              scratch)
    else:
        keep_t = gl.full(p_t.shape, 1, gl.int1, layout)
        scale = scale * 0.0 + 1.0
    return keep_t, scale


@gluon.jit
def _group_alibi_log2(Alibi, alibi_base, stride_alibih, use_alibi, kv_head, kv_group_size, g):
    """The ALiBi slope of head g of the key tile's group in the log2 domain; 0 without ALiBi
    (nothing is read)."""
    alibi_log2 = 0.0
    if use_alibi != 0:
        head = kv_head * kv_group_size + g
        alibi_log2 = gl.load(Alibi + alibi_base + head.to(gl.int64) * stride_alibih) * LOG2E
    return alibi_log2


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Adds the shared-memory tile src into global memory at coord (cp.reduce.async.bulk.tensor
    .add). Triton 3.6's Gluon tma module has no op for it; its IR builder does."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _accumulate_dq(ds_t, dk, dv, q_tile, k_tile, ds_smem, ds_ready, dqa_desc, dq_smem, t, start_m, g, softmax_scale,
                   HALF: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr):
    """dK's product, and this warpgroup's part of the query tile's dQ: dS^T goes to shared memory
    (the A operand of dK's product, and transposed of dQ's), dQ = dS K over this warpgroup's keys,
    and a bulk TMA reduction adds it to the float32 accumulator. Each warpgroup reduces its own
    keys' dQ over all columns, so neither waits for the other (the other reduces the rest of the
    sum). Returns dk, dv with no product in flight."""
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_D, 16])
    slot = HALF * 2 + t % 2
    ds_tile = ds_smem.index(slot)
    ds_tile.store(ds_t)
    fence_async_shared()
    # The arrival orders every warp's stores before any warp's products read the tile.
    mbarrier.arrive(ds_ready.index(slot), count=1)
    mbarrier.wait(ds_ready.index(slot), (t // 2) & 1)
    dk = warpgroup_mma(ds_tile, q_tile, dk, is_async=True)
    zero = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, layout=dq_layout)
    dq = warpgroup_mma(ds_tile.permute((1, 0)), k_tile, zero, use_acc=False, is_async=True)
    dk, dv, dq = warpgroup_mma_wait(0, deps=(dk, dv, dq))
    _reduce_dq(dq * softmax_scale, dqa_desc, dq_smem, start_m, g, 0, BLOCK_M, BLOCK_D)
    return dk, dv


@gluon.jit
def _reduce_dq(dq, dqa_desc, dq_smem, start_m, g, COL0: gl.constexpr, BLOCK_M: gl.constexpr, COLS: gl.constexpr):
    """Adds dq, a query tile's COLS columns from COL0 on, to the float32 accumulator: through this
    warpgroup's staging tile in shared memory, by bulk TMA reductions."""
    tma.store_wait(0)  # the previous tile's reduction has read dq_smem
    dq_smem.reshape([BLOCK_M, COLS]).store(dq)
    fence_async_shared()
    # A swizzled TMA box spans at most 128 bytes of a row: 32 float32 columns per reduction.
    for c in gl.static_range(COLS // 32):
        _tma_reduce_add(dqa_desc, [start_m, g, COL0 + c * 32], dq_smem.slice(c * 32, 32, dim=2))


@gluon.jit
def _accumulate(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, ready, empty,
                DK, DV, stride_dks, stride_dvs, Alibi, alibi_base, stride_alibih,
                use_alibi, alibi_offset, q_seg_base, kv_seg_base, use_segments, kv_group_size, kv_head,
                start_n, seqlen_q, seqlen_k, head_dim, lo, full_lo, full_hi, n_full, n_tiles,
                window_left, window_right, qk_scale, softcap_log2, softmax_scale, ds_smem, ds_ready, dqa_desc, dq_smem,
                k_smem1, v_smem1, q_smem1, do_smem1, mods,
                HALF: gl.constexpr, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
                STAGES: gl.constexpr, SCORE_MOD: gl.constexpr, ACCUMULATE_DQ: gl.constexpr, CARRIED: gl.constexpr,
                D1: gl.constexpr):
    """One consumer warpgroup: keys [start_n + HALF * HALF_N, + HALF_N) of the tile, through every
    visited query tile of every head of the group, then its rows of dK and dV. With ACCUMULATE_DQ
    also its keys' part of each query tile's dQ, over all the columns (_accumulate_dq: the
    ds_smem, ds_ready, dqa_desc and dq_smem arguments; None without it). With D1 > 0 the head
    dim comes in two pieces (BLOCK_D columns, then D1 in the *1 buffers): S^T and dP^T sum both
    pieces' products, dK and dV are two accumulators each. BIAS_TMA (mods: the bias slots,
    use_bias, the d bias descriptor, this warpgroup's staging tile, write_dbias, and the dropout's
    seed, batch, threshold, scale and mask buffer) adds the bias to S^T, writes dS^T as d bias, and drops P^T
    and dP^T where the forward dropped P."""
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_D, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    D1_OR_D: gl.constexpr = D1 if D1 > 0 else BLOCK_D
    o_layout1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, D1_OR_D, 16])
    a_layout1: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout1, k_width=2)
    # Waits that leave the dP^T products in flight: one per piece.
    PIECES: gl.constexpr = 2 if D1 > 0 else 1
    key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    key0 = start_n + HALF * HALF_N
    keys = key0 + gl.arange(0, HALF_N, layout=key_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=row_layout)
    diagonal = seqlen_k - seqlen_q
    kv_seg = segment_ids(kv_seg_base, keys, seqlen_k, use_segments)
    dk = gl.zeros([HALF_N, BLOCK_D], gl.float32, layout=o_layout)
    dv = gl.zeros([HALF_N, BLOCK_D], gl.float32, layout=o_layout)
    dk1 = gl.zeros([HALF_N, D1_OR_D], gl.float32, layout=o_layout1)
    dv1 = gl.zeros([HALF_N, D1_OR_D], gl.float32, layout=o_layout1)
    zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, layout=s_layout)
    k_tile = k_smem.index(HALF)
    v_tile = v_smem.index(HALF)
    k_tile1 = k_smem1.index(HALF)
    v_tile1 = v_smem1.index(HALF)

    if n_tiles > 0:
        mbarrier.wait(kv_ready, 0)
        g = n_tiles * 0
        i = g - 1
        for t in range(n_tiles * kv_group_size):
            g, i = _group_tile(t, g, i, n_tiles, CARRIED)
            stage = t % STAGES
            mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
            q_tile = q_smem.index(stage).reshape([BLOCK_M, BLOCK_D])
            do_tile = do_smem.index(stage).reshape([BLOCK_M, BLOCK_D])
            q_tile1 = q_smem1.index(stage).reshape([BLOCK_M, D1_OR_D])
            do_tile1 = do_smem1.index(stage).reshape([BLOCK_M, D1_OR_D])

            s_t = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
            if D1 > 0:
                s_t = warpgroup_mma(k_tile1, q_tile1.permute((1, 0)), s_t, is_async=True)
            dp_t = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
            if D1 > 0:
                dp_t = warpgroup_mma(v_tile1, do_tile1.permute((1, 0)), dp_t, is_async=True)

            start_m = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_M)
            rows = start_m + offs_m
            lse = lse_smem.index(stage).load(row_layout)
            s_t = warpgroup_mma_wait(PIECES, deps=(s_t, ))
            s_t = s_t * qk_scale
            if SCORE_MOD != PLAIN:
                alibi_log2 = _group_alibi_log2(Alibi, alibi_base, stride_alibih, use_alibi, kv_head, kv_group_size, g)
                if SCORE_MOD == ALIBI_ONLY or SCORE_MOD == BIAS_TMA:  # none of the softcap's code
                    s_t = alibi_scores(s_t, rows[None, :], keys[:, None], diagonal, alibi_log2, alibi_offset)
                    if SCORE_MOD == BIAS_TMA:
                        s_t = _bias_rows_t(s_t, mods, stage, HALF, HALF_N)
                else:
                    s_t, dcap = modified_scores(s_t, rows[None, :], keys[:, None],
                                                diagonal, softcap_log2, alibi_log2, alibi_offset)
            p_t = gl.exp2(s_t - lse[None, :])
            if i >= n_full:
                # The mask before the segment ids' runtime branch, as in the forward's _scores
                # (mask bits kept live across it are packed into registers and out again).
                p_t = gl.where(key_visible(rows[None, :], keys[:, None], seqlen_k, diagonal, window_left, window_right),
                               p_t, 0.0)
                if use_segments != 0:
                    q_seg = segment_ids(q_seg_base, rows, seqlen_q, use_segments)
                    p_t = gl.where(kv_seg[:, None] == q_seg[None, :], p_t, 0.0)
            # dV's product runs while this warpgroup waits for dP^T and computes dS^T.
            if SCORE_MOD == BIAS_TMA:
                # Dropout: dV takes the kept probabilities (rescaled), dP^T is kept the same way.
                keep_t, kept_scale = _dropout_t(p_t, mods, start_m, key0, kv_head * kv_group_size + g)
                p_op = gl.convert_layout(gl.where(keep_t, p_t * kept_scale, 0.0).to(dtype), a_layout)
            else:
                p_op = gl.convert_layout(p_t.to(dtype), a_layout)
            dv = warpgroup_mma(p_op, do_tile, dv, is_async=True)
            if D1 > 0:
                dv1 = warpgroup_mma(gl.convert_layout(p_op, a_layout1), do_tile1, dv1, is_async=True)
            if SCORE_MOD == SOFTCAP_ALIBI:
                p_t = p_t * dcap  # the softcap's derivative, folded in now: one [64, 64] tile fewer live
            delta = delta_smem.index(stage).load(row_layout)
            dp_t = warpgroup_mma_wait(PIECES, deps=(dp_t, ))
            if SCORE_MOD == BIAS_TMA:
                dp_t = gl.where(keep_t, dp_t * kept_scale, 0.0)
            ds_t = p_t * (dp_t - delta[None, :])
            if SCORE_MOD == BIAS_TMA:
                _store_dbias_t(ds_t, mods, start_m, g, key0)
            if ACCUMULATE_DQ:
                dk, dv = _accumulate_dq(ds_t.to(dtype), dk, dv, q_tile, k_tile, ds_smem, ds_ready, dqa_desc, dq_smem,
                                        t, start_m, g, softmax_scale, HALF, BLOCK_M, BLOCK_D)
            elif D1 > 0:
                ds_op = gl.convert_layout(ds_t.to(dtype), a_layout)
                dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
                dk1 = warpgroup_mma(gl.convert_layout(ds_op, a_layout1), q_tile1, dk1, is_async=True)
                dk, dv, dk1, dv1 = warpgroup_mma_wait(0, deps=(dk, dv, dk1, dv1))
            else:
                dk = warpgroup_mma(gl.convert_layout(ds_t.to(dtype), a_layout), q_tile, dk, is_async=True)
                dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
            mbarrier.arrive(empty.index(stage), count=1)
        if ACCUMULATE_DQ or SCORE_MOD == BIAS_TMA:
            # The last reduction or d bias store has read its staging tile before the CTA's shared
            # memory goes.
            tma.store_wait(0)

    _store_rows(DK, DV, stride_dks, stride_dvs, dk * softmax_scale, dv, key0, 0, seqlen_k, head_dim, HALF_N, BLOCK_D)
    if D1 > 0:
        _store_rows(DK, DV, stride_dks, stride_dvs, dk1 * softmax_scale, dv1, key0, BLOCK_D, seqlen_k, head_dim,
                    HALF_N, D1)


@gluon.jit
def _store_rows(DK, DV, stride_dks, stride_dvs, dk, dv, key0, col0, seqlen_k, head_dim, ROWS: gl.constexpr,
                COLS: gl.constexpr):
    """dK and dV of keys [key0, key0 + ROWS), columns [col0, col0 + COLS), within the sequence
    and the head dim."""
    layout: gl.constexpr = dk.type.layout
    keys = key0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    mask = (keys < seqlen_k)[:, None] & (cols < head_dim)[None, :]
    gl.store(DK + keys[:, None].to(gl.int64) * stride_dks + cols[None, :], dk.to(DK.dtype.element_ty), mask=mask)
    gl.store(DV + keys[:, None].to(gl.int64) * stride_dvs + cols[None, :], dv.to(DV.dtype.element_ty), mask=mask)


@gluon.jit
def _accumulate_wide(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, pt_smem, dst_smem, kv_ready, ready,
                     empty, tile_ready, DK, DV, stride_dks, stride_dvs, Alibi, alibi_base, stride_alibih,
                     use_alibi, alibi_offset, q_seg_base, kv_seg_base, use_segments, kv_group_size, kv_head,
                     start_n, seqlen_q, seqlen_k, head_dim, lo, full_lo, full_hi, n_full, n_tiles,
                     window_left, window_right, qk_scale, softcap_log2, softmax_scale, dqa_desc, dq_smem,
                     HALF: gl.constexpr, HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
                     STAGES: gl.constexpr, SCORE_MOD: gl.constexpr, ACCUMULATE_DQ: gl.constexpr,
                     CARRIED: gl.constexpr):
    """One consumer warpgroup of the wide-head kernel: S and dP of all BLOCK_M query rows against
    its half of the 64 keys (queries as M), their P^T and dS^T rows into shared memory; once both
    halves are there, dV and dK of all 64 keys for its half of the head dim, and with
    ACCUMULATE_DQ the query tile's dQ for the same columns (dqa_desc, dq_smem; None without it)."""
    dtype: gl.constexpr = k_smem.dtype
    BLOCK_N: gl.constexpr = 2 * HALF_N
    HALF_D: gl.constexpr = BLOCK_D // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF_D, 16])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    key_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    keys = start_n + HALF * HALF_N + gl.arange(0, HALF_N, layout=key_layout)
    offs_m = gl.arange(0, BLOCK_M, layout=row_layout)
    diagonal = seqlen_k - seqlen_q
    kv_seg = segment_ids(kv_seg_base, keys, seqlen_k, use_segments)
    dk = gl.zeros([BLOCK_N, HALF_D], gl.float32, layout=o_layout)
    dv = gl.zeros([BLOCK_N, HALF_D], gl.float32, layout=o_layout)
    zero = gl.zeros([BLOCK_M, HALF_N], gl.float32, layout=s_layout)
    zero_dq = gl.zeros([BLOCK_M, HALF_D], gl.float32, layout=o_layout)
    k_half = k_smem.index(HALF)
    v_half = v_smem.index(HALF)

    if n_tiles > 0:
        mbarrier.wait(kv_ready, 0)
        g = n_tiles * 0
        i = g - 1
        for t in range(n_tiles * kv_group_size):
            g, i = _group_tile(t, g, i, n_tiles, CARRIED)
            stage = t % STAGES
            buf = t % 2
            mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
            q_tile = q_smem.index(stage).reshape([BLOCK_M, BLOCK_D])
            do_tile = do_smem.index(stage).reshape([BLOCK_M, BLOCK_D])
            s = warpgroup_mma(q_tile, k_half.permute((1, 0)), zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(do_tile, v_half.permute((1, 0)), zero, use_acc=False, is_async=True)

            start_m = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_M)
            rows = start_m + offs_m
            lse = lse_smem.index(stage).load(row_layout)
            s = warpgroup_mma_wait(1, deps=(s, ))
            s = s * qk_scale
            if SCORE_MOD != PLAIN:
                alibi_log2 = _group_alibi_log2(Alibi, alibi_base, stride_alibih, use_alibi, kv_head, kv_group_size, g)
                if SCORE_MOD == ALIBI_ONLY:
                    s = alibi_scores(s, rows[:, None], keys[None, :], diagonal, alibi_log2, alibi_offset)
                else:
                    s, dcap = modified_scores(s, rows[:, None], keys[None, :],
                                              diagonal, softcap_log2, alibi_log2, alibi_offset)
            p = gl.exp2(s - lse[:, None])
            if i >= n_full:
                p = gl.where(key_visible(rows[:, None], keys[None, :], seqlen_k, diagonal, window_left, window_right),
                             p, 0.0)
                if use_segments != 0:
                    q_seg = segment_ids(q_seg_base, rows, seqlen_q, use_segments)
                    p = gl.where(q_seg[:, None] == kv_seg[None, :], p, 0.0)
            pt_smem.index(buf).slice(HALF * HALF_N, HALF_N).store(gl.permute(p.to(dtype), (1, 0)))
            if SCORE_MOD == SOFTCAP_ALIBI:
                p = p * dcap
            delta = delta_smem.index(stage).load(row_layout)
            dp = warpgroup_mma_wait(0, deps=(dp, ))
            ds = p * (dp - delta[:, None])
            dst_smem.index(buf).slice(HALF * HALF_N, HALF_N).store(gl.permute(ds.to(dtype), (1, 0)))
            fence_async_shared()
            # Both halves of P^T and dS^T are needed by both warpgroups' products.
            mbarrier.arrive(tile_ready.index(buf), count=1)
            mbarrier.wait(tile_ready.index(buf), (t // 2) & 1)
            dv = warpgroup_mma(pt_smem.index(buf), do_tile.slice(HALF * HALF_D, HALF_D, dim=1), dv, is_async=True)
            dk = warpgroup_mma(dst_smem.index(buf), q_tile.slice(HALF * HALF_D, HALF_D, dim=1), dk, is_async=True)
            if ACCUMULATE_DQ:
                # dQ[:, cols] = dS K[:, cols] over the 64 keys: each K half holds 32 of them.
                ds_t = dst_smem.index(buf)
                dq = warpgroup_mma(ds_t.slice(0, HALF_N).permute((1, 0)),
                                   k_smem.index(0).slice(HALF * HALF_D, HALF_D, dim=1), zero_dq, use_acc=False,
                                   is_async=True)
                dq = warpgroup_mma(ds_t.slice(HALF_N, HALF_N).permute((1, 0)),
                                   k_smem.index(1).slice(HALF * HALF_D, HALF_D, dim=1), dq, is_async=True)
                dk, dv, dq = warpgroup_mma_wait(0, deps=(dk, dv, dq))
                _reduce_dq(dq * softmax_scale, dqa_desc, dq_smem, start_m, g, HALF * HALF_D, BLOCK_M, HALF_D)
            else:
                dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
            mbarrier.arrive(empty.index(stage), count=1)
        if ACCUMULATE_DQ:
            tma.store_wait(0)  # the last reduction has read dq_smem before the CTA's shared memory goes

    _store_rows(DK, DV, stride_dks, stride_dvs, dk * softmax_scale, dv, start_n, HALF * HALF_D, seqlen_k, head_dim,
                BLOCK_N, HALF_D)


def _kernel_name(specialization) -> str:
    """The compiled function's name: attn_bwd_dkdv_sm90_maps for the HOST_MAPS variants (a
    profile tells the forms apart)."""
    return "attn_bwd_dkdv_sm90_maps" if specialization.constants.get("HOST_MAPS") else "attn_bwd_dkdv_sm90"


@gluon.jit(repr=_kernel_name)
def attn_bwd_dkdv_sm90(
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
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
    SCORE_MOD: gl.constexpr, PAD_D: gl.constexpr, ACCUMULATE_DQ: gl.constexpr,
    HOST_MAPS: gl.constexpr = False,
):
    """attn_bwd_dkdv's contract (see its docstring) for SCORE_MOD PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY and
    BIAS_TMA (a bias read by TMA, d bias, dropout). BLOCK_N 128: two consumer warpgroups of 64 keys (_accumulate, up to
    head dim 128); BLOCK_N 64: the wide-head form, whose warpgroups share the keys and split the
    head dim (_accumulate_wide). ACCUMULATE_DQ (up to
    d128): each warpgroup also adds a part of each query tile's dQ to DQAccum by bulk TMA
    reductions (_reduce_dq): its keys' part over all the columns in the first form, half of the
    columns over all the keys in the wide one. HOST_MAPS (the two-warpgroup form, a power-of-two
    bucket, no bias): Q, K, V and dO are TMA maps the host made over the dense tensors
    (row_tiles.py), so the program makes no descriptor for them. Launched with 4 warps,
    warp_specialize adds the rest."""
    WIDE: gl.constexpr = BLOCK_N == 64
    # Q/dO slots. A slot is free once both warpgroups have read it; with dQ accumulated by
    # _accumulate_dq they never wait for each other, and four slots let one run ahead of the
    # other (three cost more than they gain: the slot and phase arithmetic divides by three).
    # Two elsewhere: without dQ the warpgroups gained nothing from more (measured at d64 and
    # d128, docs/notes/tuning.md T19), the wide form at d256 has no room for more, and at d128 it was not
    # measured with more.
    STAGES: gl.constexpr = 4 if ACCUMULATE_DQ and not WIDE and BLOCK_D <= 64 else 2
    # Each iteration's (head of the group, query tile) carried from the last one instead of
    # divided out of the loop counter: 1.01-1.02x at d128 and d256 without dQ accumulated or a
    # score modification, but 0.95x at d64 16k with dQ (docs/notes/tuning.md T19), and the d256 softcap
    # variant spills 24 bytes more with it: only where measured faster.
    CARRIED: gl.constexpr = BLOCK_D >= 128 and not ACCUMULATE_DQ and SCORE_MOD == PLAIN
    HALF_N: gl.constexpr = BLOCK_N // 2
    dtype: gl.constexpr = Q.dtype if HOST_MAPS else Q.dtype.element_ty
    # A bucket that is not a power of two (96) is two pieces of the head dim, each a power of two
    # as tensor shapes must be: D0 = 64 columns, then D1 = 32, each with its own descriptors and
    # tiles (forward_sm90.py's split), so the products cost 96 columns instead of 128.
    D0: gl.constexpr = BLOCK_D if (BLOCK_D & (BLOCK_D - 1)) == 0 else BLOCK_D * 2 // 3
    D1: gl.constexpr = BLOCK_D - D0
    gl.static_assert((D1 == 0) | (D1 * 2 == D0), "a head-dim bucket is a power of two or 1.5 times one")
    if not WIDE:
        gl.static_assert(HALF_N == 64 and BLOCK_D <= 128, "two consumer warpgroups of 64 keys")
    if ACCUMULATE_DQ:
        gl.static_assert(BLOCK_D >= 64 and BLOCK_D <= 128, "dQ accumulation: 32-column slices of dQ, the staging "
                         "tiles within shared memory")
    if WIDE or ACCUMULATE_DQ:
        gl.static_assert(D1 == 0, "the head dim in two pieces: the two-warpgroup form without dQ accumulation")
    gl.static_assert(SCORE_MOD != BIAS_DROPOUT, "attn_bwd_dkdv_sm90 reads a bias by TMA alone (bias_tma)")
    gl.static_assert(not HOST_MAPS or (not WIDE and D1 == 0 and SCORE_MOD != BIAS_TMA),
                     "host-made maps: the two-warpgroup form, a power-of-two bucket, no bias")
    if SCORE_MOD == BIAS_TMA:
        gl.static_assert(not WIDE and not ACCUMULATE_DQ and BLOCK_M == 64,
                         "a bias in the two-warpgroup form without dQ accumulation, 64-row query tiles")

    pid_n = gl.program_id(0)
    kv_head = gl.program_id(1)
    batch = gl.program_id(2).to(gl.int64)
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)
    start_n = pid_n * BLOCK_N

    swizzle: gl.constexpr = 128 if D0 * 2 >= 128 else D0 * 2
    tile_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=2)
    row3_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=16, rank=3)
    vector_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    first_head = kv_head.to(gl.int64) * kv_group_size
    # The wide form's dQ product reads K by half-width column slices, each of which must start a
    # swizzle pattern: below d128 that takes a narrower swizzle.
    k_swizzle: gl.constexpr = BLOCK_D if ACCUMULATE_DQ and WIDE and BLOCK_D < swizzle else swizzle
    k_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=k_swizzle, element_bitwidth=16, rank=2)
    # Each tensor's rows as row_tiles.py's sources: the host's maps at this batch and KV head (Q's
    # and dO's at the group's first head), or descriptors made here over this sequence's rows
    # (Q's and dO's over the group's heads).
    if HOST_MAPS:
        k_src = (K, batch.to(gl.int32), kv_head)
        v_src = (V, batch.to(gl.int32), kv_head)
        q_src = (Q, batch.to(gl.int32), first_head.to(gl.int32))
        do_src = (DO, batch.to(gl.int32), first_head.to(gl.int32))
    else:
        k_base = K + batch * stride_kb + k_start.to(gl.int64) * stride_ks + kv_head.to(gl.int64) * stride_kh
        v_base = V + batch * stride_vb + k_start.to(gl.int64) * stride_vs + kv_head.to(gl.int64) * stride_vh
        q_base = Q + batch * stride_qb + q_start.to(gl.int64) * stride_qs + first_head * stride_qh
        do_base = DO + batch * stride_dob + q_start.to(gl.int64) * stride_dos + first_head * stride_doh
        k_src = (tma.make_tensor_descriptor(k_base, [seqlen_k, head_dim], [stride_ks, 1], [HALF_N, D0], k_layout),)
        v_src = (tma.make_tensor_descriptor(v_base, [seqlen_k, head_dim], [stride_vs, 1], [HALF_N, D0],
                                            tile_layout),)
        q_src = (tma.make_tensor_descriptor(q_base, [seqlen_q, kv_group_size, head_dim],
                                            [stride_qs, stride_qh, 1], [BLOCK_M, 1, D0], row3_layout),)
        do_src = (tma.make_tensor_descriptor(do_base, [seqlen_q, kv_group_size, head_dim],
                                             [stride_dos, stride_doh, 1], [BLOCK_M, 1, D0], row3_layout),)

    k_smem = gl.allocate_shared_memory(dtype, [2, HALF_N, D0], k_layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, HALF_N, D0], tile_layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, D0], row3_layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, D0], row3_layout)
    # The second piece: columns D0 and up (head_dim - D0 of them; TMA zero-fills the rest of D1
    # and the stores are masked). Without one, its arguments repeat the first piece's, unused.
    k_src1, v_src1, q_src1, do_src1 = k_src, v_src, q_src, do_src
    k_smem1, v_smem1, q_smem1, do_smem1 = k_smem, v_smem, q_smem, do_smem
    if D1 > 0:
        swizzle1: gl.constexpr = 128 if D1 * 2 >= 128 else D1 * 2
        layout1: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle1, element_bitwidth=16, rank=2)
        row3_layout1: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle1, element_bitwidth=16, rank=3)
        rest = head_dim - D0
        k_src1 = (tma.make_tensor_descriptor(k_base + D0, [seqlen_k, rest], [stride_ks, 1], [HALF_N, D1], layout1),)
        v_src1 = (tma.make_tensor_descriptor(v_base + D0, [seqlen_k, rest], [stride_vs, 1], [HALF_N, D1], layout1),)
        q_src1 = (tma.make_tensor_descriptor(q_base + D0, [seqlen_q, kv_group_size, rest],
                                             [stride_qs, stride_qh, 1], [BLOCK_M, 1, D1], row3_layout1),)
        do_src1 = (tma.make_tensor_descriptor(do_base + D0, [seqlen_q, kv_group_size, rest],
                                              [stride_dos, stride_doh, 1], [BLOCK_M, 1, D1], row3_layout1),)
        k_smem1 = gl.allocate_shared_memory(dtype, [2, HALF_N, D1], layout1)
        v_smem1 = gl.allocate_shared_memory(dtype, [2, HALF_N, D1], layout1)
        q_smem1 = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, D1], row3_layout1)
        do_smem1 = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, D1], row3_layout1)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vector_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vector_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for b in gl.static_range(STAGES):
        mbarrier.init(ready.index(b), count=2)  # the TMA transaction's arrival and the producer's
        mbarrier.init(empty.index(b), count=2)  # one arrival per consumer warpgroup

    lo, full_lo, full_hi, n_full, n_tiles = _query_tiles(start_n, seqlen_q, seqlen_k, window_left, window_right,
                                                         use_segments, SegmentSpans + batch * stride_spanb,
                                                         BLOCK_M, BLOCK_N)
    dk_base = DK + batch * stride_dkb + k_start.to(gl.int64) * stride_dks + kv_head.to(gl.int64) * stride_dkh
    dv_base = DV + batch * stride_dvb + k_start.to(gl.int64) * stride_dvs + kv_head.to(gl.int64) * stride_dvh
    row_base = batch * stride_lseb + first_head * stride_lseh + q_start
    alibi_base = batch * stride_alibib
    q_seg_base = QSegmentIds + batch * stride_qsegb
    kv_seg_base = KvSegmentIds + batch * stride_kvsegb

    # BIAS_TMA: the bias rows of each query tile come with its Q and dO (one buffer per slot,
    # bias_load for the producer); a bias broadcast over the heads is read at head 0 of a
    # one-head descriptor. d bias goes out through a float32 staging tile per warpgroup, and the
    # transposed dropout mask through an int8 tile of its own (dropout_sm90.py says why). mods_*:
    # each consumer's part. Empty tuples otherwise (a None would not pass into the partitions).
    bias_load = ()
    mods_0 = ()
    mods_1 = ()
    if SCORE_MOD == BIAS_TMA:
        bias_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
        per_head = stride_biash != 0
        bias_desc = tma.make_tensor_descriptor(
            Bias + batch * stride_biasb + first_head * stride_biash,
            [seqlen_q, gl.where(per_head, kv_group_size, 1), seqlen_k],
            [stride_biasq, gl.where(per_head, stride_biash, stride_biasq), 1], [BLOCK_M, 1, BLOCK_N], bias_layout)
        bias_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, 1, BLOCK_N], bias_layout)
        bias_load = (bias_desc, bias_smem, use_bias, per_head.to(gl.int32))
        dbias_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
        dbias_desc = tma.make_tensor_descriptor(DBias + batch * stride_dbiasb + first_head * stride_dbiash,
                                                [seqlen_q, kv_group_size, seqlen_k], [stride_dbiasq, stride_dbiash, 1],
                                                [BLOCK_M, 1, 32], dbias_layout)
        seed = gl.load(DropoutSeed, mask=dropout_threshold > 0, other=0)
        keep_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        mods_0 = (bias_smem, use_bias, dbias_desc, gl.allocate_shared_memory(gl.float32, [BLOCK_M, 1, HALF_N],
                  dbias_layout), write_dbias, seed, batch, dropout_threshold, dropout_scale,
                  gl.allocate_shared_memory(gl.int8, [BLOCK_M, HALF_N], keep_layout))
        mods_1 = (bias_smem, use_bias, dbias_desc, gl.allocate_shared_memory(gl.float32, [BLOCK_M, 1, HALF_N],
                  dbias_layout), write_dbias, seed, batch, dropout_threshold, dropout_scale,
                  gl.allocate_shared_memory(gl.int8, [BLOCK_M, HALF_N], keep_layout))

    dqa_desc, dq_smem0, dq_smem1 = None, None, None
    if ACCUMULATE_DQ:
        # The float32 accumulator's descriptor over the group's heads and a dQ staging tile per
        # warpgroup: all the columns in the two-warpgroup form, its half of them in the wide one.
        dq_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=3)
        dqa_base = DQAccum + batch * stride_dqab + q_start.to(gl.int64) * stride_dqas + first_head * stride_dqah
        dqa_desc = tma.make_tensor_descriptor(dqa_base, [seqlen_q, kv_group_size, head_dim],
                                              [stride_dqas, stride_dqah, 1], [BLOCK_M, 1, 32], dq_layout)
        DQ_COLS: gl.constexpr = BLOCK_D // 2 if WIDE else BLOCK_D
        dq_smem0 = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 1, DQ_COLS], dq_layout)
        dq_smem1 = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 1, DQ_COLS], dq_layout)

    if WIDE:
        # P^T and dS^T of the tile pair, each warpgroup storing the rows of its keys; both
        # warpgroups' products read all of them (tile_ready: one arrival each), double-buffered.
        pt_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], tile_layout)
        dst_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M], tile_layout)
        tile_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(tile_ready.index(b), count=2)
        gl.warp_specialize([
            (_accumulate_wide, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, pt_smem, dst_smem, kv_ready,
                                ready, empty, tile_ready, dk_base, dv_base, stride_dks, stride_dvs, Alibi,
                                alibi_base, stride_alibih, use_alibi, alibi_offset, q_seg_base, kv_seg_base,
                                use_segments, kv_group_size, kv_head, start_n, seqlen_q, seqlen_k, head_dim, lo,
                                full_lo, full_hi, n_full, n_tiles, window_left, window_right, qk_scale, softcap_log2,
                                softmax_scale, dqa_desc, dq_smem0, 0, HALF_N, BLOCK_M, BLOCK_D, STAGES, SCORE_MOD,
                                ACCUMULATE_DQ, CARRIED)),
            (_accumulate_wide, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, pt_smem, dst_smem, kv_ready,
                                ready, empty, tile_ready, dk_base, dv_base, stride_dks, stride_dvs, Alibi,
                                alibi_base, stride_alibih, use_alibi, alibi_offset, q_seg_base, kv_seg_base,
                                use_segments, kv_group_size, kv_head, start_n, seqlen_q, seqlen_k, head_dim, lo,
                                full_lo, full_hi, n_full, n_tiles, window_left, window_right, qk_scale, softcap_log2,
                                softmax_scale, dqa_desc, dq_smem1, 1, HALF_N, BLOCK_M, BLOCK_D, STAGES, SCORE_MOD,
                                ACCUMULATE_DQ, CARRIED)),
            (_load, (k_src, v_src, q_src, do_src, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                     kv_ready, ready, empty, Lse, Delta, row_base, stride_lseh, start_n, seqlen_q, kv_group_size,
                     lo, full_lo, full_hi, n_full, n_tiles, k_src1, v_src1, q_src1, do_src1, k_smem1, v_smem1,
                     q_smem1, do_smem1, bias_load, HALF_N, BLOCK_M, STAGES, CARRIED, D1)),
        ], [4, PRODUCER_WARPS], [240, 24])
        for b in gl.static_range(2):
            mbarrier.invalidate(tile_ready.index(b))
    else:
        ds_smem, ds_ready = None, None
        if ACCUMULATE_DQ:
            # dS^T of each warpgroup, double-buffered (ds_ready: its own arrival).
            ds_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            ds_smem = gl.allocate_shared_memory(dtype, [4, HALF_N, BLOCK_M], ds_layout)
            ds_ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
            for b in gl.static_range(4):
                mbarrier.init(ds_ready.index(b), count=1)
        gl.warp_specialize([
            (_accumulate, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, ready, empty,
                           dk_base, dv_base, stride_dks, stride_dvs, Alibi, alibi_base, stride_alibih, use_alibi,
                           alibi_offset, q_seg_base, kv_seg_base, use_segments, kv_group_size, kv_head,
                           start_n, seqlen_q, seqlen_k, head_dim, lo, full_lo, full_hi, n_full, n_tiles,
                           window_left, window_right, qk_scale, softcap_log2, softmax_scale,
                           ds_smem, ds_ready, dqa_desc, dq_smem0, k_smem1, v_smem1, q_smem1, do_smem1, mods_0,
                           0, HALF_N, BLOCK_M, D0, STAGES, SCORE_MOD, ACCUMULATE_DQ, CARRIED, D1)),
            (_accumulate, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_ready, ready, empty,
                           dk_base, dv_base, stride_dks, stride_dvs, Alibi, alibi_base, stride_alibih, use_alibi,
                           alibi_offset, q_seg_base, kv_seg_base, use_segments, kv_group_size, kv_head,
                           start_n, seqlen_q, seqlen_k, head_dim, lo, full_lo, full_hi, n_full, n_tiles,
                           window_left, window_right, qk_scale, softcap_log2, softmax_scale,
                           ds_smem, ds_ready, dqa_desc, dq_smem1, k_smem1, v_smem1, q_smem1, do_smem1, mods_1,
                           1, HALF_N, BLOCK_M, D0, STAGES, SCORE_MOD, ACCUMULATE_DQ, CARRIED, D1)),
            (_load, (k_src, v_src, q_src, do_src, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem,
                     kv_ready, ready, empty, Lse, Delta, row_base, stride_lseh, start_n, seqlen_q, kv_group_size,
                     lo, full_lo, full_hi, n_full, n_tiles, k_src1, v_src1, q_src1, do_src1, k_smem1, v_smem1,
                     q_smem1, do_smem1, bias_load, HALF_N, BLOCK_M, STAGES, CARRIED, D1)),
        ], [4, PRODUCER_WARPS], [240, 24])

    mbarrier.invalidate(kv_ready)
    for b in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(b))
        mbarrier.invalidate(empty.index(b))


# attn_bwd_dkdv's contract: its parameters (the spec checks the function against them) and constexprs.
ATTN_BWD_DKDV_SM90 = KernelSpec(attn_bwd_dkdv_sm90, ATTN_BWD_DKDV.items)
assert ATTN_BWD_DKDV_SM90.constexprs == ATTN_BWD_DKDV.constexprs, \
    "attn_bwd_dkdv_sm90 must take attn_bwd_dkdv's constexprs"
