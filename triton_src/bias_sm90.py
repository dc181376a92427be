"""A bias read by TMA, for the Hopper (Gluon) kernels whose consumer warpgroups own query rows
(the forward and the dQ kernel; SCORE_MOD bias_tma, triton_src/variants.py, whose arguments
bias_tma_args gathers): the
producer loads each visited key tile's bias rows of each consumer, [WG_M, BLOCK_N], into that
consumer's one slot, and the consumer adds them to its scores and releases the slot. TMA
zero-fills past the sequence's ends, as score_mods.bias_log2's masked loads do; the op sends a bias
TMA cannot read (broadcast over the queries, rows not a multiple of 16 bytes) to bias_dropout.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .constants import LOG2E


@gluon.jit
def bias_slots(bias_base, stride_biasq, use_bias, seqlen_q, seqlen_k, dtype: gl.constexpr, CONSUMERS: gl.constexpr,
               WG_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The producer's side, (descriptor, slots, ready, empty, use_bias) for load_bias: a descriptor
    over the (batch, head)'s [seqlen_q, seqlen_k] bias (bias_base its first row), one shared
    [WG_M, BLOCK_N] slot per consumer and its barriers. The consumers take theirs with
    consumer_slot."""
    layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    desc = tma.make_tensor_descriptor(bias_base, [seqlen_q, seqlen_k], [stride_biasq, 1], [WG_M, BLOCK_N], layout)
    smem = gl.allocate_shared_memory(dtype, [CONSUMERS, WG_M, BLOCK_N], layout)
    ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(CONSUMERS):
        mbarrier.init(ready.index(b), count=1)
        mbarrier.init(empty.index(b), count=1)
    return desc, smem, ready, empty, use_bias


@gluon.jit
def consumer_slot(slots, wg: gl.constexpr):
    """Consumer wg's part of bias_slots' (slot, ready, empty, use_bias), for add_bias."""
    _, smem, ready, empty, use_bias = slots
    return smem.index(wg), ready.index(wg), empty.index(wg), use_bias


@gluon.jit
def invalidate_bias_slots(slots, CONSUMERS: gl.constexpr):
    _, _, ready, empty, _ = slots
    for b in gl.static_range(CONSUMERS):
        mbarrier.invalidate(ready.index(b))
        mbarrier.invalidate(empty.index(b))


@gluon.jit
def load_bias(slots, it, start_m, start_n, CONSUMERS: gl.constexpr, WG_M: gl.constexpr):
    """The producer's load of the `it`-th visited key tile's bias (keys from start_n) for the
    query tile at start_m: each consumer's rows into its slot, once it has released the last
    tile's. Nothing without a bias."""
    desc, smem, ready, empty, use_bias = slots
    if use_bias != 0:
        for wg in gl.static_range(CONSUMERS):
            mbarrier.wait(empty.index(wg), (it & 1) ^ 1)  # a fresh barrier passes parity 1
            mbarrier.expect(ready.index(wg), desc.block_type.nbytes)
            tma.async_copy_global_to_shared(desc, [start_m + wg * WG_M, start_n], ready.index(wg), smem.index(wg))


@gluon.jit
def add_bias(s, slot, it):
    """The log2-domain scores s of the `it`-th visited key tile plus its bias (natural-log units
    in the slot; consumer_slot's), the slot then released to the producer; s without a bias."""
    smem, ready, empty, use_bias = slot
    if use_bias != 0:
        mbarrier.wait(ready, it & 1)
        s = s + smem.load(s.type.layout).to(gl.float32) * LOG2E
        mbarrier.arrive(empty, count=1)
    return s


@gluon.jit
def bias_tma_args(Bias, stride_biasb, stride_biash, stride_biasq, use_bias, DropoutSeed, dropout_threshold,
                    dropout_scale, batch, head, seqlen_q, seqlen_k, dtype: gl.constexpr, CONSUMERS: gl.constexpr,
                    WG_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """BIAS_TMA's partition arguments from the kernel's (attn_fwd's contract): the producer's
    bias_slots, then for each of up to three consumers its bias slot and the dropout's seed, batch,
    head, threshold and scale (an empty tuple for a third of two). The bias is the (batch, head)'s
    [seqlen_q, seqlen_k] rows, as attn_fwd reads it."""
    seed = gl.load(DropoutSeed, mask=dropout_threshold > 0, other=0)
    slots = bias_slots(Bias + batch * stride_biasb + head.to(gl.int64) * stride_biash, stride_biasq, use_bias,
                       seqlen_q, seqlen_k, dtype, CONSUMERS, WG_M, BLOCK_N)
    mods_0 = (consumer_slot(slots, 0), seed, batch, head, dropout_threshold, dropout_scale)
    mods_1 = (consumer_slot(slots, 1), seed, batch, head, dropout_threshold, dropout_scale)
    mods_2 = ()
    if CONSUMERS == 3:
        mods_2 = (consumer_slot(slots, 2), seed, batch, head, dropout_threshold, dropout_scale)
    return slots, mods_0, mods_1, mods_2
