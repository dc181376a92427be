"""The packed ring's plan: what each rank computes against each K/V block of a packed batch laid
out by python/fattn/_cp_sharding.py, how far the blocks travel, which of their rows each hop
carries, and the kernel calls that do a step's work. Arithmetic on the global cu_seqlens and the
settings that every rank evaluates for every rank, so all agree on every shape without
communicating; cached per batch, since every forward and backward of a step asks again."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ._cp_sharding import Run, packed_layout
from ._ring_schedule import fewest_hops


@dataclass(frozen=True)
class Pair:
    """This rank's rows of one document against rows of the same document in a K/V block: rows
    and keys cut down to those that can meet, with the window (flash-attn's (left, right), -1
    unbounded, bottom-right aligned) that makes the kernel's local positions show exactly the
    keys the document's positions see, and the ALiBi offset that gives the global distances."""
    doc: int
    q_rows: slice  # this rank's local rows
    kv_rows: slice  # the block owner's local rows
    window_left: int = -1
    window_right: int = -1
    alibi_offset: int = 0


def pair_of(q_run: Run, kv_run: Run, window: tuple[int, int]) -> Pair | None:
    """The pair of a query run and a key run of one document, None when no row sees a key. With
    the key run d = kv.position - q.position positions after the query run, row t sees key u iff
    lo <= d + u - t <= hi (lo = -left, hi = right; None unbounded). The rows that see some key are
    [d - hi, nk - lo + d) and the keys seen [lo + t0 - d, hi + t1 - 1 - d]; cut to them, the last
    row sees the last key, so the bottom-right corner is on the band and the kernel's window about
    that corner is (e + s - lo, hi - e - s), e the offset of the first key from the first row and
    s = keys - rows. A bound that cuts nothing in the cut rectangle becomes -1, which lets full
    pairs share kernel calls. ALiBi: the kernel's distance is t + s + offset - u, the document's
    t - u - e, so offset = -e - s."""
    nq, nk = q_run.length, kv_run.length
    if nq == 0 or nk == 0:
        return None
    d = kv_run.position - q_run.position
    lo = -window[0] if window[0] >= 0 else None
    hi = window[1] if window[1] >= 0 else None
    t0 = 0 if hi is None else max(0, d - hi)
    t1 = nq if lo is None else min(nq, nk - lo + d)
    if t0 >= t1:
        return None
    u0 = 0 if lo is None else max(0, lo + t0 - d)
    u1 = nk if hi is None else min(nk, hi + t1 - d)
    if u0 >= u1:
        return None
    rows, keys = t1 - t0, u1 - u0
    e, s = d + u0 - t0, u1 - u0 - (t1 - t0)
    left = -1 if lo is None or e + s - lo >= keys - 1 else e + s - lo
    right = -1 if hi is None or hi - e - s >= rows - 1 else hi - e - s
    return Pair(q_run.doc, slice(q_run.row + t0, q_run.row + t1), slice(kv_run.row + u0, kv_run.row + u1),
                left, right, -e - s)


def _coalesced(pairs: list[Pair]) -> list[Pair]:
    """Full pairs (no window left in them, no ALiBi) of one document that share their keys and
    have adjacent rows, or share their rows and have adjacent keys, as one pair: a zigzag shard's
    two chunks against an earlier chunk, or a rank's chunk against both chunks of a block."""
    merged: list[Pair] = []
    for pair in pairs:
        while merged and pair.window_left == pair.window_right == -1 and \
                merged[-1].window_left == merged[-1].window_right == -1:
            top = merged[-1]
            if top.kv_rows == pair.kv_rows and top.q_rows.stop == pair.q_rows.start:
                pair = Pair(pair.doc, slice(top.q_rows.start, pair.q_rows.stop), pair.kv_rows)
            elif top.q_rows == pair.q_rows and top.kv_rows.stop == pair.kv_rows.start:
                pair = Pair(pair.doc, pair.q_rows, slice(top.kv_rows.start, pair.kv_rows.stop))
            else:
                break
            merged.pop()
        merged.append(pair)
    return merged


