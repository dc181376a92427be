"""Head-parallel context parallelism (DeepSpeed-Ulysses): an all-to-all turns each rank's
sequence shard of every head into the whole sequence of its share of the heads, the local
kernel runs over the whole sequence, and a second all-to-all turns the result back.

Rank r gets query heads [r * heads / world, (r + 1) * heads / world) and the KV heads they read.
With fewer KV heads than ranks (or any count that does not split evenly over the ranks), KV
heads are replicated before the exchange so that each rank receives exactly its query heads'
KV heads; their gradients sum back through the replication.

Shards use the ring's layouts (fattn.ring.shard for dense shards, fattn.shard_varlen for packed
batches), so one model can switch between the ring and the all-to-all without moving data. The
exchange is differentiable: dist.all_to_all_single in eager mode, and under torch.compile the
functional all_to_all_single_autograd, which the compiler traces as a collective (no graph break).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as collectives

from ._checks import check_alibi_slopes, check_sinks
from ._cp_sharding import offsets, packed_layout
from ._ring_sharding import check_sharding, chunks_of_rank
from .attention import flash_attn_func
from .ring import ring_flash_attn_func, ring_flash_attn_varlen_func
from .varlen import flash_attn_varlen_func

__all__ = ["kv_heads_of_ranks", "ulysses_flash_attn_func", "ulysses_flash_attn_varlen_func"]


def kv_heads_of_ranks(heads: int, kv_heads: int, world: int) -> list[list[int]]:
    """The KV heads each rank receives, in the order its local kernel reads them. Query head i
    reads KV head i // (heads / kv_heads); rank r's query heads, taken `g` at a time with g the
    largest group that never straddles two KV heads (gcd of the GQA group and the rank's head
    count), each read one KV head. KV heads split evenly when world divides kv_heads; with fewer
    KV heads than ranks each rank gets one, shared (replicated) with its neighbours."""
    if heads % world:
        raise ValueError(f"fattn.ulysses: the {heads} query heads do not split over {world} ranks; the "
                         f"all-to-all gives each rank heads / world of them (use the ring, or a world that "
                         f"divides the heads)")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"fattn.ulysses: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    per_rank, group = heads // world, heads // kv_heads
    step = math.gcd(group, per_rank)
    return [[(r * per_rank + a * step) // group for a in range(per_rank // step)] for r in range(world)]


class _AllToAll(torch.autograd.Function):
    """Eager all-to-all along dim 0 and its transpose for the backward. Eager calls take this
    rather than the functional collective, whose first call imports torch._dynamo (seconds)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits = (out_splits, in_splits, group)
        y = x.new_empty((x.shape[0] if out_splits is None else sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(y, x, out_splits, in_splits, group=group)
        return y

    @staticmethod
    def backward(ctx, dy):
        out_splits, in_splits, group = ctx.splits
        return _AllToAll.apply(dy.contiguous(), in_splits, out_splits, group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits, in_splits, group) -> torch.Tensor:
    """Differentiable all-to-all along dim 0 (None splits: equal). Under torch.compile, the
    functional collective, which the compiler traces into the graph as a collective."""
    if dist.get_world_size(group) == 1:
        return x
    if not torch.compiler.is_compiling():
        return _AllToAll.apply(x.contiguous(), out_splits, in_splits, group)
    group = dist.group.WORLD if group is None else group  # the functional collectives want it named
    y = collectives.all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group)
    return collectives.wait_tensor(y) if isinstance(y, collectives.AsyncCollectiveTensor) else y


def _to_head_shards(x: torch.Tensor, world: int, group, in_rows: int, out_rows) -> torch.Tensor:
    """[rows, ..., heads, d] sequence-major, this rank's rows of every head -> [every rank's rows
    one after another, ..., heads / world, d] of this rank's heads."""
    rows, heads = x.shape[0], x.shape[-2]
    split = x.reshape(*x.shape[:-2], world, heads // world, x.shape[-1]).movedim(-3, 0)
    return _all_to_all(split.reshape(world * rows, *split.shape[2:]), out_rows, None if out_rows is None
                       else [in_rows] * world, group)


def _to_sequence_shards(y: torch.Tensor, world: int, group, local_rows: int, in_rows) -> torch.Tensor:
    """_to_head_shards' inverse: [every rank's rows, ..., heads / world, d] -> [local rows, ...,
    heads, d]."""
    x = _all_to_all(y, None if in_rows is None else [local_rows] * world, in_rows, group)
    x = x.reshape(world, local_rows, *x.shape[1:]).movedim(0, -3)
    return x.reshape(*x.shape[:-3], x.shape[-3] * x.shape[-2], x.shape[-1])


def _constant(kind: str, *args, device: torch.device) -> torch.Tensor:
    """The index (int64) or offsets (int32) tensor of `kind` for `args`, made once per device and
    never written: a call that a CUDA graph captures finds it made (a host-to-device copy cannot
    be captured), and the next step reuses it. Traced, a constant of the graph."""
    if torch.compiler.is_compiling():
        return _make(kind, args, device)
    return _made(kind, args, device)


def _make(kind: str, args: tuple, device: torch.device) -> torch.Tensor:
    return torch.tensor(_VALUES[kind](*args), dtype=torch.int32 if kind == "offsets" else torch.int64, device=device)


# A few entries: every constant of a captured step (three per call) and a few more; packed batches change
# every step in training, and each entry holds a row index of the whole batch on the device.
_made = functools.lru_cache(maxsize=8)(_make)


def _kv_for_exchange(k, v, heads, world):
    """k and v with their KV heads in the order the ranks receive them (replicated where ranks
    share one)."""
    wanted = [h for rank in kv_heads_of_ranks(heads, k.shape[-2], world) for h in rank]
    if wanted == list(range(k.shape[-2])):
        return k, v
    index = _constant("kv heads", tuple(wanted), device=k.device)
    return k.index_select(-2, index), v.index_select(-2, index)


def _head_slice(t, rank, world, heads):
    """This rank's heads of a per-head argument (sinks [heads], slopes [heads] or [batch, heads])."""
    if t is None:
        return None
    per_rank = heads // world
    return t[..., rank * per_rank:(rank + 1) * per_rank]


def _group_shape(group):
    return dist.get_world_size(group), dist.get_rank(group)


def _take(t, index):
    """Rows `index` of t along dim 0 (None: all, in order)."""
    return t if index is None else t.index_select(0, index)


def ulysses_flash_attn_func(q, k, v, group=None, causal=False, softmax_scale=None, window_size=(-1, -1),
                            deterministic=False, return_lse=False, sharding="zigzag", *, softcap=0.0, sinks=None,
                            alibi_slopes=None, ring_group=None):
    """ring_flash_attn_func's contract through two all-to-alls: q, k, v are this rank's shard
    [batch, seqlen / world, heads, head_dim] (GQA allowed) laid out by `sharding` ("zigzag" or
    "contiguous", fattn.ring.shard); returns this rank's out shard (and lse, [batch, heads,
    seqlen / world]). heads must be a multiple of the world; kv_heads need not be (see
    kv_heads_of_ranks). window_size, softcap, alibi_slopes and sinks as in flash_attn_func over
    the global positions; the sinks' gradient is this rank's heads' (sum it over the ranks, as
    for any replicated parameter).

    ring_group: the product of both schemes. The sequence is sharded over ring_group (`sharding`)
    and each ring shard split over `group` (torch.tensor_split along the sequence, rank order):
    the all-to-all gathers the ring shard of heads / world heads, which ring_flash_attn_func runs
    over ring_group. Each rank is in one `group` and one ring_group."""
    fn = "ulysses_flash_attn_func"
    check_sharding(sharding)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"fattn.{fn}: q, k, v must be [batch, seqlen/world, heads, head_dim], "
                         f"got shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    world, rank = _group_shape(group)
    heads, local_len = q.shape[2], q.shape[1]
    kv_heads_of_ranks(heads, k.shape[2], world)  # the heads' checks
    check_sinks(f"fattn.{fn}", sinks, q, heads)
    check_alibi_slopes(f"fattn.{fn}", alibi_slopes, q, q.shape[0], heads)
    if ring_group is None and sharding == "zigzag" and local_len % 2:
        raise ValueError(f"fattn.{fn}: zigzag shards hold two equal chunks, so the local length must be even, "
                         f"got {local_len}")
    k, v = _kv_for_exchange(k, v, heads, world)
    # Sequence-major, so that the exchange splits and joins along dim 0.
    q_h, k_h, v_h = (_to_head_shards(t.transpose(0, 1), world, group, local_len, None) for t in (q, k, v))
    # The gathered rows are the shards in rank order: the sequence (reordered) or the ring shard (as is).
    order = None if ring_group is not None else _constant("dense rows", world, local_len, sharding, device=q.device)
    to_sequence = None if order is None else torch.argsort(order)
    q_h, k_h, v_h = (_take(t, to_sequence).transpose(0, 1) for t in (q_h, k_h, v_h))
    mine = dict(softcap=softcap, sinks=_head_slice(sinks, rank, world, heads),
                alibi_slopes=_head_slice(alibi_slopes, rank, world, heads))
    if ring_group is None:
        out, lse = flash_attn_func(q_h, k_h, v_h, 0.0, softmax_scale, causal, window_size, deterministic=deterministic,
                                   return_lse=True, **mine)
    else:
        out, lse = ring_flash_attn_func(q_h, k_h, v_h, ring_group, causal, softmax_scale, window_size, deterministic,
                                        True, sharding, **mine)
    out = _to_sequence_shards(_take(out.transpose(0, 1), order), world, group, local_len, None)
    out = out.transpose(0, 1)
    if not return_lse:
        return out
    # lse [batch, heads / world, seqlen] travels as [seqlen, batch, heads / world, 1].
    lse = _take(lse.permute(2, 0, 1), order).unsqueeze(-1)
    lse = _to_sequence_shards(lse, world, group, local_len, None).squeeze(-1).permute(1, 2, 0)
    return out, lse


def _packed_rows(cu: tuple[int, ...], world: int) -> list[int]:
    """The batch row of each row of the packed shards of every rank, one after another."""
    layout = packed_layout(cu, world)
    return [row for r in range(world) for row in layout.rows(r)]


def _dense_rows(world: int, local_len: int, sharding: str) -> list[int]:
    """The sequence position of each row of the shards of every rank, one after another."""
    if sharding == "contiguous":
        return list(range(world * local_len))
    half = local_len // 2
    return [chunk * half + i for rank in range(world) for chunk in chunks_of_rank(rank, world, sharding)
            for i in range(half)]


def ulysses_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen=None, group=None, causal=False,
                                   softmax_scale=None, window_size=(-1, -1), deterministic=False, return_lse=False,
                                   *, softcap=0.0, sinks=None, alibi_slopes=None, ring_group=None):
    """Packed documents through two all-to-alls: q, k, v are this rank's shard [local_total,
    heads, head_dim] of the packed batch cut by the global `cu_seqlens` (laid out as
    fattn.shard_varlen lays it out; cu_seqlens is read on the host: pass a CPU tensor or a list to
    spare a CUDA sync). max_seqlen: the longest document (computed from cu_seqlens if None).
    Returns this rank's out rows (and lse, [heads, local_total]). alibi_slopes: [heads] or
    [documents, heads]. Otherwise as ulysses_flash_attn_func; with ring_group, the packed batch is
    sharded over ring_group (fattn.shard_varlen) and each ring shard split over `group`
    (torch.tensor_split, rank order), and ring_flash_attn_varlen_func runs over ring_group."""
    fn = "ulysses_flash_attn_varlen_func"
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"fattn.{fn}: q, k, v must be [local_total, heads, head_dim], got shapes "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    world, rank = _group_shape(group)
    cu = offsets(fn, cu_seqlens)
    if ring_group is None:
        layout = packed_layout(cu, world)
        rows_of = [layout.local_total(r) for r in range(world)]
    else:  # this group's ring shard, split as torch.tensor_split splits it
        ring_rows = packed_layout(cu, dist.get_world_size(ring_group)).local_total(dist.get_rank(ring_group))
        rows_of = [ring_rows // world + (r < ring_rows % world) for r in range(world)]
    heads, local_rows = q.shape[1], q.shape[0]
    if local_rows != rows_of[rank] or k.shape[0] != local_rows or v.shape[0] != local_rows:
        raise ValueError(f"fattn.{fn}: rank {rank}'s part of the batch is {rows_of[rank]} rows "
                         f"(fattn.varlen_shard_layout); got q, k, v of {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    kv_heads_of_ranks(heads, k.shape[1], world)
    check_sinks(f"fattn.{fn}", sinks, q, heads)
    check_alibi_slopes(f"fattn.{fn}", alibi_slopes, q, len(cu) - 1, heads)
    k, v = _kv_for_exchange(k, v, heads, world)
    # The gathered rows are the shards in rank order: the batch (reordered) or the ring shard (as is).
    order = None if ring_group is not None else _constant("packed rows", cu, world, device=q.device)
    to_sequence = None if order is None else torch.argsort(order)
    q_h, k_h, v_h = (_take(_to_head_shards(t, world, group, local_rows, rows_of), to_sequence) for t in (q, k, v))
    mine = dict(softcap=softcap, sinks=_head_slice(sinks, rank, world, heads),
                alibi_slopes=_head_slice(alibi_slopes, rank, world, heads))
    if ring_group is None:
        cu_tensor = _constant("offsets", cu, device=q.device)
        # A list, not max(..., default=): torch.compile (torch 2.11) cannot trace the keyword
        longest = max([b - a for a, b in zip(cu, cu[1:])] or [0]) if max_seqlen is None else max_seqlen
        out, lse = flash_attn_varlen_func(q_h, k_h, v_h, cu_tensor, cu_tensor, longest, longest, 0.0, softmax_scale,
                                          causal, window_size, deterministic=deterministic, return_lse=True, **mine)
    else:
        out, lse = ring_flash_attn_varlen_func(q_h, k_h, v_h, cu_seqlens, None, ring_group, causal, softmax_scale,
                                               window_size, deterministic, True, **mine)
    out = _to_sequence_shards(_take(out, order), world, group, local_rows, rows_of)
    if not return_lse:
        return out
    lse = _take(lse.transpose(0, 1), order).unsqueeze(-1)  # [rows, heads / world, 1]
    lse = _to_sequence_shards(lse, world, group, local_rows, rows_of).squeeze(-1).transpose(0, 1)
    return out, lse


_VALUES = {"kv heads": list, "dense rows": _dense_rows, "packed rows": _packed_rows, "offsets": list}
