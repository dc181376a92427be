"""The Hopper (sm_90) attention forward, in Gluon: attn_fwd's contract (forward.py: the same
arguments and results; its grid, or fewer programs per (head, batch): TILE_LOOP), with
FlashAttention-3's structure written out, which Triton's own scheduler does not produce
(docs/notes/tuning.md T1, T3, T6, T13):

- programs that loop over query tiles: a program runs several tiles of its (head, batch)
  (_program_tile), setting up its descriptors and barriers once and loading the next tile's Q,
  K and V while it finishes the last; the op picks how many programs
  (csrc/attention/query_tile_programs.cpp);
- warp specialization: a producer warp loads each consumer's 64 rows of the Q tile and every
  visited K and V tile by TMA into a ring of STAGES shared-memory slots (mbarriers for "ready"
  and, one arrival per consumer, "empty"); BLOCK_M // 64 consumer warpgroups own 64 query rows
  each: two (240 registers each), or three at 160 (d64's 192-row tiles, FlashAttention-3's
  shape; docs/notes/tuning.md T18).
  The TMA descriptors are built on the device from pointers and strides, over one (sequence,
  head) as a [seqlen, head_dim] matrix: TMA zero-fills rows past the sequence and columns past
  head_dim, so varlen and padded head dims need no masked loads, and clips the stores of Out the
  same way. Dense calls up to a length (HOST_MAPS, csrc/attention/host_maps.h) take rank-4 maps
  the host made over the whole tensors instead, which clip the same way (row_tiles.py).
- ping-pong: the consumers take turns (the `turn` mbarriers, a ring) issuing their two products
  of an iteration, S(j) = Q K(j)^T and O += P(j-1) V(j-1), so that one warpgroup's softmax runs
  while the others' products use the tensor cores;
- intra-warpgroup overlap: each consumer waits for S(j) only, and computes the softmax of tile j
  while P(j-1) V(j-1) is still running; P stays in registers as that product's A operand.

Tiles are visited as in attn_fwd: the fully visible ones first without a mask, then the window's
edges and the end of the keys. Supported (SCORE_MOD, triton_src/variants.py): plain,
softcap_alibi, alibi_only and bias_tma (a bias that TMA can read, with dropout, softcap and
ALiBi: the producer loads each key tile's bias rows into shared memory with K and V;
dropout_sm90.py draws the dropout mask), windows and causal, sinks, GQA, varlen (cu_seqlens,
seqused_k), segment ids (masks.segment_span);
configs.json keeps bias_dropout (any bias layout, dropout without a bias) and the 32 bucket on
attn_fwd, and at d64 all but the long dense calls without score modifications (TILE_LOOP). The
op guarantees what TMA needs: 16-byte aligned bases and row strides, head_dim a multiple of 8.

Head-dim buckets that are not a power of two (96, 192; configs.json builds them for this kernel
alone) run the head dim in two pieces, 64 + 32 or 128 + 64 columns, each with its own TMA
descriptors and shared-memory tiles: S sums the two pieces' products, O is two accumulators, so
head dims 72-96 and 136-192 pay for their own width instead of the next power of two's.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from .bias_sm90 import add_bias, bias_tma_args, invalidate_bias_slots, load_bias
from .constants import LN2, LOG2E
from .dropout_sm90 import dropout_keep
from .forward import ATTN_FWD
from .fp8 import descale_at, fp8_pointer
from .masks import key_bounds, segment_ids, segment_span, visible_key_range
from .row_tiles import load_rows, store_rows
from .score_mods import alibi_scores, modified_scores
from .spec import KernelSpec
from .tiles import sequence_span, tile_at, tile_loop_bounds
from .variants import ALIBI_ONLY, BIAS_DROPOUT, BIAS_TMA, PLAIN


@gluon.jit
def head_alibi_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi, zero, SCORE_MOD: gl.constexpr):
    """The head's ALiBi slope in the log2 domain for the consumer partitions (the dQ kernel's
    too): `zero`, a runtime 0 (as the partitions' arguments must be runtime values), without
    ALiBi or in the plain variant, where nothing is read."""
    alibi_log2 = zero
    if SCORE_MOD != PLAIN:
        if use_alibi != 0:
            alibi_log2 = gl.load(Alibi + batch * stride_alibib + head.to(gl.int64) * stride_alibih) * LOG2E
    return alibi_log2


@gluon.jit
def _key_tiles(start_m, seqlen_q, seqlen_k, window_left, window_right, use_segments, span_base,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """attn_fwd's key tiles for the query tile at start_m as one sequence: (lo, full_lo, full_hi,
    n_full, n_tiles). Tile i < n_full starts at key full_lo + i * BLOCK_N and needs no mask; the
    others are the masked edges, [lo, full_lo) then [full_hi, hi) (_tile_start). Segment ids
    as masks.segment_span says, from the tile's span at span_base (attn_fwd's SegmentSpans)."""
    lo, full_lo, full_hi, hi = visible_key_range(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                 BLOCK_M, BLOCK_N)
    lo, full_lo, full_hi, hi = segment_span(span_base, start_m, seqlen_q, lo, full_lo, full_hi, hi, use_segments,
                                            BLOCK_M, BLOCK_N)
    start, stop = tile_loop_bounds(lo, full_lo, full_hi, hi, BLOCK_N, True)
    n_full = (full_hi - full_lo) // BLOCK_N
    return lo, full_lo, full_hi, n_full, n_full + (stop - start) // BLOCK_N


@gluon.jit
def _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_N: gl.constexpr):
    """First key of the i-th tile of _key_tiles' sequence."""
    return gl.where(i < n_full, full_lo + i * BLOCK_N, tile_at(lo + (i - n_full) * BLOCK_N, full_lo, full_hi, True))


@gluon.jit
def _program_tile(k, pid, num_programs, num_m_tiles, heavy_first):
    """The query tile of the k-th round of program pid (a grid of num_programs per (head,
    batch)): rounds of num_programs tiles, heaviest first where later tiles see more keys,
    snaked (the program that takes a round's heaviest tile takes the next round's lightest) so
    the programs' totals balance. A rank past the last tile gives num_m_tiles: a tile past
    every sequence's end, which visits no key and stores nothing."""
    rank = k * num_programs + gl.where(k % 2 == 0, pid, num_programs - 1 - pid)
    tile = gl.where(heavy_first != 0, num_m_tiles - 1 - rank, rank)
    return gl.where((tile < 0) | (tile >= num_m_tiles), num_m_tiles, tile)