class RowSet:
    """Rows of a block owner's local rows, as sorted disjoint (start, stop) intervals, packed one
    after another in that order: what a K/V block holds on one hop of its way."""

    def __init__(self, intervals):
        merged: list[list[int]] = []
        for a, b in sorted((a, b) for a, b in intervals if b > a):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.intervals = tuple((a, b) for a, b in merged)
        self.starts, offset = [], 0  # the packed position of each interval's first row
        for a, b in self.intervals:
            self.starts.append(offset)
            offset += b - a
        self.size = offset

    def local(self, rows: slice) -> slice:
        """Where the owner's rows `rows` (inside one interval) are in the packed block."""
        for (a, b), start in zip(self.intervals, self.starts):
            if a <= rows.start and rows.stop <= b:
                return slice(start + rows.start - a, start + rows.stop - a)
        raise AssertionError(f"rows {rows} are not held in {self.intervals}")

    def slices_in(self, outer: RowSet) -> list[slice]:
        """Where each of this set's intervals lies in `outer`'s packing (this set inside it)."""
        return [outer.local(slice(a, b)) for a, b in self.intervals]

    def __eq__(self, other):
        return isinstance(other, RowSet) and self.intervals == other.intervals

    def __hash__(self):
        return hash(self.intervals)


def _index(slices: list[slice]):
    """A slice where the slices run on one after another (a view, no gather), else the rows as a
    list of ints (index_select's index)."""
    if all(a.stop == b.start for a, b in zip(slices, slices[1:])):
        return slice(slices[0].start, slices[-1].stop) if slices else slice(0, 0)
    return [i for s in slices for i in range(s.start, s.stop)]


@dataclass
class Call:
    """One kernel call of a step. A varlen call runs pairs of one window as the sequences of one
    fattn::varlen_forward (their rows gathered where they do not run on); with ALiBi, which the
    varlen op cannot offset, each pair is its own fattn::forward (batch 1) with its alibi_offset."""
    window_left: int
    window_right: int
    q_index: slice | list  # this rank's rows, in the call's order
    kv_index: slice | list  # rows of the block as it arrives (its RowSet's packing)
    cu_q: list[int]
    cu_k: list[int]
    alibi_doc: int | None = None  # the document of an ALiBi call
    alibi_offset: int = 0
    q_slices: tuple = ()  # the rows of q_index, as slices
    _tensors: dict = field(default_factory=dict)

    def tensors(self, device):
        """(q index, kv index, cu_q, cu_k) on `device`, slices left as they are; made once."""
        if device not in self._tensors:
            def on(index):
                return index if isinstance(index, slice) else torch.tensor(index, dtype=torch.int64, device=device)
            self._tensors[device] = (on(self.q_index), on(self.kv_index),
                                     torch.tensor(self.cu_q, dtype=torch.int32, device=device),
                                     torch.tensor(self.cu_k, dtype=torch.int32, device=device))
        return self._tensors[device]

    @property
    def max_q(self):
        return max(b - a for a, b in zip(self.cu_q, self.cu_q[1:]))

    @property
    def max_k(self):
        return max(b - a for a, b in zip(self.cu_k, self.cu_k[1:]))


