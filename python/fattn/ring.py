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
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ._checks import check_alibi_slopes, check_sinks, check_softcap, lse_dtype
from ._arguments import window_pair
from ._library import load_library
from .attention import sinks_gradient
from .merge import merge_attention_states

load_library()
_forward_op = torch.ops.fattn.forward.default
_backward_op = torch.ops.fattn.backward.default

SHARDINGS = ("zigzag", "contiguous")


# ---------------------------------------------------------------- sharding helpers

def _chunks_of_rank(rank: int, world: int, sharding: str) -> tuple[int, int]:
    if sharding == "zigzag":
        return rank, 2 * world - 1 - rank
    return 2 * rank, 2 * rank + 1


def _check_world(fn: str, world) -> None:
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"{fn}: world must be an int >= 1, got {world!r}")


def shard(x: torch.Tensor, world: int, rank: int, sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The shard of the full sequence `x` (sequence along `dim`) that `rank` holds: zigzag needs
    the length divisible by 2 * world, contiguous by world."""
    _check_sharding(sharding)
    _check_world("fattn.ring.shard", world)
    if not 0 <= rank < world:
        raise ValueError(f"fattn.ring.shard: rank {rank} is not in [0, world = {world})")
    # A zigzag shard is two equal chunks; a contiguous one is one run, of any length.
    parts, name = (2 * world, "2 * world") if sharding == "zigzag" else (world, "world")
    if x.shape[dim] % parts:
        raise ValueError(f"fattn.ring.shard: sequence length {x.shape[dim]} is not divisible by {name} = {parts}")
    if sharding == "contiguous":
        return x.chunk(world, dim=dim)[rank]
    chunks = x.chunk(2 * world, dim=dim)
    a, b = _chunks_of_rank(rank, world, sharding)
    return torch.cat([chunks[a], chunks[b]], dim=dim)


def unshard(shards: list[torch.Tensor], sharding: str = "zigzag", dim: int = 1) -> torch.Tensor:
    """The full sequence from the shards of every rank, in rank order."""
    _check_sharding(sharding)
    world = len(shards)
    if sharding == "contiguous":
        return torch.cat(shards, dim=dim)
    chunks: list[torch.Tensor | None] = [None] * (2 * world)
    for rank, s in enumerate(shards):
        first, second = s.chunk(2, dim=dim)
        a, b = _chunks_of_rank(rank, world, sharding)
        chunks[a], chunks[b] = first, second
    return torch.cat(chunks, dim=dim)


def _check_sharding(sharding: str) -> None:
    if sharding not in SHARDINGS:
        raise ValueError(f"fattn.ring: sharding must be one of {SHARDINGS}, got {sharding!r}")


# ---------------------------------------------------------------- the schedule

@dataclass(frozen=True)
class _Piece:
    """One kernel call of a step: local q rows against rows of the K/V block at hand, with the
    window (flash-attn's (left, right), -1 unbounded, bottom-right aligned) that makes the
    call's local positions show exactly the keys the global positions see, and the offset that
    gives ALiBi the global distances (the op's alibi_offset: the call's q rows and keys are each
    consecutive in the sequence wherever it is not 0)."""
    q_rows: slice
    kv_rows: slice
    window_left: int = -1
    window_right: int = -1
    alibi_offset: int = 0


def _plan(rank: int, source: int, world: int, local_len: int, causal: bool, sharding: str,
          window: tuple[int, int] = (-1, -1), alibi: bool = False) -> list[_Piece]:
    """The pieces `rank` computes against the K/V block that `source` started with. ALiBi's
    distances need each piece's rows and keys to be consecutive positions (one alibi_offset per
    piece): a contiguous shard is, so its whole-block pieces carry the distance between the
    shards; a zigzag shard's two chunks are not neighbours, so with `alibi` its pieces are the
    (q chunk, K/V chunk) pairs (_chunk_plan). The same blocks have pieces either way (ALiBi
    hides no key), so the schedule asks without it."""
    window = (window[0], 0) if causal else window
    if window not in ((-1, -1), (-1, 0)) or (alibi and sharding == "zigzag"):
        return _chunk_plan(rank, source, world, local_len, sharding, window)
    everything = slice(0, local_len)
    shift = (rank - source) * local_len if alibi else 0  # contiguous: shard r starts at r * local_len
    if window == (-1, -1):
        return [_Piece(everything, everything, alibi_offset=shift)]
    if source == rank:
        # Own block: the local positions are in sequence order in both layouts, so
        # causal attention over the local concatenation is exact.
        return [_Piece(everything, everything, -1, 0)]
    half = local_len // 2
    if sharding == "contiguous":
        # Earlier ranks' keys are all visible; later ranks' keys none.
        return [_Piece(everything, everything, alibi_offset=shift)] if source < rank else []
    if source < rank:
        # Chunk `source` precedes both local chunks; chunk 2w-1-source follows both.
        return [_Piece(everything, slice(0, half))]
    # Both chunks of a later source lie between the local chunks: only the second
    # local chunk (2w-1-rank) sees them.
    return [_Piece(slice(half, local_len), everything)]


def _runs_of_rank(rank: int, world: int, local_len: int, sharding: str) -> list[tuple[int, int]]:
    """(first global position, first local row) of each run of consecutive positions a shard
    holds, every run `local_len // len(runs)` rows: a zigzag shard's two chunks, or a contiguous
    shard whole (whatever its length, odd ones too)."""
    if sharding == "contiguous":
        return [(rank * local_len, 0)]
    size = local_len // 2
    return [(chunk * size, half * size) for half, chunk in enumerate(_chunks_of_rank(rank, world, sharding))]


def _chunk_plan(rank, source, world, local_len, sharding, window) -> list[_Piece]:
    """One piece per (q run, K/V run) pair that shares a visible position (_runs_of_rank: a
    zigzag shard's two chunks, a contiguous shard whole): the plan of sliding windows across
    shards, and of ALiBi. Both runs are `size` rows long; with the q run `d` positions after the
    K/V run, query i sees key j iff d - left <= j - i <= d + right. The kernel's window only
    bounds j - i by -left <= j - i <= right with left, right >= 0 (or unbounded), so a pair whose
    band lies wholly right (or left) of j = i is cut down to the rows and keys that can meet,
    which moves the band back onto the diagonal. ALiBi's distance is global query position minus
    global key position; the kernel computes i + len_k - len_q + alibi_offset - j over the
    piece's own positions, which fixes the offset."""
    q_runs, kv_runs = _runs_of_rank(rank, world, local_len, sharding), _runs_of_rank(source, world, local_len, sharding)
    size = local_len // len(q_runs)
    left, right = window
    pieces = []
    for q_start, q_off in q_runs:
        for kv_start, kv_off in kv_runs:
            d = q_start - kv_start
            # The band of j - i, None where unbounded; bounds past the run bound nothing.
            lo = d - left if left >= 0 and d - left > -size else None
            hi = d + right if right >= 0 and d + right < size else None
            if (lo is not None and lo >= size) or (hi is not None and hi <= -size) or \
                    (lo is not None and hi is not None and lo > hi):
                continue
            rows, keys = (0, size), (0, size)
            if lo is not None and lo > 0:  # rows [0, size - lo) meet keys [lo, size)
                rows, keys = (0, size - lo), (lo, size)
                lo, hi = 0, None if hi is None else hi - keys[0]
            elif hi is not None and hi < 0:  # rows [-hi, size) meet keys [0, size + hi)
                rows, keys = (-hi, size), (0, size + hi)
                lo, hi = None if lo is None else lo + rows[0], 0
            distance = (q_start + rows[0]) - (kv_start + keys[0])  # of the first row and key
            alibi_offset = distance - ((keys[1] - keys[0]) - (rows[1] - rows[0]))
            pieces.append(_Piece(slice(q_off + rows[0], q_off + rows[1]), slice(kv_off + keys[0], kv_off + keys[1]),
                                 -1 if lo is None else -lo, -1 if hi is None else hi, alibi_offset))
    return pieces


def ring_schedule(world: int, local_len: int, causal: bool = False, sharding: str = "zigzag",
                  window_size=(-1, -1)) -> tuple[int, int]:
    """(behind, ahead): how far each rank's K/V block travels, forward (to the next rank, up to
    `behind` hops: the ranks whose queries follow it) and backward (to the previous rank, up to
    `ahead` hops). Every rank evaluates every rank's plans, arithmetic on the settings that gives
    the same answer everywhere, and the schedule covers each (rank, block) pair with work in the
    fewest hops: full attention keeps the one-way ring (world - 1 hops behind); a window stops it
    where the window ends, and one that needs blocks on both sides (zigzag shards, where each
    rank's second chunk neighbours the previous rank's, or a two-sided window) sends blocks both
    ways, max(behind, ahead) steps after the rank's own block."""
    _check_sharding(sharding)
    _check_world("fattn.ring.ring_schedule", world)
    return _schedule(world, local_len, bool(causal), sharding, tuple(window_size))


@functools.lru_cache(maxsize=64)
def _schedule(world, local_len, causal, sharding, window) -> tuple[int, int]:
    """ring_schedule's answer, computed once per setting (world^2 plans: every forward and backward
    call asks again)."""
    # need[o]: some rank computes against the block of the rank o places before it.
    need = [any(_plan(r, (r - o) % world, world, local_len, causal, sharding, window) for r in range(world))
            for o in range(world)]
    best = None
    for behind in range(world):
        ahead = max((world - o for o in range(behind + 1, world) if need[o]), default=0)
        key = (behind + ahead, ahead > 0, max(behind, ahead))  # fewest hops, then the one-way ring
        if best is None or key < best[0]:
            best = (key, behind, ahead)
    return best[1], best[2]


def _hull(slices):
    """(lo, hi) covering every slice; None for none."""
    slices = list(slices)
    return (min(x.start for x in slices), max(x.stop for x in slices)) if slices else None


@functools.lru_cache(maxsize=64)
def _travel_spans(world, local_len, causal, sharding, window, alibi) -> dict[tuple[int, int], tuple[int, int]]:
    """(direction, hop) -> (lo, hi): the rows of a K/V block that its hop `hop` in `direction`
    (+1 forward, -1 backward) carries, the hull of the K/V rows that the pieces of the ranks at
    that hop and after use. Every rank evaluates every rank's plans (as the schedule does), so
    sender and receiver agree on each shape, and blocks of every source carry the same rows. A
    window that reaches a neighbour shard's last keys only moves those (an eighth of a 32k shard
    for a 4k window), and the block's dK/dV accumulator shrinks with it."""
    behind, ahead = _schedule(world, local_len, causal, sharding, window)
    # The K/V rows used by the ranks `o` places after a block's owner, over every owner.
    used = [_hull(p.kv_rows for r in range(world)
                  for p in _plan(r, (r - o) % world, world, local_len, causal, sharding, window, alibi))
            for o in range(world)]
    spans = {}
    for direction, hops in ((1, behind), (-1, ahead)):
        for hop in range(1, hops + 1):
            later = [used[direction * h % world] for h in range(hop, hops + 1)]
            spans[direction, hop] = _hull(slice(*u) for u in later if u is not None) or (0, local_len)
    return spans


@dataclass(frozen=True, eq=False)
class _Block:
    """Rows [lo, lo + len) of a K/V block, as a hop carries them (the whole block at home)."""
    k: torch.Tensor
    v: torch.Tensor
    lo: int = 0

    def rows(self, span: tuple[int, int]) -> list[torch.Tensor]:
        """k and v of the block's rows span = (lo, hi), contiguous (point-to-point ops need it)."""
        a, b = span[0] - self.lo, span[1] - self.lo
        # (a no-op on a contiguous block; a caller's strided shard, e.g. a slice of a batch, is copied)
        return [self.k[:, a:b].contiguous(), self.v[:, a:b].contiguous()]

    def local(self, piece: _Piece) -> slice:
        """The piece's K/V rows (block coordinates) in this block's tensors."""
        return slice(piece.kv_rows.start - self.lo, piece.kv_rows.stop - self.lo)


# ---------------------------------------------------------------- communication

class _Ring:
    """Point-to-point exchange with the ring neighbours of this rank in `group`."""

    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.p2p_ops = 0  # posted so far; tests check it against the design
        self.sent_elements = 0  # of the tensors sent so far; tests check what each hop carries

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank) if self.group else rank

    def exchange(self, tensors: list[torch.Tensor], offset: int = 1):
        """Posts send(tensors -> rank + offset) and recv(<- rank - offset), ring neighbours by
        default; returns (received, handles, sent): the sent tensors stay referenced until the
        exchange is waited for, since a sliced block's copy has no other owner."""
        offset %= self.world
        if offset == 0:  # a rank is its own neighbour: nothing travels
            return list(tensors), [], tensors
        to, frm = self._global((self.rank + offset) % self.world), self._global((self.rank - offset) % self.world)
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, to, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, frm, self.group) for r in received]
        self.p2p_ops += len(ops)
        self.sent_elements += sum(t.numel() for t in tensors)
        return received, dist.batch_isend_irecv(ops), tensors


