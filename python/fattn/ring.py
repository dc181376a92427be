"""Ring attention: exact attention over a sequence sharded across the ranks of a group.

Each rank holds a shard of q, k and v ([batch, seqlen / world, heads, head_dim]). K/V
blocks travel around the ring with torch.distributed point-to-point ops, posted before
each step's kernel so the transfer hides behind it; a hop carries the rows of the block that
the ranks still ahead of it use (all of them but under a window). Each step's partial (out, lse)
merges into an fp32 accumulator through fattn.merge_attention_states. The backward
runs a second ring: dK/dV accumulators travel with their K/V block and arrive home
after `world` steps, dQ accumulates locally in fp32, and every block's gradient is
computed against the global out/lse.

Sharding, for causal attention of a sequence cut into 2 * world chunks:
- "zigzag": rank r holds chunks r and 2*world-1-r, so every rank does the same work;
- "contiguous": rank r holds chunks 2r and 2r+1 (plain contiguous sharding).
`shard` / `unshard` convert between a full sequence and the shards of either layout.

`ring_flash_attn_varlen_func` runs the same ring over packed documents, each document zigzag-
sharded on its own (python/fattn/_cp_sharding.py; fattn.shard_varlen and unshard_varlen convert).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._arguments import real, window_pair
from ._checks import check_alibi_slopes, check_sinks, check_softcap, lse_dtype
from ._ring_exchange import Block
from ._ring_op import ring_forward
from ._ring_passes import Accumulator, forward_step
from ._ring_schedule import blocks_at, plan, ring_schedule
from ._ring_sharding import SHARDINGS, check_sharding, check_world, shard, unshard
from ._cp_sharding import offsets, shard_varlen, unshard_varlen, varlen_shard_layout
from ._ring_varlen_op import group_name, ring_varlen_forward

__all__ = ["SHARDINGS", "ring_flash_attn_func", "ring_flash_attn_varlen_func", "ring_schedule", "shard",
           "shard_varlen", "simulate", "unshard", "unshard_varlen", "varlen_shard_layout"]

def _check_inputs(q, k, v, group, sharding, softcap, sinks, alibi_slopes):
    """The checks a traced call can make; the ranks' agreement runs inside the op (_ring_op.py)."""
    check_sharding(sharding)
    if not torch.compiler.is_compiling():  # traced, it can be symbolic: the op checks it when it runs
        check_softcap("fattn.ring_flash_attn_func", softcap)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fattn.ring_flash_attn_func: {name} must be [batch, seqlen/world, heads, head_dim], "
                             f"got shape {list(t.shape)}")
    check_sinks("fattn.ring_flash_attn_func", sinks, q, q.shape[2])
    check_alibi_slopes("fattn.ring_flash_attn_func", alibi_slopes, q, q.shape[0], q.shape[2])
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"fattn.ring_flash_attn_func: q, k and v shards must have one length, got "
                         f"{q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    world = dist.get_world_size(group)
    if sharding == "zigzag" and q.shape[1] % 2:
        raise ValueError(f"fattn.ring_flash_attn_func: zigzag shards hold two equal chunks, so the local "
                         f"length must be even (the sequence divisible by 2 * world = {2 * world}); "
                         f"got {q.shape[1]}")


