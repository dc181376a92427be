"""The packed ring's forward and backward passes over its plan (python/fattn/_ring_varlen_plan.py);
python/fattn/_ring_varlen_op.py makes them ops and joins them for autograd. The dense ring's design (python/fattn/_ring_passes.py)
on packed rows: each step's partial (out, lse) merges into an accumulator; K/V blocks travel
with only the rows the ranks ahead use; the backward's dK/dV accumulators travel with their
blocks and go straight home after the last hop; every gradient is computed against the global
out and lse."""

from __future__ import annotations

import torch

from ._checks import lse_dtype
from ._library import load_library
from ._ring_exchange import Ring, received
from ._ring_schedule import blocks_at
from ._ring_varlen_plan import Call, RowSet, VarlenPlan
from .merge import merge_attention_states

load_library()
_varlen_forward_op = torch.ops.fattn.varlen_forward.default
_varlen_backward_op = torch.ops.fattn.varlen_backward.default
_forward_op = torch.ops.fattn.forward.default
_backward_op = torch.ops.fattn.backward.default


def _take(t, index, dim=0):
    """Rows `index` (a slice: a view; else an index tensor: a gather) of t along dim."""
    if isinstance(index, slice):
        return t[index] if dim == 0 else t[:, index]
    return t.index_select(dim, index)


def _add_at(t, index, part, dim=0):
    """t[index] += part along dim, in place (index rows are distinct)."""
    if isinstance(index, slice):
        (t[index] if dim == 0 else t[:, index]).add_(part)
    else:
        t.index_add_(dim, index, part.to(t.dtype))


class PackedAccumulator:
    """A rank's running (out [rows, heads, d], lse [heads, rows]) in lse's precision, as the dense
    ring's Accumulator: empty rows (out 0, lse -inf), or the sinks' lse."""

    def __init__(self, q, sinks=None):
        acc_dtype = lse_dtype(q.dtype)
        n, h, d = q.shape
        self.out = torch.zeros(n, h, d, dtype=acc_dtype, device=q.device)
        self.lse = torch.full((h, n), float("-inf"), dtype=acc_dtype, device=q.device)
        if sinks is not None:
            self.lse.copy_(sinks.to(acc_dtype)[:, None].expand(h, n))
        # 1 for each row holding a partial already (a bytearray: its find runs at C speed over
        # the many slices of a call over many documents)
        self.filled = bytearray([0 if sinks is None else 1]) * n

    def add(self, index, row_slices, part_out, part_lse) -> None:
        """Merges a partial into the rows `index` (row_slices: the same rows as slices)."""
        if all(self.filled.find(1, s.start, s.stop) < 0 for s in row_slices):
            merged_out, merged_lse = part_out, part_lse  # into empty rows: the partial itself
        else:
            outs = torch.stack([_take(self.out, index), part_out.to(self.out.dtype)])[:, None]
            lses = torch.stack([_take(self.lse, index, 1), part_lse.to(self.lse.dtype)])[:, None]
            merged_out, merged_lse = (x[0] for x in merge_attention_states(outs, lses))
        if isinstance(index, slice):
            self.out[index], self.lse[:, index] = merged_out, merged_lse
        else:
            self.out.index_copy_(0, index, merged_out.to(self.out.dtype))
            self.lse.index_copy_(1, index, merged_lse.to(self.lse.dtype))
        for s in row_slices:
            self.filled[s] = b"\x01" * (s.stop - s.start)


class Options:
    """The settings the kernel calls take."""

    def __init__(self, softmax_scale, softcap, alibi_slopes, deterministic):
        self.softmax_scale, self.softcap, self.deterministic = softmax_scale, softcap, deterministic
        self.alibi_slopes = alibi_slopes

    def slopes(self, call: Call):
        """The ALiBi slopes of an ALiBi call's document ([heads] or its row of [documents, heads])."""
        s = self.alibi_slopes
        return s if s.dim() == 1 else s[call.alibi_doc]


def _call_forward(call: Call, q, k, v, o: Options):
    """(out [rows, heads, d], lse [heads, rows]) of one call."""
    qi, ki, cu_q, cu_k = call.tensors(q.device)
    qc, kc, vc = _take(q, qi), _take(k, ki), _take(v, ki)
    if call.alibi_doc is not None:
        out, lse = _forward_op(qc[None], kc[None], vc[None], o.softmax_scale, False, False, call.window_left,
                               call.window_right, o.softcap, alibi_slopes=o.slopes(call),
                               alibi_offset=call.alibi_offset)
        return out[0], lse[0]
    return _varlen_forward_op(qc, kc, vc, cu_q, cu_k, call.max_q, call.max_k, None, o.softmax_scale, False, False,
                              call.window_left, call.window_right, o.softcap)


def _call_backward(call: Call, dout, dlse, q, k, v, out, lse, dq, dk, dv, o: Options):
    """Adds one call's gradients into dq (this rank's rows) and dk, dv (the block's rows)."""
    qi, ki, cu_q, cu_k = call.tensors(q.device)
    qc, kc, vc, outc, doutc = _take(q, qi), _take(k, ki), _take(v, ki), _take(out, qi), _take(dout, qi)
    lsec, dlsec = _take(lse, qi, 1), None if dlse is None else _take(dlse, qi, 1)
    if call.alibi_doc is not None:
        dqc, dkc, dvc, _ = _backward_op(
            doutc[None], qc[None], kc[None], vc[None], outc[None], lsec[None], None if dlsec is None else dlsec[None],
            o.softmax_scale, False, o.deterministic, call.window_left, call.window_right, o.softcap,
            alibi_slopes=o.slopes(call), alibi_offset=call.alibi_offset)
        dqc, dkc, dvc = dqc[0], dkc[0], dvc[0]
    else:
        dqc, dkc, dvc = _varlen_backward_op(doutc, qc, kc, vc, outc, lsec, dlsec, cu_q, cu_k, call.max_q, call.max_k,
                                            None, o.softmax_scale, False, o.deterministic, call.window_left,
                                            call.window_right, o.softcap)
    _add_at(dq, qi, dqc)
    _add_at(dk, ki, dkc)
    _add_at(dv, ki, dvc)