def _wait(handles) -> None:
    for h in handles:
        h.wait()


def _received(pending):
    """The tensors an exchange brings, once they are in."""
    _wait(pending[1])
    return pending[0]


def _arrived(pending, block: _Block, lo: int) -> _Block:
    """The block an exchange posted this step brings (its rows from `lo`), once it is in; `block`
    if none was posted."""
    if pending is None:
        return block
    k, v = _received(pending)
    return _Block(k, v, lo)


def _add_at(dk, dv, lo: int, dk_part, dv_part) -> None:
    """dk, dv rows [lo, lo + len(part)) += the parts, in place."""
    n = dk_part.shape[1]
    dk[:, lo:lo + n] += dk_part
    dv[:, lo:lo + n] += dv_part


# ---------------------------------------------------------------- forward and backward

class _Accumulator:
    """A rank's running (out, lse) in lse's precision (fp32; float64 for float64 inputs): zero out
    and lse -inf, or with sinks lse at each head's sink (a partial with no value and the sink's
    weight, so that the merges count the sink once per row, not once per step)."""

    def __init__(self, q, sinks=None):
        acc_dtype = lse_dtype(q.dtype)
        b, n, h, d = q.shape
        self.out = torch.zeros(b, n, h, d, dtype=acc_dtype, device=q.device)
        self.lse = torch.full((b, h, n), float("-inf"), dtype=acc_dtype, device=q.device)
        if sinks is not None:
            self.lse.copy_(sinks.to(acc_dtype)[None, :, None].expand(b, h, n))
        # Row ranges that hold a partial already. Merging into an empty row (out 0, lse -inf) gives
        # the partial itself, so a piece whose rows are all empty is copied in: no stacked copies
        # of the rows and no merge. Sinks make no row empty.
        self.filled = [] if sinks is None else [(0, n)]

    def add(self, rows: slice, part_out, part_lse) -> None:
        """Merges one partial into rows `rows`, in place."""
        if all(rows.stop <= lo or hi <= rows.start for lo, hi in self.filled):
            self.out[:, rows] = part_out
            self.lse[:, :, rows] = part_lse
        else:
            outs = torch.stack([self.out[:, rows], part_out.to(self.out.dtype)])
            lses = torch.stack([self.lse[:, :, rows], part_lse.to(self.lse.dtype)])
            self.out[:, rows], self.lse[:, :, rows] = merge_attention_states(outs, lses)
        self.filled.append((rows.start, rows.stop))