def ring_flash_attn_func(q, k, v, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                         deterministic=False, return_lse=False, sharding="zigzag", *, softcap=0.0, sinks=None,
                         alibi_slopes=None):
    """Attention of this rank's q shard over the whole sequence held by `group`.

    q, k, v: this rank's shard, [batch, seqlen / world, heads, head_dim] (GQA allowed),
    laid out by `sharding` ("zigzag" or "contiguous"; see `shard`). Returns this rank's
    out shard (and its lse, float32 [batch, heads, seqlen / world], differentiable).
    window_size, softcap and alibi_slopes (float32 [heads] or [batch, heads]) mean what they mean
    in flash_attn_func, over the global positions (the window crosses shards, ALiBi's distances
    are between global positions); so do sinks (float32 [heads], counted once per row; the
    gradient reaching them is this rank's rows' share). With ALiBi over zigzag shards each step
    runs one kernel call per pair of chunks that meet (up to four per block instead of one or
    two). A window that
    spans fewer ranks than the group shortens the ring (`ring_schedule`): K/V blocks travel only
    as far as some rank's queries see them, both ways when the window reaches ranks on both
    sides (zigzag shards, two-sided windows). Works with NCCL (one process per GPU, e.g. under
    torchrun) and gloo (CPU tensors); torch.compile sees one call (python/fattn/_ring_op.py).
    """
    fn = "ring_flash_attn_func"
    left, right = window_pair(fn, window_size)
    softcap = real(fn, "softcap", softcap)
    _check_inputs(q, k, v, group, sharding, softcap, sinks, alibi_slopes)
    out, lse = ring_forward(q, k, v, sinks, alibi_slopes, group_name(group), bool(causal), left, right,
                            softmax_scale, softcap, sharding, bool(deterministic))
    return (out, lse) if return_lse else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen=None, group=None, causal=False, softmax_scale=None,
                                window_size=(-1, -1), deterministic=False, return_lse=False, *, softcap=0.0,
                                sinks=None, alibi_slopes=None):
    """Attention of this rank's rows of a packed batch over the whole batch held by `group`.

    q, k, v: this rank's shard [local_total, heads, head_dim] (GQA allowed) of the packed batch
    whose documents the global `cu_seqlens` cuts (an int tensor, or a list, starting at 0), laid
    out as fattn.shard_varlen lays it out (every document zigzag-split over the ranks). The ring
    reads the offsets on the host, since the shapes of what travels depend on them: a CPU tensor
    spares a CUDA sync, and under torch.compile a tensor keeps one graph for every batch (a list's
    values are constants of the graph). max_seqlen is taken for the varlen functions' signature
    and not needed. Returns this rank's out rows (and lse, [heads, local_total], differentiable).
    Documents attend only to themselves; causal, window_size, softcap, alibi_slopes ([heads] or
    [documents, heads]) and sinks mean what they mean in flash_attn_varlen_func, over each
    document's own positions. K/V blocks carry only the rows that the ranks still ahead of them
    use, and travel only as far as some rank's rows see them. Works with NCCL and gloo, as
    ring_flash_attn_func; torch.compile sees one call (python/fattn/_ring_varlen_op.py).
    """
    fn = "ring_flash_attn_varlen_func"
    left, right = window_pair(fn, window_size)
    softcap = real(fn, "softcap", softcap)
    if not torch.compiler.is_compiling():  # traced, it can be symbolic: the op checks it when it runs
        check_softcap(f"fattn.{fn}", softcap)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"fattn.{fn}: {name} must be [local_total, heads, head_dim], got shape {list(t.shape)}")
    if not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.tensor(offsets(fn, cu_seqlens), dtype=torch.int64)
    elif cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
        raise ValueError(f"fattn.{fn}: cu_seqlens must be a 1-D integer tensor, got {cu_seqlens.dtype} of shape "
                         f"{list(cu_seqlens.shape)}")
    check_sinks(f"fattn.{fn}", sinks, q, q.shape[1])
    check_alibi_slopes(f"fattn.{fn}", alibi_slopes, q, cu_seqlens.shape[0] - 1, q.shape[1])
    out, lse = ring_varlen_forward(q, k, v, cu_seqlens, sinks, alibi_slopes, group_name(group), bool(causal), left,
                                   right, softmax_scale, softcap, bool(deterministic))
    return (out, lse) if return_lse else out


def simulate(q, k, v, world: int, causal=False, softmax_scale=None, sharding="zigzag", return_lse=False, *,
             window_size=(-1, -1), softcap=0.0, sinks=None, alibi_slopes=None):
    """The forward ring schedule for `world` virtual ranks, run in one process on one device.

    Takes the full sequences, shards them, runs every rank's steps in ring order (the
    block a rank sees at step i is the one rank - i started with) and returns the
    unsharded result: a way to study the schedule without a process group.
    """
    check_sharding(sharding)
    check_world("fattn.ring.simulate", world)
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"fattn.ring.simulate: k and v must have q's sequence length {q.shape[1]} (every rank "
                         f"holds matching q and k/v shards), got {k.shape[1]} and {v.shape[1]}")
    qs, ks, vs = ([shard(t, world, r, sharding) for r in range(world)] for t in (q, k, v))
    accs = [Accumulator(qs[r], sinks) for r in range(world)]
    behind, ahead = ring_schedule(world, qs[0].shape[1], causal, sharding, window_size)
    for step in range(max(behind, ahead) + 1):
        for r in range(world):
            for source, _, _ in blocks_at(step, r, world, behind, ahead, None, None, None):
                pieces = plan(r, source, world, qs[r].shape[1], causal, sharding, tuple(window_size),
                               alibi_slopes is not None)
                forward_step(accs[r], qs[r], Block(ks[source], vs[source]), pieces, softmax_scale, softcap,
                              alibi_slopes)
    out = unshard([a.out.to(q.dtype) for a in accs], sharding)
    lse = unshard([a.lse for a in accs], sharding, dim=2)
    return (out, lse.to(lse_dtype(q.dtype))) if return_lse else out
