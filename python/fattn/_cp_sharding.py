"""How context parallelism lays a packed batch out over the ranks of a group.

A packed batch is flash-attn's varlen layout: documents back to back, document d at rows
[cu_seqlens[d], cu_seqlens[d + 1]). Every document is cut into 2 * world chunks of consecutive
positions and rank r holds chunks r and 2 * world - 1 - r of each (zigzag, as TransformerEngine
shards THD batches), so that under causal attention every rank has the same work in every
document. A rank's shard is again a packed batch: its part of document d (chunk r, then chunk
2 * world - 1 - r) at rows [local_cu[d], local_cu[d + 1]).

No padding: a document of length L has chunks of L // (2 * world) rows, and its L % (2 * world)
remaining rows go one each to the ranks in turn, counting on from where the previous document's
left off (first chunks first; past `world` of them, second chunks), so over the batch every
rank holds the same number of rows give or take one. A document shorter than 2 * world leaves
some chunks empty; an empty document is empty everywhere.

Every rank evaluates the layout of every rank from the global cu_seqlens alone (arithmetic on the
host), so shapes agree without communicating.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ._ring_sharding import check_world


class Run(NamedTuple):
    """A chunk a rank holds: consecutive positions of one document."""
    doc: int
    position: int  # of its first row, counted from the document's start
    row: int  # local row of its first row
    length: int


class PackedLayout:
    """Where every rank's rows of a packed batch come from (see the module's docstring)."""

    def __init__(self, cu_seqlens: tuple[int, ...], world: int):
        self.cu_seqlens, self.world = cu_seqlens, world
        self.bounds = []  # per document: the 2 * world + 1 positions that cut it into chunks
        handed_out = 0  # remainder rows given out so far, over the batch
        for start, end in zip(cu_seqlens, cu_seqlens[1:]):
            length = end - start
            sizes = [length // (2 * world)] * (2 * world)
            for k in range(length % (2 * world)):
                rank = (handed_out + k) % world
                sizes[rank if k < world else 2 * world - 1 - rank] += 1
            handed_out += length % (2 * world)
            bounds = [0]
            for size in sizes:
                bounds.append(bounds[-1] + size)
            self.bounds.append(tuple(bounds))
        self._runs = [self._runs_of(rank) for rank in range(world)]

    @property
    def docs(self) -> int:
        return len(self.bounds)

    def _runs_of(self, rank: int) -> list[tuple[Run, Run]]:
        runs, row = [], 0
        for doc, bounds in enumerate(self.bounds):
            pair = []
            for chunk in (rank, 2 * self.world - 1 - rank):
                pair.append(Run(doc, bounds[chunk], row, bounds[chunk + 1] - bounds[chunk]))
                row += pair[-1].length
            runs.append(tuple(pair))
        return runs

    def runs(self, rank: int) -> list[tuple[Run, Run]]:
        """Per document, the two chunks `rank` holds, in the order it holds them."""
        return self._runs[rank]

    def local_cu_seqlens(self, rank: int) -> list[int]:
        cu = [0]
        for first, second in self._runs[rank]:
            cu.append(cu[-1] + first.length + second.length)
        return cu

    def local_total(self, rank: int) -> int:
        return self.local_cu_seqlens(rank)[-1]

    def positions(self, rank: int) -> list[int]:
        """The position in its document of every local row of `rank`."""
        return [run.position + i for pair in self._runs[rank] for run in pair for i in range(run.length)]

    def rows(self, rank: int) -> list[int]:
        """The global packed row of every local row of `rank`."""
        return [self.cu_seqlens[run.doc] + run.position + i
                for pair in self._runs[rank] for run in pair for i in range(run.length)]


def offsets(fn: str, cu_seqlens) -> tuple[int, ...]:
    """cu_seqlens as a tuple of ints, read on the host (a CUDA tensor syncs the stream once):
    starting at 0 and non-decreasing."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
            raise ValueError(f"fattn.{fn}: cu_seqlens must be a 1-D integer tensor, got {cu_seqlens.dtype} "
                             f"of shape {list(cu_seqlens.shape)}")
        cu_seqlens = cu_seqlens.tolist()
    cu = tuple(int(x) for x in cu_seqlens)
    if len(cu) < 1 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"fattn.{fn}: cu_seqlens must start at 0 and never decrease, got {list(cu)}")
    return cu