def _alibi_args(alibi_slopes, piece: _Piece) -> dict:
    """The op's ALiBi arguments for one piece: none without slopes."""
    return {} if alibi_slopes is None else dict(alibi_slopes=alibi_slopes, alibi_offset=piece.alibi_offset)


def _forward_step(acc: _Accumulator, q, block: _Block, pieces: list[_Piece], softmax_scale, softcap, alibi_slopes):
    for piece in pieces:
        rows = block.local(piece)
        part_out, part_lse = _forward_op(
            q[:, piece.q_rows], block.k[:, rows], block.v[:, rows], softmax_scale, False, False,
            piece.window_left, piece.window_right, softcap, **_alibi_args(alibi_slopes, piece))
        acc.add(piece.q_rows, part_out, part_lse)


def _blocks_at(step, rank, world, behind, ahead, own, forward, backward):
    """(source, direction, (k, v)) of the blocks a rank computes with at `step`: its own at step 0
    (direction 0), then the one travelling forward (+1, from rank - step) and the one travelling
    backward (-1, from rank + step) while each still has hops to make."""
    if step == 0:
        return [(rank, 0, own)]
    blocks = [((rank - step) % world, 1, forward)] if step <= behind else []
    return blocks + ([((rank + step) % world, -1, backward)] if step <= ahead else [])


