"""Ring attention's schedule: which pieces of work a rank computes against each K/V block, how
far the blocks travel each way, and which of their rows each hop carries. Pure arithmetic on the
settings, which every rank evaluates for every rank, so all agree without communicating."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ._ring_sharding import check_sharding, check_world, runs_of_rank


@dataclass(frozen=True)
class Piece:
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


def plan(rank: int, source: int, world: int, local_len: int, causal: bool, sharding: str,
          window: tuple[int, int] = (-1, -1), alibi: bool = False) -> list[Piece]:
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
        return [Piece(everything, everything, alibi_offset=shift)]
    if source == rank:
        # Own block: the local positions are in sequence order in both layouts, so
        # causal attention over the local concatenation is exact.
        return [Piece(everything, everything, -1, 0)]
    half = local_len // 2
    if sharding == "contiguous":
        # Earlier ranks' keys are all visible; later ranks' keys none.
        return [Piece(everything, everything, alibi_offset=shift)] if source < rank else []
    if source < rank:
        # Chunk `source` precedes both local chunks; chunk 2w-1-source follows both.
        return [Piece(everything, slice(0, half))]
    # Both chunks of a later source lie between the local chunks: only the second
    # local chunk (2w-1-rank) sees them.
    return [Piece(slice(half, local_len), everything)]


def _chunk_plan(rank, source, world, local_len, sharding, window) -> list[Piece]:
    """One piece per (q run, K/V run) pair that shares a visible position (runs_of_rank: a
    zigzag shard's two chunks, a contiguous shard whole): the plan of sliding windows across
    shards, and of ALiBi. Both runs are `size` rows long; with the q run `d` positions after the
    K/V run, query i sees key j iff d - left <= j - i <= d + right. The kernel's window only
    bounds j - i by -left <= j - i <= right with left, right >= 0 (or unbounded), so a pair whose
    band lies wholly right (or left) of j = i is cut down to the rows and keys that can meet,
    which moves the band back onto the diagonal. ALiBi's distance is global query position minus
    global key position; the kernel computes i + len_k - len_q + alibi_offset - j over the
    piece's own positions, which fixes the offset."""
    q_runs, kv_runs = runs_of_rank(rank, world, local_len, sharding), runs_of_rank(source, world, local_len, sharding)
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
            pieces.append(Piece(slice(q_off + rows[0], q_off + rows[1]), slice(kv_off + keys[0], kv_off + keys[1]),
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
    check_sharding(sharding)
    check_world("fattn.ring.ring_schedule", world)
    return _schedule(world, local_len, bool(causal), sharding, tuple(window_size))


@functools.lru_cache(maxsize=64)
def _schedule(world, local_len, causal, sharding, window) -> tuple[int, int]:
    """ring_schedule's answer, computed once per setting (world^2 plans: every forward and backward
    call asks again)."""
    # need[o]: some rank computes against the block of the rank o places before it.
    need = [any(plan(r, (r - o) % world, world, local_len, causal, sharding, window) for r in range(world))
            for o in range(world)]
    return fewest_hops(need)


def fewest_hops(need: list[bool]) -> tuple[int, int]:
    """(behind, ahead) that bring every rank the blocks of the ranks `o` places before it for
    which need[o] holds (need[0], a rank's own block, costs no hop), in the fewest hops, then the
    one-way ring: offsets up to `behind` travel forward, the rest backward (world - o hops). The
    dense ring's and the packed ring's schedules alike."""
    world = len(need)
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
def travel_spans(world, local_len, causal, sharding, window, alibi) -> dict[tuple[int, int], tuple[int, int]]:
    """(direction, hop) -> (lo, hi): the rows of a K/V block that its hop `hop` in `direction`
    (+1 forward, -1 backward) carries, the hull of the K/V rows that the pieces of the ranks at
    that hop and after use. Every rank evaluates every rank's plans (as the schedule does), so
    sender and receiver agree on each shape, and blocks of every source carry the same rows. A
    window that reaches a neighbour shard's last keys only moves those (an eighth of a 32k shard
    for a 4k window), and the block's dK/dV accumulator shrinks with it."""
    behind, ahead = _schedule(world, local_len, causal, sharding, window)
    # The K/V rows used by the ranks `o` places after a block's owner, over every owner.
    used = [_hull(p.kv_rows for r in range(world)
                  for p in plan(r, (r - o) % world, world, local_len, causal, sharding, window, alibi))
            for o in range(world)]
    spans = {}
    for direction, hops in ((1, behind), (-1, ahead)):
        for hop in range(1, hops + 1):
            later = [used[direction * h % world] for h in range(hop, hops + 1)]
            spans[direction, hop] = _hull(slice(*u) for u in later if u is not None) or (0, local_len)
    return spans


def blocks_at(step, rank, world, behind, ahead, own, forward, backward):
    """(source, direction, (k, v)) of the blocks a rank computes with at `step`: its own at step 0
    (direction 0), then the one travelling forward (+1, from rank - step) and the one travelling
    backward (-1, from rank + step) while each still has hops to make."""
    if step == 0:
        return [(rank, 0, own)]
    blocks = [((rank - step) % world, 1, forward)] if step <= behind else []
    return blocks + ([((rank + step) % world, -1, backward)] if step <= ahead else [])
