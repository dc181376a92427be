"""What travels around the ring: rows of K/V blocks (and their dK/dV accumulators), posted as
point-to-point exchanges with the ring neighbours and waited for when their step needs them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ._ring_schedule import Piece


DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


def check_agreement(fn: str, group, q, meta: list[int], names: tuple[str, ...]) -> None:
    """One small all-gather tells every rank what the others hold (`meta`, ints named by
    `names`): unequal shards or mismatched dtypes would otherwise hang or corrupt the ring. Skipped
    while a CUDA graph is captured: the check reads its result on the host, and the warm-up call
    that a capture needs checked the same shapes."""
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    mine = torch.tensor(meta, dtype=torch.int64, device=q.device if dist.get_backend(group) == "nccl" else "cpu")
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    for rank, other in enumerate(gathered):
        for i, name in enumerate(names):
            if other[i] != mine[i]:
                raise ValueError(f"fattn.{fn}: rank {rank} has {name} {other[i].item()} but rank "
                                 f"{dist.get_rank(group)} has {mine[i].item()}; every rank needs matching shards "
                                 f"of one dtype")


@dataclass(frozen=True, eq=False)
class Block:
    """Rows [lo, lo + len) of a K/V block, as a hop carries them (the whole block at home)."""
    k: torch.Tensor
    v: torch.Tensor
    lo: int = 0

    def rows(self, span: tuple[int, int]) -> list[torch.Tensor]:
        """k and v of the block's rows span = (lo, hi), contiguous (point-to-point ops need it)."""
        a, b = span[0] - self.lo, span[1] - self.lo
        # (a no-op on a contiguous block; a caller's strided shard, e.g. a slice of a batch, is copied)
        return [self.k[:, a:b].contiguous(), self.v[:, a:b].contiguous()]

    def local(self, piece: Piece) -> slice:
        """The piece's K/V rows (block coordinates) in this block's tensors."""
        return slice(piece.kv_rows.start - self.lo, piece.kv_rows.stop - self.lo)


class Ring:
    """Point-to-point exchange with the ring neighbours of this rank in `group`."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.p2p_ops = 0  # posted so far; tests check it against the design
        self.sent_elements = 0  # of the tensors sent so far; tests check what each hop carries

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank) if self.group else rank

    def exchange(self, tensors: list[torch.Tensor], offset: int = 1, shapes=None):
        """Posts send(tensors -> rank + offset) and recv(<- rank - offset), ring neighbours by
        default; returns (received, handles, sent): the sent tensors stay referenced until the
        exchange is waited for, since a sliced block's copy has no other owner. What arrives has
        the sent tensors' shapes, or `shapes` where the ranks hold blocks of different sizes (the
        packed ring's); empty tensors travel without an op, the receiver knowing them empty."""
        offset %= self.world
        if offset == 0:  # a rank is its own neighbour: nothing travels
            return list(tensors), [], tensors
        to, frm = self._global((self.rank + offset) % self.world), self._global((self.rank - offset) % self.world)
        shapes = [t.shape for t in tensors] if shapes is None else shapes
        received = [t.new_empty(shape) for t, shape in zip(tensors, shapes)]
        ops = [dist.P2POp(dist.isend, t, to, self.group) for t in tensors if t.numel()]
        ops += [dist.P2POp(dist.irecv, r, frm, self.group) for r in received if r.numel()]
        self.p2p_ops += len(ops)
        self.sent_elements += sum(t.numel() for t in tensors)
        return received, dist.batch_isend_irecv(ops) if ops else [], tensors


def _wait(handles) -> None:
    for h in handles:
        h.wait()


def received(pending):
    """The tensors an exchange brings, once they are in."""
    _wait(pending[1])
    return pending[0]


def arrived(pending, block: Block, lo: int) -> Block:
    """The block an exchange posted this step brings (its rows from `lo`), once it is in; `block`
    if none was posted."""
    if pending is None:
        return block
    k, v = received(pending)
    return Block(k, v, lo)


def add_at(dk, dv, lo: int, dk_part, dv_part) -> None:
    """dk, dv rows [lo, lo + len(part)) += the parts, in place."""
    n = dk_part.shape[1]
    dk[:, lo:lo + n] += dk_part
    dv[:, lo:lo + n] += dv_part


def post_hops(ring: Ring, step, behind, ahead, spans, forward: Block, backward: Block):
    """Posts the next hop of each travelling block (before this step's kernels, so the transfer
    hides behind them), each carrying the rows its ranks ahead use: (pending, first row) per
    direction, None where the block has made its last hop."""
    posted = []
    for direction, hops, block in ((1, behind, forward), (-1, ahead, backward)):
        if step < hops:
            span = spans[direction, step + 1]
            posted.append((ring.exchange(block.rows(span), direction), span[0]))
        else:
            posted.append((None, 0))
    return posted