def _post_hops(ring: _Ring, step, behind, ahead, spans, forward: _Block, backward: _Block):
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


def _ring_forward(q, k, v, sinks, ring: _Ring, settings):
    causal, softmax_scale, sharding, window, softcap, alibi_slopes = settings
    acc = _Accumulator(q, sinks)
    alibi = alibi_slopes is not None
    behind, ahead = ring_schedule(ring.world, q.shape[1], causal, sharding, window)
    spans = _travel_spans(ring.world, q.shape[1], bool(causal), sharding, tuple(window), alibi)
    own = forward = backward = _Block(k, v)
    for step in range(max(behind, ahead) + 1):
        (to_next, next_lo), (to_prev, prev_lo) = _post_hops(ring, step, behind, ahead, spans, forward, backward)
        for source, _, block in _blocks_at(step, ring.rank, ring.world, behind, ahead, own, forward, backward):
            pieces = _plan(ring.rank, source, ring.world, q.shape[1], causal, sharding, window, alibi)
            _forward_step(acc, q, block, pieces, softmax_scale, softcap, alibi_slopes)
        forward, backward = _arrived(to_next, forward, next_lo), _arrived(to_prev, backward, prev_lo)
    return acc.out.to(q.dtype), acc.lse.to(lse_dtype(q.dtype))