def packed_layout(cu_seqlens: tuple[int, ...], world: int) -> PackedLayout:
    """The layout of one batch (cached: every ring call of a training step asks again; traced by
    torch.compile, made afresh, since dynamo ignores a cache and warns that it does)."""
    if torch.compiler.is_compiling():
        return PackedLayout(cu_seqlens, world)
    return _cached_layout(cu_seqlens, world)


_cached_layout = functools.lru_cache(maxsize=32)(PackedLayout)


def _layout(fn: str, cu_seqlens, world: int, rank: int | None = None) -> PackedLayout:
    check_world(f"fattn.{fn}", world)
    if rank is not None and not 0 <= rank < world:
        raise ValueError(f"fattn.{fn}: rank {rank} is not in [0, world = {world})")
    return packed_layout(offsets(fn, cu_seqlens), world)


class VarlenShard(NamedTuple):
    """What one rank holds of a packed batch (varlen_shard_layout)."""
    cu_seqlens: torch.Tensor  # int32 [docs + 1]: the rank's part of document d at rows [cu[d], cu[d + 1])
    max_seqlen: int  # the longest of those parts
    rows: torch.Tensor  # int64 [local_total]: the global packed row of each local row
    positions: torch.Tensor  # int64 [local_total]: each local row's position in its document (for RoPE)


def varlen_shard_layout(cu_seqlens, world: int, rank: int) -> VarlenShard:
    """The shard `rank` of `world` holds of the packed batch cut by `cu_seqlens` (int tensor or
    list of document offsets, starting at 0): its local cu_seqlens and max_seqlen, and the
    global row and the position in its document of each local row. Tensors on cu_seqlens'
    device (CPU for a list)."""
    layout = _layout("varlen_shard_layout", cu_seqlens, world, rank)
    device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else "cpu"
    local_cu = layout.local_cu_seqlens(rank)
    longest = max((b - a for a, b in zip(local_cu, local_cu[1:])), default=0)
    return VarlenShard(torch.tensor(local_cu, dtype=torch.int32, device=device), longest,
                       torch.tensor(layout.rows(rank), dtype=torch.int64, device=device),
                       torch.tensor(layout.positions(rank), dtype=torch.int64, device=device))


def shard_varlen(x: torch.Tensor, cu_seqlens, world: int, rank: int, dim: int = 0) -> torch.Tensor:
    """The rows of the packed tensor `x` (packed rows along `dim`: 0 for q, k, v [total, heads,
    head_dim], 1 for lse [heads, total]) that `rank` holds, in its local order. Rows past
    cu_seqlens[-1] belong to no document and to no shard."""
    layout = _layout("shard_varlen", cu_seqlens, world, rank)
    if x.shape[dim] < layout.cu_seqlens[-1]:
        raise ValueError(f"fattn.shard_varlen: x has {x.shape[dim]} rows along dim {dim} but cu_seqlens ends at "
                         f"{layout.cu_seqlens[-1]}")
    return x.index_select(dim, torch.tensor(layout.rows(rank), dtype=torch.int64, device=x.device))


def unshard_varlen(shards: list[torch.Tensor], cu_seqlens, dim: int = 0) -> torch.Tensor:
    """The packed tensor (cu_seqlens[-1] rows along `dim`) from every rank's shard, in rank order:
    shard_varlen's inverse."""
    world = len(shards)
    layout = _layout("unshard_varlen", cu_seqlens, world)
    for rank, s in enumerate(shards):
        if s.shape[dim] != layout.local_total(rank):
            raise ValueError(f"fattn.unshard_varlen: rank {rank}'s shard has {s.shape[dim]} rows along dim {dim}; "
                             f"its part of the batch is {layout.local_total(rank)}")
    stacked = torch.cat(list(shards), dim=dim)
    rows = torch.tensor([r for rank in range(world) for r in layout.rows(rank)], dtype=torch.int64,
                        device=stacked.device)
    # Row rows[i] of the batch is row i of the stacked shards; argsort inverts the permutation.
    return stacked.index_select(dim, torch.argsort(rows))