class Travelling:
    """A K/V block (or its dK/dV accumulator) on its way: its tensors and the owner's rows they hold."""

    def __init__(self, k, v, held: RowSet):
        self.k, self.v, self.held = k, v, held

    def rows(self, wanted: RowSet) -> list[torch.Tensor]:
        """k and v of the rows `wanted` (inside held), contiguous for the point-to-point ops."""
        slices = wanted.slices_in(self.held)
        if len(slices) == 1 and slices[0] == slice(0, self.held.size):
            return [self.k.contiguous(), self.v.contiguous()]
        return [torch.cat([t[s] for s in slices]) if slices else t[:0].contiguous() for t in (self.k, self.v)]


def _post_hops(ring: Ring, plan: VarlenPlan, step, forward: Travelling, backward: Travelling):
    """Posts the next hop of each travelling block, carrying the rows the ranks ahead use:
    (pending, what arrives) per direction, None where the block has made its last hop."""
    posted = []
    for direction, hops, block in ((1, plan.behind, forward), (-1, plan.ahead, backward)):
        if step < hops:
            # The block held now came from rank - direction * step; the one coming, from one further.
            sent = block.rows(plan.held((ring.rank - direction * step) % ring.world, direction, step + 1))
            coming = plan.held((ring.rank - direction * (step + 1)) % ring.world, direction, step + 1)
            shapes = [(coming.size, *t.shape[1:]) for t in sent]
            posted.append((ring.exchange(sent, direction, shapes), coming))
        else:
            posted.append((None, None))
    return posted


def _arrived(posted, block: Travelling) -> Travelling:
    pending, coming = posted
    if pending is None:
        return block
    return Travelling(*received(pending), coming)


def ring_forward(q, k, v, sinks, ring: Ring, plan: VarlenPlan, o: Options):
    acc = PackedAccumulator(q, sinks)
    own = forward = backward = Travelling(k, v, plan.held(ring.rank, 1, 0))
    for step in range(max(plan.behind, plan.ahead) + 1):
        posted = _post_hops(ring, plan, step, forward, backward)
        for source, direction, block in blocks_at(step, ring.rank, ring.world, plan.behind, plan.ahead, own,
                                                  forward, backward):
            for call in plan.calls(ring.rank, source, direction, step):
                part_out, part_lse = _call_forward(call, q, block.k, block.v, o)
                acc.add(call.tensors(q.device)[0], call.q_slices, part_out, part_lse)
        forward, backward = _arrived(posted[0], forward), _arrived(posted[1], backward)
    return acc.out.to(q.dtype), acc.lse.to(lse_dtype(q.dtype))


def ring_backward(dout, dlse, q, k, v, out, lse, ring: Ring, plan: VarlenPlan, o: Options):
    acc_dtype = lse_dtype(q.dtype)
    dq = torch.zeros_like(q, dtype=acc_dtype)
    own_block = forward = backward = Travelling(k, v, plan.held(ring.rank, 1, 0))
    # Each travelling block's dK/dV accumulator follows it, holding the rows of its first hop
    # (the most any rank on its way computes with), and after its last hop goes straight home.
    arriving = {1: None, -1: None}
    own = None
    for step in range(max(plan.behind, plan.ahead) + 1):
        posted = _post_hops(ring, plan, step, forward, backward)
        blocks = blocks_at(step, ring.rank, ring.world, plan.behind, plan.ahead, own_block, forward, backward)
        for source, direction, block in blocks:
            dk = torch.zeros_like(block.k, dtype=acc_dtype)
            dv = torch.zeros_like(block.v, dtype=acc_dtype)
            for call in plan.calls(ring.rank, source, direction, step):
                _call_backward(call, dout, dlse, q, block.k, block.v, out, lse, dq, dk, dv, o)
            if direction == 0:
                own = [dk, dv]
                continue
            hops = plan.behind if direction == 1 else plan.ahead
            first = plan.held(source, direction, 1)
            if arriving[direction] is None:  # the block's first hop: its accumulator starts here
                acc_k, acc_v = dk, dv
            else:
                acc_k, acc_v = received(arriving[direction])
                for s, t in zip(block.held.slices_in(first), block.held.slices_in(block.held)):
                    acc_k[s] += dk[t]
                    acc_v[s] += dv[t]
            last = step == hops
            # Next: the accumulator of the block one hop further back on its way, or my own
            # block's from its last holder.
            nxt = ring.rank if last else (ring.rank - direction * (step + 1)) % ring.world
            size = plan.held(nxt, direction, 1).size
            shapes = [(size, *acc_k.shape[1:])] * 2
            arriving[direction] = ring.exchange([acc_k, acc_v], direction * (-hops if last else 1), shapes)
        forward, backward = _arrived(posted[0], forward), _arrived(posted[1], backward)
    dk, dv = own
    for direction, pending in arriving.items():  # this rank's own block, home from each direction
        if pending is not None:
            home_k, home_v = received(pending)
            first = plan.held(ring.rank, direction, 1)
            for s, t in zip(first.slices_in(plan.own[ring.rank]), first.slices_in(first)):
                dk[s] += home_k[t]
                dv[s] += home_v[t]
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