def _block_gradients(dout, dlse, q, block: _Block, out, lse, pieces, dq, settings, deterministic, acc_dtype):
    """dK, dV of the rows of one K/V block that `block` holds, from this rank's queries (dq
    accumulates in place)."""
    _, softmax_scale, _, _, softcap, alibi_slopes = settings
    k, v = block.k, block.v
    dk = torch.zeros_like(k, dtype=acc_dtype)
    dv = torch.zeros_like(v, dtype=acc_dtype)
    for piece in pieces:
        r, c = piece.q_rows, block.local(piece)
        dq_p, dk_p, dv_p, _ = _backward_op(
            dout[:, r], q[:, r], k[:, c], v[:, c], out[:, r], lse[:, :, r],
            None if dlse is None else dlse[:, :, r], softmax_scale, False, deterministic,
            piece.window_left, piece.window_right, softcap, **_alibi_args(alibi_slopes, piece))
        dq[:, r] += dq_p
        dk[:, c] += dk_p
        dv[:, c] += dv_p
    return dk, dv


def _ring_backward(dout, dlse, q, k, v, out, lse, ring: _Ring, settings, deterministic):
    causal, _, sharding, window, _, alibi_slopes = settings
    acc_dtype = lse_dtype(q.dtype)  # accumulate in lse's precision: fp32, float64 for float64 inputs
    dq = torch.zeros_like(q, dtype=acc_dtype)
    alibi = alibi_slopes is not None
    behind, ahead = ring_schedule(ring.world, q.shape[1], causal, sharding, window)
    spans = _travel_spans(ring.world, q.shape[1], bool(causal), sharding, tuple(window), alibi)
    own_block = forward = backward = _Block(k, v)
    # The dK/dV accumulator of each travelling block follows it, gathering the gradient of every
    # rank it visits, and after its last hop goes straight back to the block's owner. It holds the
    # rows of the block's first hop, the most that any rank on its way computes.
    arriving = {1: None, -1: None}  # direction -> the accumulator posted to reach this rank
    own = None
    for step in range(max(behind, ahead) + 1):
        (to_next, next_lo), (to_prev, prev_lo) = _post_hops(ring, step, behind, ahead, spans, forward, backward)
        blocks = _blocks_at(step, ring.rank, ring.world, behind, ahead, own_block, forward, backward)
        for source, direction, block in blocks:
            pieces = _plan(ring.rank, source, ring.world, q.shape[1], causal, sharding, window, alibi)
            dk, dv = _block_gradients(dout, dlse, q, block, out, lse, pieces, dq, settings, deterministic, acc_dtype)
            if direction == 0:
                own = [dk, dv]
                continue
            hops = behind if direction == 1 else ahead
            first = spans[direction, 1][0]
            if arriving[direction] is not None:  # what the ranks before this one on its way added
                acc_k, acc_v = _received(arriving[direction])
                _add_at(acc_k, acc_v, block.lo - first, dk, dv)
                dk, dv = acc_k, acc_v
            last = step == hops
            arriving[direction] = ring.exchange([dk, dv], direction * (-hops if last else 1))
        forward, backward = _arrived(to_next, forward, next_lo), _arrived(to_prev, backward, prev_lo)
    dk, dv = own
    for direction, pending in arriving.items():  # this rank's own block, home from each direction
        if pending is not None:
            _add_at(dk, dv, spans[direction, 1][0], *_received(pending))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, group, settings, deterministic):
        out, lse = _ring_forward(q, k, v, sinks, _Ring(group), settings)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.settings = (group, settings, deterministic)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        group, settings, deterministic = ctx.settings
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = _ring_backward(dout.contiguous(), dlse, q, k, v, out, lse, _Ring(group), settings,
                                    deterministic)
        # This rank's rows' share; sinks replicated over the ranks sum their shares as any
        # replicated parameter does (data-parallel gradient reduction).
        dsinks = sinks_gradient(sinks, dout, out, lse, dlse) if sinks is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, dsinks, None, None, None