@gluon.jit
def _key_value_ring(dtype: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                    tile_layout: gl.constexpr, CONSUMERS: gl.constexpr = 2, V_TRANSPOSED: gl.constexpr = False,
                    v_layout: gl.constexpr = None):
    """The K/V ring that the producer fills and the CONSUMERS consumer warpgroups drain: (k_smem,
    v_smem, k_ready, v_ready, k_empty, v_empty), STAGES slots each, a slot's "empty" passed by one
    arrival of each consumer. The backward's dQ kernel shares it (backward_dq_sm90.py).
    V_TRANSPOSED: V's slots hold V^T tiles [BLOCK_D, BLOCK_N] in v_layout (FP8, whose second
    product takes V K-major)."""
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], tile_layout)
    if V_TRANSPOSED:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_D, BLOCK_N], v_layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_D], tile_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(b), count=1)
        mbarrier.init(v_ready.index(b), count=1)
        mbarrier.init(k_empty.index(b), count=CONSUMERS)  # one arrival per consumer warpgroup
        mbarrier.init(v_empty.index(b), count=CONSUMERS)
    return k_smem, v_smem, k_ready, v_ready, k_empty, v_empty


@gluon.jit
def _invalidate_ring(k_ready, v_ready, k_empty, v_empty, STAGES: gl.constexpr):
    for b in gl.static_range(STAGES):
        mbarrier.invalidate(k_ready.index(b))
        mbarrier.invalidate(v_ready.index(b))
        mbarrier.invalidate(k_empty.index(b))
        mbarrier.invalidate(v_empty.index(b))


