"""Ring attention's forward and backward passes over the schedule (python/fattn/_ring_schedule.py),
which the custom ops of python/fattn/_ring_op.py run: each step's partial (out, lse) merges into an
accumulator; the backward's dK/dV accumulators travel with their K/V blocks back to their owners."""

from __future__ import annotations

import torch

from ._checks import lse_dtype
from ._library import load_library
from ._ring_exchange import Block, Ring, add_at, arrived, post_hops, received
from ._ring_schedule import Piece, blocks_at, plan, ring_schedule, travel_spans
from .merge import merge_attention_states

load_library()
_forward_op = torch.ops.fattn.forward.default
_backward_op = torch.ops.fattn.backward.default


class Accumulator:
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


def _alibi_args(alibi_slopes, piece: Piece) -> dict:
    """The op's ALiBi arguments for one piece: none without slopes."""
    return {} if alibi_slopes is None else dict(alibi_slopes=alibi_slopes, alibi_offset=piece.alibi_offset)


def forward_step(acc: Accumulator, q, block: Block, pieces: list[Piece], softmax_scale, softcap, alibi_slopes):
    for piece in pieces:
        rows = block.local(piece)
        part_out, part_lse = _forward_op(
            q[:, piece.q_rows], block.k[:, rows], block.v[:, rows], softmax_scale, False, False,
            piece.window_left, piece.window_right, softcap, **_alibi_args(alibi_slopes, piece))
        acc.add(piece.q_rows, part_out, part_lse)


def _ring_forward(q, k, v, sinks, ring: Ring, settings):
    causal, softmax_scale, sharding, window, softcap, alibi_slopes = settings
    acc = Accumulator(q, sinks)
    alibi = alibi_slopes is not None
    behind, ahead = ring_schedule(ring.world, q.shape[1], causal, sharding, window)
    spans = travel_spans(ring.world, q.shape[1], bool(causal), sharding, tuple(window), alibi)
    own = forward = backward = Block(k, v)
    for step in range(max(behind, ahead) + 1):
        (to_next, next_lo), (to_prev, prev_lo) = post_hops(ring, step, behind, ahead, spans, forward, backward)
        for source, _, block in blocks_at(step, ring.rank, ring.world, behind, ahead, own, forward, backward):
            pieces = plan(ring.rank, source, ring.world, q.shape[1], causal, sharding, window, alibi)
            forward_step(acc, q, block, pieces, softmax_scale, softcap, alibi_slopes)
        forward, backward = arrived(to_next, forward, next_lo), arrived(to_prev, backward, prev_lo)
    return acc.out.to(q.dtype), acc.lse.to(lse_dtype(q.dtype))


def _block_gradients(dout, dlse, q, block: Block, out, lse, pieces, dq, settings, deterministic, acc_dtype):
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


def _ring_backward(dout, dlse, q, k, v, out, lse, ring: Ring, settings, deterministic):
    causal, _, sharding, window, _, alibi_slopes = settings
    acc_dtype = lse_dtype(q.dtype)  # accumulate in lse's precision: fp32, float64 for float64 inputs
    dq = torch.zeros_like(q, dtype=acc_dtype)
    alibi = alibi_slopes is not None
    behind, ahead = ring_schedule(ring.world, q.shape[1], causal, sharding, window)
    spans = travel_spans(ring.world, q.shape[1], bool(causal), sharding, tuple(window), alibi)
    own_block = forward = backward = Block(k, v)
    # The dK/dV accumulator of each travelling block follows it, gathering the gradient of every
    # rank it visits, and after its last hop goes straight back to the block's owner. It holds the
    # rows of the block's first hop, the most that any rank on its way computes.
    arriving = {1: None, -1: None}  # direction -> the accumulator posted to reach this rank
    own = None
    for step in range(max(behind, ahead) + 1):
        (to_next, next_lo), (to_prev, prev_lo) = post_hops(ring, step, behind, ahead, spans, forward, backward)
        blocks = blocks_at(step, ring.rank, ring.world, behind, ahead, own_block, forward, backward)
        for source, direction, block in blocks:
            pieces = plan(ring.rank, source, ring.world, q.shape[1], causal, sharding, window, alibi)
            dk, dv = _block_gradients(dout, dlse, q, block, out, lse, pieces, dq, settings, deterministic, acc_dtype)
            if direction == 0:
                own = [dk, dv]
                continue
            hops = behind if direction == 1 else ahead
            first = spans[direction, 1][0]
            if arriving[direction] is not None:  # what the ranks before this one on its way added
                acc_k, acc_v = received(arriving[direction])
                add_at(acc_k, acc_v, block.lo - first, dk, dv)
                dk, dv = acc_k, acc_v
            last = step == hops
            arriving[direction] = ring.exchange([dk, dv], direction * (-hops if last else 1))
        forward, backward = arrived(to_next, forward, next_lo), arrived(to_prev, backward, prev_lo)
    dk, dv = own
    for direction, pending in arriving.items():  # this rank's own block, home from each direction
        if pending is not None:
            add_at(dk, dv, spans[direction, 1][0], *received(pending))
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