def _calls(pairs: list[Pair], held: RowSet, alibi: bool) -> list[Call]:
    if alibi:
        return [Call(p.window_left, p.window_right, p.q_rows, held.local(p.kv_rows),
                     [0, p.q_rows.stop - p.q_rows.start], [0, p.kv_rows.stop - p.kv_rows.start], p.doc,
                     p.alibi_offset, (p.q_rows,)) for p in pairs]
    # One call per window and per layer of pairs whose rows do not overlap (a call's out holds
    # each row once; under a two-sided window a chunk can meet both chunks of a block alike).
    layers: dict[tuple[int, int], list[list[Pair]]] = {}
    for pair in sorted(pairs, key=lambda p: (p.q_rows.start, p.kv_rows.start)):
        for layer in layers.setdefault((pair.window_left, pair.window_right), []):
            if layer[-1].q_rows.stop <= pair.q_rows.start:
                layer.append(pair)
                break
        else:
            layers[pair.window_left, pair.window_right].append([pair])
    calls = []
    for (left, right), group in sorted(layers.items()):
        for layer in group:
            cu_q, cu_k = [0], [0]
            for p in layer:
                cu_q.append(cu_q[-1] + p.q_rows.stop - p.q_rows.start)
                cu_k.append(cu_k[-1] + p.kv_rows.stop - p.kv_rows.start)
            q_slices = [p.q_rows for p in layer]
            calls.append(Call(left, right, _index(q_slices), _index([held.local(p.kv_rows) for p in layer]),
                              cu_q, cu_k, q_slices=tuple(q_slices)))
    return calls


class VarlenPlan:
    """The packed ring of one batch and one setting (see the module's docstring)."""

    def __init__(self, cu_seqlens: tuple[int, ...], world: int, causal: bool, window: tuple[int, int], alibi: bool):
        self.layout = layout = packed_layout(cu_seqlens, world)
        self.world, self.alibi = world, alibi
        window = (window[0], 0) if causal else window
        self.pairs = {(r, s): self._pairs(r, s, window) for r in range(world) for s in range(world)}
        need = [any(self.pairs[r, (r - o) % world] for r in range(world)) for o in range(world)]
        self.behind, self.ahead = fewest_hops(need)
        self.own = [RowSet([(0, layout.local_total(s))]) for s in range(world)]
        # used[s][o]: the rows of s's block that the rank o places after s computes with.
        used = [[RowSet((p.kv_rows.start, p.kv_rows.stop) for p in self.pairs[(s + o) % world, s])
                 for o in range(world)] for s in range(world)]
        self.sets = {}  # (owner, direction, hop) -> the rows that hop carries
        for s in range(world):
            for direction, hops in ((1, self.behind), (-1, self.ahead)):
                for hop in range(1, hops + 1):
                    later = [iv for h in range(hop, hops + 1) for iv in used[s][direction * h % world].intervals]
                    self.sets[s, direction, hop] = RowSet(later)
        self._calls = {}

    def _pairs(self, rank, source, window) -> list[Pair]:
        pairs = []
        for q_runs, kv_runs in zip(self.layout.runs(rank), self.layout.runs(source)):
            if rank == source and window == (-1, 0) and not self.alibi:
                # Own block, plain causal: the shard's two chunks in their local order are in
                # position order, so causal attention of the local rows is exact, in one pair.
                first, second = q_runs
                if first.length + second.length:
                    rows = slice(first.row, second.row + second.length)
                    pairs.append(Pair(first.doc, rows, rows, -1, 0))
                continue
            doc_pairs = [p for q_run in q_runs for kv_run in kv_runs
                         if (p := pair_of(q_run, kv_run, window)) is not None]
            pairs += doc_pairs if self.alibi else _coalesced(doc_pairs)
        return pairs

    def held(self, source: int, direction: int, step: int) -> RowSet:
        """The rows of `source`'s block that arrive at the rank `step` hops on in `direction`
        (its own rank at step 0: the whole block)."""
        return self.own[source] if step == 0 else self.sets[source, direction, step]

    def calls(self, rank: int, source: int, direction: int, step: int) -> list[Call]:
        key = (rank, source, direction, step)
        if key not in self._calls:
            self._calls[key] = _calls(self.pairs[rank, source], self.held(source, direction, step), self.alibi)
        return self._calls[key]


@functools.lru_cache(maxsize=8)
def varlen_plan(cu_seqlens: tuple[int, ...], world: int, causal: bool, window: tuple[int, int],
                alibi: bool) -> VarlenPlan:
    return VarlenPlan(cu_seqlens, world, causal, window, alibi)