@gluon.jit
def _load_key_tile(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, start_n,
                   STAGES: gl.constexpr, k_desc1=None, v_desc1=None, k_smem1=None, v_smem1=None,
                   V_TRANSPOSED: gl.constexpr = False):
    """The producer's load of the `it`-th key tile it sends through the ring (keys from start_n):
    K, then V, each into its slot once every consumer has released the slot's last tile. A fresh
    mbarrier passes a wait on parity 1, so the first round does not wait. A head dim in two
    pieces (k_desc1 given: attn_fwd_sm90's 96 and 192 buckets) loads both on the same barriers.
    V_TRANSPOSED: v_desc is over V^T [head_dim, keys] (FP8)."""
    stage = it % STAGES
    free_phase = ((it // STAGES) & 1) ^ 1
    mbarrier.wait(k_empty.index(stage), free_phase)
    if k_desc1 is not None:
        mbarrier.expect(k_ready.index(stage), k_desc[0].block_type.nbytes + k_desc1[0].block_type.nbytes)
        load_rows(k_desc1, start_n, k_ready.index(stage), k_smem1.index(stage))
    else:
        mbarrier.expect(k_ready.index(stage), k_desc[0].block_type.nbytes)
    load_rows(k_desc, start_n, k_ready.index(stage), k_smem.index(stage))
    mbarrier.wait(v_empty.index(stage), free_phase)
    if v_desc1 is not None:
        mbarrier.expect(v_ready.index(stage), v_desc[0].block_type.nbytes + v_desc1[0].block_type.nbytes)
        load_rows(v_desc1, start_n, v_ready.index(stage), v_smem1.index(stage))
    else:
        mbarrier.expect(v_ready.index(stage), v_desc[0].block_type.nbytes)
    if V_TRANSPOSED:
        tma.async_copy_global_to_shared(v_desc[0], [0, start_n], v_ready.index(stage), v_smem.index(stage))
    else:
        load_rows(v_desc, start_n, v_ready.index(stage), v_smem.index(stage))


@gluon.jit
def _load(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty,
          q_desc1, k_desc1, v_desc1, q_smem1, k_smem1, v_smem1,
          pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left, window_right,
          use_segments, span_base, bias_load, BLOCK_M: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
          STAGES: gl.constexpr, D1: gl.constexpr, V_TRANSPOSED: gl.constexpr):
    """The producer warp: for each of the program's query tiles, each consumer's 64 rows of the
    Q tile (once that consumer has released the previous one: q_empty), then each visited tile's
    K and V into the ring, a slot refilled once every consumer has released it (k_empty /
    v_empty, one arrival per consumer). The ring's position runs on across query tiles, so the
    next tile's K and V load while the consumers finish this one. With D1 > 0 each tile also
    has its second head-dim piece (the *1 descriptors and buffers), loaded on the same barriers.
    bias_load (BIAS_TMA, else empty): each key tile's bias rows of each consumer
    (bias_sm90.load_bias)."""
    it = 0
    for k in range(n_rounds):
        start_m = _program_tile(k, pid, num_programs, num_m_tiles, heavy_first) * BLOCK_M
        lo, full_lo, full_hi, n_full, n_tiles = _key_tiles(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                           use_segments, span_base, BLOCK_M, BLOCK_N)
        # Every tile passes q_ready, with or without a load: a consumer releases the buffer (q_empty)
        # only after it, so neither side gets two phases ahead of the other. A fresh mbarrier
        # passes a wait on parity 1, so the first tile does not wait.
        for wg in gl.static_range(BLOCK_M // WG_M):
            mbarrier.wait(q_empty.index(wg), (k & 1) ^ 1)
            if n_tiles > 0:
                if D1 > 0:
                    mbarrier.expect(q_ready.index(wg), q_desc[0].block_type.nbytes + q_desc1[0].block_type.nbytes)
                    load_rows(q_desc1, start_m + wg * WG_M, q_ready.index(wg), q_smem1.index(wg))
                else:
                    mbarrier.expect(q_ready.index(wg), q_desc[0].block_type.nbytes)
                load_rows(q_desc, start_m + wg * WG_M, q_ready.index(wg), q_smem.index(wg))
            else:
                mbarrier.arrive(q_ready.index(wg), count=1)
        for i in range(n_tiles):
            start_n = _tile_start(i, lo, full_lo, full_hi, n_full, BLOCK_N)
            if D1 > 0:
                _load_key_tile(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, start_n,
                               STAGES, k_desc1, v_desc1, k_smem1, v_smem1)
            else:
                _load_key_tile(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, it, start_n,
                               STAGES, V_TRANSPOSED=V_TRANSPOSED)
            if len(bias_load) > 0:
                load_bias(bias_load, it, start_m, start_n, BLOCK_M // WG_M, WG_M)
            it += 1


@gluon.jit
def _scores(s, i, start_n, rows, offs_n, n_full, seqlen_k, diagonal, window_left, window_right,
            qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments, mods, it,
            SCORE_MOD: gl.constexpr, SEGMENTS: gl.constexpr):
    """The tile's scores, -inf where masked (tiles past the unmasked ones): forward.py's
    _attend_key_tiles between the two dots. With PLAIN and qk_scale > 0 they stay unscaled
    (_softmax folds qk_scale into its exp2's argument, one FFMA per score); else they are in the
    log2 domain. SEGMENTS: 1 masks by segment ids where use_segments says so; 0 and 2 (the key
    loop's two copies at 160 registers, _key_loop) never and always. BIAS_TMA adds the bias
    after the softcap and ALiBi: the `it`-th key tile's, from the warpgroup's bias slot (mods,
    _attend_tile's), which the producer refills once it is released (bias_sm90.add_bias)."""
    cols = start_n + offs_n
    if SCORE_MOD == ALIBI_ONLY:  # none of the softcap's code
        s = alibi_scores(s * qk_scale, rows[:, None], cols[None, :], diagonal, alibi_log2, alibi_offset)
    elif SCORE_MOD != PLAIN:
        s, _ = modified_scores(s * qk_scale, rows[:, None], cols[None, :],
                               diagonal, softcap_log2, alibi_log2, alibi_offset)
        if SCORE_MOD == BIAS_TMA:
            s = add_bias(s, mods[0], it)
    elif qk_scale <= 0:  # a max does not commute with a scale <= 0
        s = s * qk_scale
    if i >= n_full:
        # Each row's visible keys as offsets into the tile, so a score costs two compares; and
        # the mask is applied before the segment ids' runtime branch, as mask bits kept live
        # across it were packed into registers and out again (the masked tile's softmax ran 3-4
        # times a full one's: docs/notes/tuning.md T36).
        lo, hi = key_bounds(rows, seqlen_k, diagonal, window_left, window_right)
        first = lo - start_n
        last = hi - start_n
        s = gl.where((offs_n[None, :] >= first[:, None]) & (offs_n[None, :] <= last[:, None]), s, float("-inf"))
        if SEGMENTS == 1:
            if use_segments != 0:
                kv_seg = segment_ids(kv_seg_base, cols, seqlen_k, use_segments)
                s = gl.where(q_seg[:, None] == kv_seg[None, :], s, float("-inf"))
        elif SEGMENTS == 2:
            # One key per thread, spread to the scores' layout through shared memory: gathered in
            # that layout, each thread would hold a 64-bit address per column it owns.
            keys: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            kv_seg = segment_ids(kv_seg_base, start_n + gl.arange(0, offs_n.shape[0], layout=keys), seqlen_k,
                                 use_segments)
            s = gl.where(q_seg[:, None] == gl.convert_layout(kv_seg, offs_n.type.layout)[None, :], s, float("-inf"))
    return s


@gluon.jit
def _softmax(s, m_i, l_i, scale, p_log2):
    """softmax.softmax_step on the log2-domain scores s * scale (scale > 0): (p, alpha, m_i, l_i),
    p and l_i times 2^p_log2 (FP8 inputs' probability scale, folded into exp2's argument: no
    multiply per score; 0 for 16-bit inputs). A row that has seen only -inf keeps m = -inf and is
    shifted by 0, so no NaN reaches p or alpha."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * scale)  # the max commutes with a positive scale
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s * scale - (m_shift - p_log2)[:, None])
    alpha = gl.exp2(m_i - m_shift)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr):
    """P as the second product's A operand: in the inputs' 16-bit dtype, or for FP8 inputs (p
    already times the probability scale, _softmax) in e4m3 (forward.py's fp8_probabilities: the
    FP8 product takes e4m3 with V's e4m3 or e5m2) with its keys in fp8.py's KEY_ORDER.

    Why the order: an accumulator thread holds keys 2t, 2t + 1 of each 8 (t = lane % 4), an
    8-bit A operand's keys 4t to 4t + 3 of each 16, so P in key order would be shuffled between
    threads every tile. Relabelled (within each 32 keys, the bits of 8-key block and of t swap
    places) the registers already are the operand: the convert moves nothing (assert_trivial),
    and fp8_transpose_v stores V^T's keys in the same order, so the product's sum is unchanged
    (FlashAttention-3's FP8 forward does the same; fp8.key_order_source)."""
    if dtype.is_fp8():
        rows: gl.constexpr = p.shape[0]
        keys: gl.constexpr = p.shape[1]
        operand = gl.reshape(p, [rows, keys // 32, 2, 2, 4, 2])
        operand = gl.reshape(gl.permute(operand, (0, 1, 2, 4, 3, 5)), [rows, keys])
        operand = gl.convert_layout(operand, p_layout, assert_trivial=True).to(gl.float8e4nv)
    else:
        operand = gl.convert_layout(p.to(dtype), p_layout)
    return operand


@gluon.jit
def _dropped(p, mods, row0, start_n, SCORE_MOD: gl.constexpr):
    """What of the tile's probabilities reaches V: with BIAS_TMA and dropout, 0 where the
    forward's mask (dropout_sm90.dropout_keep, dropout.dropout_keep's draws) drops a key; the
    row sums keep them (dropout acts after the softmax), and the output is scaled at the end."""
    if SCORE_MOD == BIAS_TMA:
        seed, batch, head, threshold = mods[1], mods[2], mods[3], mods[4]
        layout: gl.constexpr = p.type.layout
        if threshold > 0:
            keep = dropout_keep(seed, batch, head, row0, start_n, threshold, layout, p.shape[0], p.shape[1], False)
            p = gl.where(keep, p, 0.0)
    return p


@gluon.jit
def _key_loop(q_tile, k_smem, v_smem, q_empty, k_ready, v_ready, k_empty, v_empty, turn, s_zero, acc, m_i, l_i, it,
              turn_phase, lo, full_lo, full_hi, n_full, n_tiles, rows, offs_n, seqlen_k, diagonal, window_left,
              window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
              softmax_scale, q_tile1, k_smem1, v_smem1, acc1, mods, row0, p_log2,
              WG: gl.constexpr, CONSUMERS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              STAGES: gl.constexpr, SCORE_MOD: gl.constexpr, O_IN_Q_BUFFER: gl.constexpr, SEGMENTS: gl.constexpr,
              D1: gl.constexpr):
    """_attend_tile's products and softmax over its n_tiles (> 0) key tiles: (acc, acc1, m_i,
    l_i, it, turn_phase). Iteration j issues S(j) and O += P(j-1) V(j-1) in its turn, waits for
    S(j), computes tile j's softmax while the second product runs, then waits for it: no wgmma is
    in flight across the loop's back edge, which keeps ptxas from serializing them (an S(j+1)
    carried across it did). With D1 > 0 the head dim comes in two pieces (BLOCK_D, then D1
    columns): S sums both pieces' products, and O is two accumulators (acc, acc1). BIAS_TMA
    adds the bias (mods; row0 is the warpgroup's first row) and drops keys from P(j) V(j).
    FP8 inputs: P goes to V in e4m3 times 2^p_log2 (_softmax, _p_operand), and V's slots hold
    V^T tiles, which the product reads K-major through a permuted view. The loop carries P(j-1)
    as float32 and converts it just before its product: carried as e4m3, its bytes crossed the
    back edge one register each and were packed again (6 PRMT and 2 SHF per operand register)."""
    dtype: gl.constexpr = q_tile.dtype
    FP8: gl.constexpr = dtype.is_fp8()
    MMA_K: gl.constexpr = 32 if FP8 else 16
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_D, MMA_K])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if FP8 else 2)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_layout1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, D1 if D1 > 0 else BLOCK_D, 16])
    p_layout1: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout1, k_width=2)
    orow_layout1: gl.constexpr = gl.SliceLayout(1, o_layout1)
    mbarrier.wait(k_ready.index(it % STAGES), (it // STAGES) & 1)
    s = warpgroup_mma(q_tile, k_smem.index(it % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if D1 > 0:
        s = warpgroup_mma(q_tile1, k_smem1.index(it % STAGES).permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(it % STAGES), count=1)
    start_n = _tile_start(0, lo, full_lo, full_hi, n_full, BLOCK_N)
    scores = _scores(s, 0, start_n, rows, offs_n, n_full, seqlen_k, diagonal, window_left, window_right,
                     qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments, mods, it,
                     SCORE_MOD, SEGMENTS)
    p, alpha, m_i, l_i = _softmax(scores, m_i, l_i, softmax_scale, p_log2)
    p = _dropped(p, mods, row0, start_n, SCORE_MOD)
    if not FP8:
        p_op = _p_operand(p, dtype, p_layout)

    for j in range(1, n_tiles):
        # Issue S(j) = Q K(j)^T and O += P(j-1) V(j-1) together, in turn with the other
        # warpgroups, so that their softmax runs while these products use the tensor cores.
        if FP8:
            p_op = _p_operand(p, dtype, p_layout)
        mbarrier.wait(turn.index(WG), turn_phase)
        stage = (it + j) % STAGES
        mbarrier.wait(k_ready.index(stage), ((it + j) // STAGES) & 1)
        s = warpgroup_mma(q_tile, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D1 > 0:
            s = warpgroup_mma(q_tile1, k_smem1.index(stage).permute((1, 0)), s, is_async=True)
        acc = acc * gl.convert_layout(alpha, orow_layout)[:, None]
        prev = (it + j - 1) % STAGES
        mbarrier.wait(v_ready.index(prev), ((it + j - 1) // STAGES) & 1)
        if FP8:
            acc = warpgroup_mma(p_op, v_smem.index(prev).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if D1 > 0:
            acc1 = acc1 * gl.convert_layout(alpha, orow_layout1)[:, None]
            acc1 = warpgroup_mma(gl.convert_layout(p_op, p_layout1), v_smem1.index(prev), acc1, is_async=True)
        mbarrier.arrive(turn.index((WG + 1) % CONSUMERS), count=1)
        turn_phase ^= 1

        # The softmax of tile j overlaps P(j-1) V(j-1): wait for S(j) only (issued first; with
        # two pieces, S's two products and then O's two).
        if D1 > 0:
            s = warpgroup_mma_wait(2, deps=(s, ))
        else:
            s = warpgroup_mma_wait(1, deps=(s, ))
        mbarrier.arrive(k_empty.index(stage), count=1)
        start_n = _tile_start(j, lo, full_lo, full_hi, n_full, BLOCK_N)
        scores = _scores(s, j, start_n, rows, offs_n, n_full, seqlen_k, diagonal, window_left, window_right,
                         qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments, mods,
                         it + j,
                         SCORE_MOD, SEGMENTS)
        p, alpha, m_i, l_i = _softmax(scores, m_i, l_i, softmax_scale, p_log2)
        p = _dropped(p, mods, row0, start_n, SCORE_MOD)
        # P(j-1)'s registers are the running product's operand until it finishes.
        if D1 > 0:
            acc, acc1 = warpgroup_mma_wait(0, deps=(acc, acc1))
        else:
            acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(prev), count=1)
        if not FP8:
            p_op = _p_operand(p, dtype, p_layout)

    if not O_IN_Q_BUFFER:  # Q's last product is done: the producer may load the next tile's
        mbarrier.arrive(q_empty.index(WG), count=1)
    last = (it + n_tiles - 1) % STAGES
    if FP8:
        p_op = _p_operand(p, dtype, p_layout)
    acc = acc * gl.convert_layout(alpha, orow_layout)[:, None]
    mbarrier.wait(v_ready.index(last), ((it + n_tiles - 1) // STAGES) & 1)
    if FP8:
        acc = warpgroup_mma(p_op, v_smem.index(last).permute((1, 0)), acc, is_async=True)
    else:
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    if D1 > 0:
        acc1 = acc1 * gl.convert_layout(alpha, orow_layout1)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p_op, p_layout1), v_smem1.index(last), acc1, is_async=True)
        acc, acc1 = warpgroup_mma_wait(0, deps=(acc, acc1))
    else:
        acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(v_empty.index(last), count=1)
    it += n_tiles
    return acc, acc1, m_i, l_i, it, turn_phase


@gluon.jit
def _attend_tile(q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
                 lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base, start_m, k, it, turn_phase,
                 seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                 q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods, p_scale, out_scale,
                 WG: gl.constexpr, BLOCK_M: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 BLOCK_D: gl.constexpr, STAGES: gl.constexpr, SCORE_MOD: gl.constexpr, O_IN_Q_BUFFER: gl.constexpr,
                 D1: gl.constexpr):
    """One consumer warpgroup on one query tile: rows [start_m + WG * WG_M, + WG_M),
    through every visited key tile, then its rows of Out and Lse; k is the tile's round. it (key
    tiles consumed) and turn_phase run on across the program's tiles, as the producer's and the
    other warpgroups do; returns them updated. The turns run on across query tiles too: the
    last warpgroup's single opening arrival (in _attend) keeps the first one a turn ahead,
    whatever each tile's length. mods: BIAS_TMA's bias and dropout (attn_fwd_sm90 says what).
    FP8 inputs: p_scale scales P for its e4m3 product (and so the row sums), and out_scale (V's
    descale) multiplies the output, which is stored in Out's 16-bit dtype (o_smem's)."""
    dtype: gl.constexpr = q_smem.dtype
    FP8: gl.constexpr = dtype.is_fp8()
    MMA_K: gl.constexpr = 32 if FP8 else 16
    gl.static_assert(not (FP8 and O_IN_Q_BUFFER), "FP8 inputs stage Out in a buffer of its own dtype")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, MMA_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_D, MMA_K])
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_layout1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, D1 if D1 > 0 else BLOCK_D, 16])
    orow_layout1: gl.constexpr = gl.SliceLayout(1, o_layout1)

    CONSUMERS: gl.constexpr = BLOCK_M // WG_M
    lo, full_lo, full_hi, n_full, n_tiles = _key_tiles(start_m, seqlen_q, seqlen_k, window_left, window_right,
                                                       use_segments, span_base, BLOCK_M, BLOCK_N)
    row0 = start_m + WG * WG_M
    rows = row0 + gl.arange(0, WG_M, layout=row_layout)
    # What _softmax multiplies the scores _scores returns by: qk_scale where _scores left them
    # unscaled (PLAIN with qk_scale > 0), else 1.
    softmax_scale = qk_scale * 0.0 + 1.0
    if SCORE_MOD == PLAIN:
        if qk_scale > 0:
            softmax_scale = qk_scale
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    diagonal = seqlen_k - seqlen_q
    q_seg = segment_ids(q_seg_base, rows, seqlen_q, use_segments)

    # FP8 inputs: _softmax's probabilities, and so l_i, come times p_scale = 2^p_log2 (a power of
    # two: its exponent field, exactly); out = acc / l_i needs no other correction, lse does.
    if FP8:
        p_log2 = (((p_scale.to(gl.int32, bitcast=True) >> 23) & 255) - 127).to(gl.float32)
        l_unit = p_scale
    else:
        p_log2 = 0.0
        l_unit = 1.0
    # softmax.initial_softmax_state: a sink joins the denominator as exp2(0) = 1 (l_unit) at m =
    # its logit (sink_log2 is -inf without one).
    m_i = gl.zeros([WG_M], gl.float32, layout=row_layout) + sink_log2
    l_i = gl.where(m_i == float("-inf"), 0.0, l_unit)
    acc = gl.zeros([WG_M, BLOCK_D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([WG_M, BLOCK_N], gl.float32, layout=s_layout)
    q_tile = q_smem.index(WG)
    q_tile1 = None
    # The head dim's second piece (attn_fwd_sm90's split buckets); without one, a placeholder
    # that the key loop hands back untouched (a jit function cannot return None).
    acc1 = gl.zeros([32], gl.float32, layout=gl.BlockedLayout([1], [32], [4], [0]))
    if D1 > 0:
        q_tile1 = q_smem1.index(WG)
        acc1 = gl.zeros([WG_M, D1], gl.float32, layout=o_layout1)

    mbarrier.wait(q_ready.index(WG), k & 1)
    if n_tiles > 0:
        # At 160 registers (three consumers) the key loop is compiled twice, with and without
        # segment ids: their mask costs the loop registers even where unused (docs/notes/tuning.md T18).
        if CONSUMERS == 2:
            acc, acc1, m_i, l_i, it, turn_phase = _key_loop(
                q_tile, k_smem, v_smem, q_empty, k_ready, v_ready, k_empty, v_empty, turn, s_zero, acc, m_i, l_i, it,
                turn_phase, lo, full_lo, full_hi, n_full, n_tiles, rows, offs_n, seqlen_k, diagonal, window_left,
                window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
                softmax_scale, q_tile1, k_smem1, v_smem1, acc1, mods, row0, p_log2, WG, CONSUMERS, BLOCK_N, BLOCK_D,
                STAGES,
                SCORE_MOD, O_IN_Q_BUFFER, 1, D1)
        elif use_segments != 0:
            acc, acc1, m_i, l_i, it, turn_phase = _key_loop(
                q_tile, k_smem, v_smem, q_empty, k_ready, v_ready, k_empty, v_empty, turn, s_zero, acc, m_i, l_i, it,
                turn_phase, lo, full_lo, full_hi, n_full, n_tiles, rows, offs_n, seqlen_k, diagonal, window_left,
                window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
                softmax_scale, q_tile1, k_smem1, v_smem1, acc1, mods, row0, p_log2, WG, CONSUMERS, BLOCK_N, BLOCK_D,
                STAGES,
                SCORE_MOD, O_IN_Q_BUFFER, 2, D1)
        else:
            acc, acc1, m_i, l_i, it, turn_phase = _key_loop(
                q_tile, k_smem, v_smem, q_empty, k_ready, v_ready, k_empty, v_empty, turn, s_zero, acc, m_i, l_i, it,
                turn_phase, lo, full_lo, full_hi, n_full, n_tiles, rows, offs_n, seqlen_k, diagonal, window_left,
                window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset, q_seg, kv_seg_base, use_segments,
                softmax_scale, q_tile1, k_smem1, v_smem1, acc1, mods, row0, p_log2, WG, CONSUMERS, BLOCK_N, BLOCK_D,
                STAGES,
                SCORE_MOD, O_IN_Q_BUFFER, 0, D1)
    elif not O_IN_Q_BUFFER:
        mbarrier.arrive(q_empty.index(WG), count=1)

    # softmax.softmax_finish: rows that saw no key give out 0 and lse -inf (or the sink's).
    l_o = gl.convert_layout(l_i, orow_layout)
    empty = l_o == 0.0
    out = acc / gl.where(empty, 1.0, l_o)[:, None]
    lse = gl.where(empty, float("-inf"), (gl.convert_layout(m_i, orow_layout) + gl.log2(l_o) - p_log2) * LN2)
    out1 = None
    if D1 > 0:
        l_o1 = gl.convert_layout(l_i, orow_layout1)
        out1 = acc1 / gl.where(l_o1 == 0.0, 1.0, l_o1)[:, None]
    if SCORE_MOD == BIAS_TMA:  # the kept probabilities' 1 / (1 - p); 1 without dropout
        out = out * mods[5]
        if D1 > 0:
            out1 = out1 * mods[5]
    if FP8:
        out = out * out_scale

    # Out through shared memory and TMA, which clips rows past the sequence and columns past
    # head_dim: o_smem (the previous tile's store finished reading it first), or with
    # O_IN_Q_BUFFER this warpgroup's Q buffer, released to the producer once the store has read
    # it. Rows past the sequence's end (or an empty sequence, whose descriptor has no rows) store
    # nothing.
    if row0 < seqlen_q:
        if O_IN_Q_BUFFER:
            staging = q_tile
            staging1 = q_tile1
        else:
            staging = o_smem.index(WG)
            staging1 = o_smem1.index(WG)
            tma.store_wait(0)
        staging.store(out.to(staging.dtype))
        if D1 > 0:
            staging1.store(out1.to(staging1.dtype))
        fence_async_shared()
        store_rows(o_desc, row0, staging)
        if D1 > 0:
            store_rows(o_desc1, row0, staging1)
        orows = row0 + gl.arange(0, WG_M, layout=orow_layout)
        gl.store(lse_base + orows, lse, mask=orows < seqlen_q)
    if O_IN_Q_BUFFER:
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(WG), count=1)
    return it, turn_phase


@gluon.jit
def _attend(q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
            lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
            pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left, window_right,
            qk_scale, softcap_log2, alibi_log2, alibi_offset, q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods,
            p_scale, out_scale, WG: gl.constexpr, BLOCK_M: gl.constexpr, WG_M: gl.constexpr, BLOCK_N: gl.constexpr,
            BLOCK_D: gl.constexpr, STAGES: gl.constexpr, SCORE_MOD: gl.constexpr, O_IN_Q_BUFFER: gl.constexpr,
            D1: gl.constexpr):
    """One consumer warpgroup through the program's query tiles (_program_tile's order)."""
    if WG == BLOCK_M // WG_M - 1:
        mbarrier.arrive(turn.index(0), count=1)  # the first warpgroup issues first
    it = 0
    turn_phase = 0
    for k in range(n_rounds):
        start_m = _program_tile(k, pid, num_programs, num_m_tiles, heavy_first) * BLOCK_M
        it, turn_phase = _attend_tile(
            q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn, o_desc,
            lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base, start_m, k, it, turn_phase,
            seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
            q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods, p_scale, out_scale, WG, BLOCK_M, WG_M, BLOCK_N,
            BLOCK_D, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)
    tma.store_wait(0)


def _kernel_name(specialization) -> str:
    """The compiled function's name: attn_fwd_sm90_maps for the HOST_MAPS variants, so that a
    profile tells the two forms apart."""
    return "attn_fwd_sm90_maps" if specialization.constants.get("HOST_MAPS") else "attn_fwd_sm90"


@gluon.jit(repr=_kernel_name)
def attn_fwd_sm90(
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
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
    SCORE_MOD: gl.constexpr, PAD_D: gl.constexpr, TILE_LOOP: gl.constexpr, FP8: gl.constexpr,
    HOST_MAPS: gl.constexpr = False,
):
    """attn_fwd's contract (see its docstring) for SCORE_MOD PLAIN, SOFTCAP_ALIBI, ALIBI_ONLY and BIAS_TMA
    (a bias read by TMA, dropout). Launched with 4 warps (the first consumer warpgroup); warp_specialize adds the
    other consumers and the producer warp.

    TILE_LOOP (always true here): the grid's first axis may be shorter than cdiv(seqlen_q,
    BLOCK_M); each program then runs several query tiles of its (head, batch) (_program_tile),
    building the TMA descriptors and barriers once and loading the next tile's Q, K and V while
    it finishes the last one.

    HOST_MAPS: Q, K, V and Out are TMA maps the host made over the dense tensors (row_tiles.py),
    so a program makes no descriptor of its own: the four cost 3.0-3.3 us of a program's setup,
    5-11 % of a 1k call (docs/notes/tuning.md T36, T39, T40). Dense 16-bit calls of the power-of-two
    buckets without a bias."""
    gl.static_assert(TILE_LOOP, "attn_fwd_sm90's programs loop over query tiles")
    gl.static_assert(SCORE_MOD != BIAS_DROPOUT, "attn_fwd_sm90 reads a bias by TMA alone (bias_tma)")
    STAGES: gl.constexpr = 2
    WG_M: gl.constexpr = 64  # query rows per consumer warpgroup
    CONSUMERS: gl.constexpr = BLOCK_M // WG_M
    # Out is staged in its own buffer where shared memory has room for one (the next tile's Q
    # then loads during this tile's last product), else in the Q buffer; FP8 inputs always in
    # their own (Q's is 8-bit, and 8-bit K and V tiles leave the room: 164 KB at d256).
    O_IN_Q_BUFFER: gl.constexpr = (BLOCK_D > 128) & (FP8 == 0)
    # A bucket that is not a power of two (96, 192) is two pieces of the head dim, each a power of
    # two as tensor shapes must be: D0 = 64 or 128 columns, then D1 = 32 or 64. Every product runs
    # on both (S sums them, O is two accumulators) and TMA moves each piece with its own
    # descriptor, so the bucket costs its own width instead of the next power of two's.
    D0: gl.constexpr = BLOCK_D if (BLOCK_D & (BLOCK_D - 1)) == 0 else BLOCK_D * 2 // 3
    D1: gl.constexpr = BLOCK_D - D0
    gl.static_assert((D1 == 0) | (D1 * 2 == D0), "a head-dim bucket is a power of two or 1.5 times one")
    gl.static_assert((FP8 == 0) | (D1 == 0), "FP8 inputs: the power-of-two buckets")
    gl.static_assert(not HOST_MAPS or ((FP8 == 0) & (D1 == 0) & (SCORE_MOD != BIAS_TMA)),
                     "host-made maps: 16-bit inputs, a power-of-two bucket, no bias")
    if HOST_MAPS:
        dtype: gl.constexpr = Q.dtype
        out_dtype: gl.constexpr = Out.dtype
    else:
        # FP8 inputs (forward.py's FP8): Q, K and V reinterpreted, V given as V^T (fp8.py).
        Q = fp8_pointer(Q, FP8)
        K = fp8_pointer(K, FP8)
        V = fp8_pointer(V, FP8)
        dtype: gl.constexpr = Q.dtype.element_ty
        out_dtype: gl.constexpr = Out.dtype.element_ty
    gl.static_assert((CONSUMERS == 2) | (CONSUMERS == 3), "two or three consumer warpgroups of 64 query rows")

    num_m_tiles = gl.cdiv(seqlen_q, BLOCK_M)  # the dense (or longest) length, before sequence_span
    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    n_rounds = gl.cdiv(num_m_tiles, num_programs)
    heavy_first = (window_right >= 0).to(gl.int32)  # later query tiles see more keys
    head = gl.program_id(1)
    batch = gl.program_id(2).to(gl.int64)
    kv_head = head // kv_group_size
    q_start, seqlen_q = sequence_span(CuSeqlensQ, CuSeqlensQ, batch, seqlen_q, use_cu_seqlens, 0)
    k_start, seqlen_k = sequence_span(CuSeqlensK, SequsedK, batch, seqlen_k, use_cu_seqlens, use_seqused_k)

    BITS: gl.constexpr = dtype.primitive_bitwidth
    swizzle: gl.constexpr = 128 if D0 * BITS // 8 >= 128 else D0 * BITS // 8
    tile_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=BITS, rank=2)
    out_swizzle: gl.constexpr = 128 if D0 * 2 >= 128 else D0 * 2
    out_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=out_swizzle, element_bitwidth=16, rank=2)
    # Each tensor's rows as row_tiles.py's sources: the host's maps at this (batch, head), or
    # descriptors made here over this (sequence, head).
    if HOST_MAPS:
        v_layout: gl.constexpr = tile_layout
        q_desc = (Q, batch.to(gl.int32), head)
        k_desc = (K, batch.to(gl.int32), kv_head)
        v_desc = (V, batch.to(gl.int32), kv_head)
        o_desc = (Out, batch.to(gl.int32), head)
    else:
        q_base = Q + batch * stride_qb + q_start.to(gl.int64) * stride_qs + head.to(gl.int64) * stride_qh
        k_base = K + batch * stride_kb + k_start.to(gl.int64) * stride_ks + kv_head.to(gl.int64) * stride_kh
        o_base = Out + batch * stride_ob + q_start.to(gl.int64) * stride_os + head.to(gl.int64) * stride_oh
        q_desc = (tma.make_tensor_descriptor(q_base, [seqlen_q, head_dim], [stride_qs, 1], [WG_M, D0], tile_layout),)
        k_desc = (tma.make_tensor_descriptor(k_base, [seqlen_k, head_dim], [stride_ks, 1], [BLOCK_N, D0],
                                             tile_layout),)
        o_desc = (tma.make_tensor_descriptor(o_base, [seqlen_q, head_dim], [stride_os, 1], [WG_M, D0], out_layout),)
        if FP8:
            # V^T (fp8.py): head_dim rows of the sequence's keys, from a row's start, in KEY_ORDER within
            # each 32, zeros up to the row's end (stride_vd keys, whole tiles): its extent is the row,
            # as zero-filling past seqlen_k would drop keys that the order moved past it.
            v_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128 if BLOCK_N >= 128 else BLOCK_N,
                                                          element_bitwidth=8, rank=2)
            v_base = V + batch * stride_vb + kv_head.to(gl.int64) * stride_vh
            v_desc = (tma.make_tensor_descriptor(v_base, [head_dim, stride_vd.to(gl.int32)], [stride_vd, 1],
                                                 [D0, BLOCK_N], v_layout),)
        else:
            v_layout: gl.constexpr = tile_layout
            v_base = V + batch * stride_vb + k_start.to(gl.int64) * stride_vs + kv_head.to(gl.int64) * stride_vh
            v_desc = (tma.make_tensor_descriptor(v_base, [seqlen_k, head_dim], [stride_vs, 1], [BLOCK_N, D0],
                                                 tile_layout),)

    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, D0], tile_layout)
    if O_IN_Q_BUFFER:
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(out_dtype, [CONSUMERS, WG_M, D0], out_layout)
    k_smem, v_smem, k_ready, v_ready, k_empty, v_empty = _key_value_ring(dtype, STAGES, BLOCK_N, D0, tile_layout,
                                                                         CONSUMERS, FP8 != 0, v_layout)
    # The second piece: columns D0 and up (head_dim - D0 of them; TMA zero-fills the rest of D1
    # and clips the stores). Without one, its arguments repeat the first piece's, unused.
    q_desc1, k_desc1, v_desc1, o_desc1 = q_desc, k_desc, v_desc, o_desc
    q_smem1, o_smem1, k_smem1, v_smem1 = q_smem, o_smem, k_smem, v_smem
    if D1 > 0:
        swizzle1: gl.constexpr = 128 if D1 * 2 >= 128 else D1 * 2
        layout1: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=swizzle1, element_bitwidth=16, rank=2)
        rest = head_dim - D0
        q_desc1 = (tma.make_tensor_descriptor(q_base + D0, [seqlen_q, rest], [stride_qs, 1], [WG_M, D1], layout1),)
        k_desc1 = (tma.make_tensor_descriptor(k_base + D0, [seqlen_k, rest], [stride_ks, 1], [BLOCK_N, D1],
                                              layout1),)
        v_desc1 = (tma.make_tensor_descriptor(v_base + D0, [seqlen_k, rest], [stride_vs, 1], [BLOCK_N, D1],
                                              layout1),)
        o_desc1 = (tma.make_tensor_descriptor(o_base + D0, [seqlen_q, rest], [stride_os, 1], [WG_M, D1], layout1),)
        q_smem1 = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, D1], layout1)
        if O_IN_Q_BUFFER:
            o_smem1 = q_smem1
        else:
            o_smem1 = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, D1], layout1)
        k_smem1 = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D1], layout1)
        v_smem1 = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D1], layout1)
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(b), count=1)
        mbarrier.init(q_empty.index(b), count=1)
        mbarrier.init(turn.index(b), count=1)

    alibi_log2 = head_alibi_log2(Alibi, batch, head, stride_alibib, stride_alibih, use_alibi, qk_scale * 0.0,
                                 SCORE_MOD)
    sink_log2 = qk_scale * 0.0 + float("-inf")
    if use_sinks != 0:
        sink_log2 = gl.load(Sinks + head) * LOG2E
    # FP8: q's and k's descales fold into the scores' scale, V's into the output's (P's scale
    # cancels in out = acc / l, both summing scaled probabilities).
    out_scale = qk_scale * 0.0 + 1.0
    if FP8:
        qk_scale = qk_scale * (descale_at(QDescale, batch, head // q_descale_group, stride_qdescaleb, stride_qdescaleh)
                               * descale_at(KDescale, batch, kv_head, stride_kdescaleb, stride_kdescaleh))
        out_scale = descale_at(VDescale, batch, kv_head, stride_vdescaleb, stride_vdescaleh)
    q_seg_base = QSegmentIds + batch * stride_qsegb
    kv_seg_base = KvSegmentIds + batch * stride_kvsegb
    span_base = SegmentSpans + batch * stride_spanb
    lse_base = Lse + batch * stride_lseb + head.to(gl.int64) * stride_lseh + q_start
    # BIAS_TMA's bias (as attn_fwd's, over the sequence's [seqlen_q, seqlen_k]; by TMA,
    # bias_sm90.py) and dropout: bias_load for the producer, per consumer its bias slot and the
    # dropout's arguments (mods). Empty tuples for the other variants (a None would not pass
    # into the partitions).
    bias_load, mods_0, mods_1, mods_2 = (), (), (), ()
    if SCORE_MOD == BIAS_TMA:
        bias_load, mods_0, mods_1, mods_2 = bias_tma_args(
            Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold, dropout_scale,
            batch, head, seqlen_q, seqlen_k, dtype, CONSUMERS, WG_M, BLOCK_N)

    # The partitions, written out per consumer count (Triton 3.6 passes a tuple's constexpr
    # elements, such as WG_M, on as values, so the shared arguments cannot be one tuple):
    # registers per thread (setmaxnreg) within the SM's 64K, the default partition (the first
    # consumer) getting the rest.
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_attend, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
                       pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left,
                       window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                       q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods_0, p_scale, out_scale,
                       0, BLOCK_M, WG_M, BLOCK_N, D0, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)),
            (_attend, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
                       pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left,
                       window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                       q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods_1, p_scale, out_scale,
                       1, BLOCK_M, WG_M, BLOCK_N, D0, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)),
            (_load, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                     v_empty, q_desc1, k_desc1, v_desc1, q_smem1, k_smem1, v_smem1, pid, num_programs, num_m_tiles,
                     n_rounds, heavy_first, seqlen_q, seqlen_k, window_left, window_right, use_segments, span_base,
                     bias_load, BLOCK_M, WG_M, BLOCK_N, STAGES, D1, FP8 != 0)),
        ], [4, 1], [240, 24])
    else:
        gl.warp_specialize([
            (_attend, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
                       pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left,
                       window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                       q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods_0, p_scale, out_scale,
                       0, BLOCK_M, WG_M, BLOCK_N, D0, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)),
            (_attend, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
                       pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left,
                       window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                       q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods_1, p_scale, out_scale,
                       1, BLOCK_M, WG_M, BLOCK_N, D0, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)),
            (_attend, (q_smem, k_smem, v_smem, o_smem, q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turn,
                       o_desc, lse_base, sink_log2, q_seg_base, kv_seg_base, use_segments, span_base,
                       pid, num_programs, num_m_tiles, n_rounds, heavy_first, seqlen_q, seqlen_k, window_left,
                       window_right, qk_scale, softcap_log2, alibi_log2, alibi_offset,
                       q_smem1, k_smem1, v_smem1, o_smem1, o_desc1, mods_2, p_scale, out_scale,
                       2, BLOCK_M, WG_M, BLOCK_N, D0, STAGES, SCORE_MOD, O_IN_Q_BUFFER, D1)),
            (_load, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, k_ready, v_ready, k_empty,
                     v_empty, q_desc1, k_desc1, v_desc1, q_smem1, k_smem1, v_smem1, pid, num_programs, num_m_tiles,
                     n_rounds, heavy_first, seqlen_q, seqlen_k, window_left, window_right, use_segments, span_base,
                     bias_load, BLOCK_M, WG_M, BLOCK_N, STAGES, D1, FP8 != 0)),
        ], [4, 4, 1], [160, 160, 24])

    for b in gl.static_range(CONSUMERS):
        mbarrier.invalidate(q_ready.index(b))
        mbarrier.invalidate(q_empty.index(b))
        mbarrier.invalidate(turn.index(b))
    _invalidate_ring(k_ready, v_ready, k_empty, v_empty, STAGES)
    if SCORE_MOD == BIAS_TMA:
        invalidate_bias_slots(bias_load, CONSUMERS)


# attn_fwd's contract: its parameters (the spec checks the function against them) and constexprs.
ATTN_FWD_SM90 = KernelSpec(attn_fwd_sm90, ATTN_FWD.items, loops_over_tiles=True)
assert ATTN_FWD_SM90.constexprs == ATTN_FWD.constexprs, "attn_fwd_sm90 must take attn_fwd's constexprs"