def _check_inputs(q, k, v, group, sharding, window_size, softcap, sinks, alibi_slopes):
    _check_sharding(sharding)
    left, right = window_pair("ring_flash_attn_func", window_size)
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
    # One small all-gather tells every rank what the others hold: unequal shards or
    # mismatched dtypes would otherwise hang or corrupt the ring.
    dtype_codes = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
    meta = torch.tensor([q.shape[1], dtype_codes.get(q.dtype, 0), q.shape[0], q.shape[2], k.shape[2], q.shape[3]],
                        dtype=torch.int64, device=q.device if dist.get_backend(group) == "nccl" else "cpu")
    gathered = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(gathered, meta, group=group)
    names = ("shard length", "dtype", "batch", "heads", "kv heads", "head_dim")
    for rank, other in enumerate(gathered):
        for i, name in enumerate(names):
            if other[i] != meta[i]:
                raise ValueError(f"fattn.ring_flash_attn_func: rank {rank} has {name} {other[i].item()} but rank "
                                 f"{dist.get_rank(group)} has {meta[i].item()}; every rank needs equal shards "
                                 f"of one dtype")


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
    torchrun) and gloo (CPU tensors).
    """
    _check_inputs(q, k, v, group, sharding, window_size, softcap, sinks, alibi_slopes)
    settings = (causal, softmax_scale, sharding, tuple(window_size), float(softcap), alibi_slopes)
    out, lse = _RingAttention.apply(q, k, v, sinks, group, settings, deterministic)
    return (out, lse) if return_lse else out


def simulate(q, k, v, world: int, causal=False, softmax_scale=None, sharding="zigzag", return_lse=False, *,
             window_size=(-1, -1), softcap=0.0, sinks=None, alibi_slopes=None):
    """The forward ring schedule for `world` virtual ranks, run in one process on one device.

    Takes the full sequences, shards them, runs every rank's steps in ring order (the
    block a rank sees at step i is the one rank - i started with) and returns the
    unsharded result: a way to study the schedule without a process group.
    """
    _check_sharding(sharding)
    _check_world("fattn.ring.simulate", world)
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"fattn.ring.simulate: k and v must have q's sequence length {q.shape[1]} (every rank "
                         f"holds matching q and k/v shards), got {k.shape[1]} and {v.shape[1]}")
    qs, ks, vs = ([shard(t, world, r, sharding) for r in range(world)] for t in (q, k, v))
    accs = [_Accumulator(qs[r], sinks) for r in range(world)]
    behind, ahead = ring_schedule(world, qs[0].shape[1], causal, sharding, window_size)
    for step in range(max(behind, ahead) + 1):
        for r in range(world):
            for source, _, _ in _blocks_at(step, r, world, behind, ahead, None, None, None):
                pieces = _plan(r, source, world, qs[r].shape[1], causal, sharding, tuple(window_size),
                               alibi_slopes is not None)
                _forward_step(accs[r], qs[r], _Block(ks[source], vs[source]), pieces, softmax_scale, softcap,
                              alibi_slopes)
    out = unshard([a.out.to(q.dtype) for a in accs], sharding)
    lse = unshard([a.lse for a in accs], sharding, dim=2)
    return (out, lse.to(lse_dtype(q.dtype))) if return_lse else out
