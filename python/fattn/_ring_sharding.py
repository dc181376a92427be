"""How ring attention lays a sequence out over the ranks: which chunks of it each rank holds
(python/fattn/ring.py's docstring describes the two shardings), and the conversions between a full
sequence and its shards."""

from __future__ import annotations

import torch

SHARDINGS = ("zigzag", "contiguous")


def chunks_of_rank(rank: int, world: int, sharding: str) -> tuple[int, int]:
    """The two of the sequence's 2 * world chunks that `rank` holds, in the order it holds them."""
    if sharding == "zigzag":
        return rank, 2 * world - 1 - rank
    return 2 * rank, 2 * rank + 1


def check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"fattn.ring: sharding must be one of {SHARDINGS}, got {sharding!r}")


def check_world(fn: str, world) -> None:
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"{fn}: world must be an int >= 1, got {world!r}")


def shard(x: torch.Tensor, world: int, rank: int, sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The shard of the full sequence `x` (sequence along `dim`) that `rank` holds: zigzag needs
    the length divisible by 2 * world, contiguous by world."""
    check_sharding(sharding)
    check_world("fattn.ring.shard", world)
    if not 0 <= rank < world:
        raise ValueError(f"fattn.ring.shard: rank {rank} is not in [0, world = {world})")
    # A zigzag shard is two equal chunks; a contiguous one is one run, of any length.
    parts, name = (2 * world, "2 * world") if sharding == "zigzag" else (world, "world")
    if x.shape[dim] % parts:
        raise ValueError(f"fattn.ring.shard: sequence length {x.shape[dim]} is not divisible by {name} = {parts}")
    if sharding == "contiguous":
        return x.chunk(world, dim=dim)[rank]
    chunks = x.chunk(2 * world, dim=dim)
    a, b = chunks_of_rank(rank, world, sharding)
    return torch.cat([chunks[a], chunks[b]], dim=dim)


def unshard(shards: list[torch.Tensor], sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The full sequence from the shards of every rank, in rank order."""
    check_sharding(sharding)
    world = len(shards)
    if sharding == "contiguous":
        return torch.cat(shards, dim=dim)
    chunks: list[torch.Tensor | None] = [None] * (2 * world)
    for rank, s in enumerate(shards):
        first, second = s.chunk(2, dim=dim)
        a, b = chunks_of_rank(rank, world, sharding)
        chunks[a], chunks[b] = first, second
    return torch.cat(chunks, dim=dim)


def runs_of_rank(rank: int, world: int, local_len: int, sharding: str) -> list[tuple[int, int]]:
    """(first global position, first local row) of each run of consecutive positions a shard
    holds, every run `local_len // len(runs)` rows: a zigzag shard's two chunks, or a contiguous
    shard whole (whatever its length, odd ones too)."""
    if sharding == "contiguous":
        return [(rank * local_len, 0)]
    size = local_len // 2
    return [(chunk * size, half * size) for half, chunk in enumerate(chunks_of_rank(rank, world, sharding))]
