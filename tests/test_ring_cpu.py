"""Ring attention on CPU: gloo worlds of 2, 3 and 4 processes against single-process attention."""


import pytest
import torch
import torch.distributed as dist

import fattn
from fattn.reference import attention_reference
from helpers import designed_p2p_ops, spawn_gloo
from fattn import _ring_exchange, _ring_passes, _ring_schedule
from fattn._ring_schedule import blocks_at, plan
from fattn.ring import ring_schedule, shard, simulate, unshard

BATCH, SEQLEN, HEADS, KV_HEADS, HEAD_DIM = 2, 24, 4, 2, 16  # 24 is divisible by 2 * world for 2, 3, 4


def _seqlen(world):
    """24 rows, or 6 per rank past world 4 (chunks of 3, as at world 4)."""
    return SEQLEN if world <= 4 else 6 * world


def _full_problem(seed=0, seqlen=SEQLEN):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, seqlen, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    k = torch.randn(BATCH, seqlen, KV_HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    v = torch.randn(BATCH, seqlen, KV_HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    w_out = torch.randn(BATCH, seqlen, HEADS, HEAD_DIM, generator=g, dtype=torch.float64)
    w_lse = torch.randn(BATCH, HEADS, seqlen, generator=g, dtype=torch.float64)
    return q, k, v, w_out, w_lse


# (causal, window_size, softcap, sinks, alibi): windows shorter and longer than a chunk (24 / (2 *
# world) rows), one-sided and two-sided, so that pieces are cut on both sides of the diagonal;
# ALiBi over global distances, alone and with a cut window and the softcap.
RING_VARIANTS = [(False, (-1, -1), 0.0, False, False), (True, (-1, -1), 0.0, False, False),
                 (True, (4, -1), 0.0, True, False), (False, (2, 7), 1.5, False, False),
                 (False, (-1, 3), 0.0, True, False), (False, (0, 0), 0.0, False, False),
                 (True, (-1, -1), 0.0, False, True), (False, (5, 2), 1.5, True, True)]


class _Counts:
    """P2P ops posted and forward / backward kernel calls made by fattn.ring, while installed."""

    def __enter__(self):
        self.rings, self.launches = [], {"forward": 0, "backward": 0}
        self._saved = (_ring_exchange.Ring.__init__, _ring_passes._forward_op, _ring_passes._backward_op)
        init, fwd, bwd = self._saved

        def counting_init(inner, group):
            init(inner, group)
            self.rings.append(inner)

        def counting(name, op):
            def call(*args, **kwargs):
                self.launches[name] += 1
                return op(*args, **kwargs)
            return call

        _ring_exchange.Ring.__init__ = counting_init
        _ring_passes._forward_op, _ring_passes._backward_op = counting("forward", fwd), counting("backward", bwd)
        return self

    def __exit__(self, *exc):
        _ring_exchange.Ring.__init__, _ring_passes._forward_op, _ring_passes._backward_op = self._saved

    @property
    def p2p_ops(self):
        return sum(r.p2p_ops for r in self.rings)


def _check_rank(rank, world):
    q, k, v, w_out, w_lse = _full_problem(seqlen=_seqlen(world))
    sink_values = torch.linspace(-1.0, 1.5, HEADS)
    slope_values = torch.linspace(0.05, 0.4, BATCH * HEADS).reshape(BATCH, HEADS)
    for causal, window, softcap, with_sinks, with_alibi in RING_VARIANTS:
        for sharding in ("zigzag", "contiguous"):
            # Single-process truth, with gradients of out and lse.
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_sinks = sink_values.clone().requires_grad_() if with_sinks else None
            slopes = slope_values if with_alibi else None
            ref_out, ref_lse = attention_reference(*leaves, None, causal, window_size=window, softcap=softcap,
                                                   sinks=ref_sinks, alibi_slopes=slopes)
            ((ref_out * w_out).sum() + (ref_lse * w_lse).sum()).backward()
            ref_grads = [t.grad for t in leaves]

            local = [shard(t, world, rank, sharding).clone().requires_grad_() for t in (q, k, v)]
            sinks = sink_values.clone().requires_grad_() if with_sinks else None
            with _Counts() as counts:
                out, lse = fattn.ring_flash_attn_func(*local, causal=causal, return_lse=True, sharding=sharding,
                                                      window_size=window, softcap=softcap, sinks=sinks,
                                                      alibi_slopes=slopes)
                loss = ((out * shard(w_out, world, rank, sharding)).sum()
                        + (lse * shard(w_lse, world, rank, sharding, dim=2)).sum())
                loss.backward()
            what = (f"rank {rank}/{world} causal={causal} window={window} softcap={softcap} sinks={with_sinks} "
                    f"alibi={with_alibi} {sharding}")
            # The steps the schedule runs, the P2P ops they post and the kernels they launch: none
            # for a step whose block no query of this rank sees, and no step after the last one
            # any rank needs.
            local_len = _seqlen(world) // world
            behind, ahead = ring_schedule(world, local_len, causal, sharding, window)
            pieces = sum(len(plan(rank, source, world, local_len, causal, sharding, window, with_alibi))
                         for step in range(max(behind, ahead) + 1)
                         for source, _, _ in blocks_at(step, rank, world, behind, ahead, None, None, None))
            assert counts.p2p_ops == designed_p2p_ops(behind, ahead), f"{what}: {counts.p2p_ops} P2P ops"
            assert counts.launches == {"forward": pieces, "backward": pieces}, f"{what}: {counts.launches}"
            if with_sinks:  # each rank's share of the sinks' gradient; summed, the whole
                dsinks = sinks.grad.clone()
                dist.all_reduce(dsinks)
                torch.testing.assert_close(dsinks, ref_sinks.grad, atol=1e-5, rtol=1e-5, msg=f"{what} dsinks")
            tol = 1e-10 * world  # float64: rounding grows with the number of merged steps
            torch.testing.assert_close(out, shard(ref_out, world, rank, sharding), atol=tol, rtol=tol, msg=what)
            torch.testing.assert_close(lse, shard(ref_lse, world, rank, sharding, dim=2), atol=tol, rtol=tol, msg=what)
            for got, want, name in zip((t.grad for t in local), ref_grads, ("dq", "dk", "dv")):
                torch.testing.assert_close(got, shard(want, world, rank, sharding), atol=tol, rtol=tol,
                                           msg=f"{what} {name}")


def _check_bad_input(rank, world):
    q, k, v, _, _ = _full_problem()
    local = [shard(t, world, rank) for t in (q, k, v)]
    # Unequal shards: rank 0 holds one row fewer (zigzag needs even shards, so drop two).
    uneven = [t[:, :-2] if rank == 0 else t for t in local]
    with pytest.raises(ValueError, match=r"rank 0 has shard length 10 but rank 1 has 12|"
                                         r"rank 1 has shard length 12 but rank 0 has 10"):
        fattn.ring_flash_attn_func(*uneven, causal=True)
    mixed = [t.float() if rank == 1 else t for t in local]
    with pytest.raises(ValueError, match=r"has dtype"):
        fattn.ring_flash_attn_func(*mixed, causal=True)
    with pytest.raises(ValueError, match=r"local length must be even"):
        fattn.ring_flash_attn_func(*(t[:, :-1] for t in local), causal=True)
    with pytest.raises(RuntimeError, match=r"window_size is \(-2, 0\); expected each side -1"):
        fattn.ring_flash_attn_func(*local, window_size=(-2, 0))
    with pytest.raises(RuntimeError, match=r"softcap"):
        fattn.ring_flash_attn_func(*local, softcap=-1.0)
    with pytest.raises(RuntimeError, match=r"alibi_slopes has shape \[3\]; expected \[heads\] = \[4\]"):
        fattn.ring_flash_attn_func(*local, alibi_slopes=torch.ones(3))
    # The shapes are checked before the per-head arguments that read them.
    with pytest.raises(ValueError, match=r"q must be \[batch, seqlen/world, heads, head_dim\], got shape"):
        fattn.ring_flash_attn_func(local[0][0, :, 0], *local[1:], sinks=torch.zeros(4), alibi_slopes=torch.ones(4))


def _check_traffic(rank, world):
    # What each hop carries, world 4, 6 rows per rank (k and v rows of 2 * 2 * 16 = 64 elements).
    # A causal window of 2 over contiguous shards: rank r's queries see rank r - 1's last 2 keys
    # and nothing before, so the one hop moves those 2 rows of k and v forward, again in the
    # backward, and their float64 dK/dV accumulator home: 3 exchanges of 2 x 2 x 64 elements.
    # Full causal attention moves whole blocks, 3 hops of 3 exchanges of 2 x 6 x 64.
    q, k, v, w_out, _ = _full_problem()
    local = [shard(t, world, rank, "contiguous").clone().requires_grad_() for t in (q, k, v)]
    for window, want in (((2, -1), 3 * 2 * 2 * 64), ((-1, -1), 3 * 3 * 2 * 6 * 64)):
        with _Counts() as counts:
            out = fattn.ring_flash_attn_func(*local, causal=True, sharding="contiguous", window_size=window)
            (out * shard(w_out, world, rank, "contiguous")).sum().backward()
        sent = sum(r.sent_elements for r in counts.rings)
        assert sent == want, f"rank {rank} window {window}: sent {sent} elements, want {want}"




# 1: a rank that is its own neighbour sends nothing; 8: blocks travel both ways over several hops
# (two-sided windows over contiguous shards, causal windows over zigzag ones).
# 3 and 8 ranks in the slow tier: an odd ring, and one whose blocks travel seven hops (4 added
# nothing those two do not check, for 17 s of CI).
@pytest.mark.parametrize("world", [1, 2] + [pytest.param(w, marks=pytest.mark.slow) for w in (3, 8)])
def test_ring_matches_single_process_attention(world):
    spawn_gloo(world, _check_rank)


def test_each_hop_carries_the_rows_later_ranks_use():
    spawn_gloo(4, _check_traffic)


def test_ring_bad_input_is_a_clear_error():
    spawn_gloo(2, _check_bad_input)


@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
def test_shard_unshard_round_trip(sharding):
    x = torch.arange(2 * 12 * 3).reshape(2, 12, 3)
    shards = [shard(x, 3, r, sharding) for r in range(3)]
    assert all(s.shape == (2, 4, 3) for s in shards)
    torch.testing.assert_close(unshard(shards, sharding), x)
    if sharding == "zigzag":  # rank 0 holds the first and the last chunk
        torch.testing.assert_close(shards[0], torch.cat([x[:, 0:2], x[:, 10:12]], dim=1))


@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [(-1, -1), (0, 0), (1, 1), (3, 0), (2, 9), (-1, 5), (7, -1), (30, 30)])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_simulate_matches_full_attention(world, window, causal, sharding):
    q, k, v, _, _ = _full_problem(seed=world)
    out, lse = simulate(q, k, v, world, causal=causal, sharding=sharding, return_lse=True, window_size=window)
    want_out, want_lse = attention_reference(q, k, v, None, causal, window_size=window)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


@pytest.mark.parametrize("sharding", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 9)), (True, (7, -1))])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_simulate_with_alibi_matches_full_attention(world, causal, window, sharding):
    # ALiBi's distances are global: every piece carries its own alibi_offset, and a zigzag shard's
    # two chunks are computed apart.
    q, k, v, _, _ = _full_problem(seed=world)
    slopes = torch.rand(HEADS, dtype=torch.float32) * 0.5 + 0.05
    out, lse = simulate(q, k, v, world, causal=causal, sharding=sharding, return_lse=True, window_size=window,
                        alibi_slopes=slopes)
    want_out, want_lse = attention_reference(q, k, v, None, causal, window_size=window, alibi_slopes=slopes)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


@pytest.mark.parametrize("world, sharding, causal, window, schedule", [
    (4, "contiguous", True, (-1, -1), (3, 0)), (4, "contiguous", True, (2, -1), (1, 0)),
    (4, "contiguous", True, (4, -1), (1, 0)), (4, "contiguous", True, (7, -1), (2, 0)),
    (4, "contiguous", True, (12, -1), (2, 0)), (4, "contiguous", True, (13, -1), (3, 0)),
    (4, "contiguous", False, (0, 0), (0, 0)), (4, "contiguous", False, (-1, 3), (3, 0)),
    (4, "contiguous", False, (2, 7), (3, 0)), (8, "contiguous", False, (2, 7), (1, 2)),
    (4, "zigzag", True, (2, -1), (1, 1)), (3, "zigzag", True, (2, -1), (2, 0)), (8, "zigzag", True, (7, -1), (3, 3)),
    (4, "zigzag", False, (0, 0), (0, 0)), (4, "zigzag", True, (-1, -1), (3, 0)),
])
def test_ring_schedule_ends_where_the_window_ends(world, sharding, causal, window, schedule):
    # 6 rows per rank (chunks of 3). Contiguous, causal: rank r's first query, at 6r, reaches back
    # to 6r - left, which lies on rank r - 1 for left <= 6, on r - 2 up to 12, on r - 3 beyond: the
    # hops its K/V block must make forward. A two-sided window also needs the ranks after: past
    # world 4, sending blocks both ways takes fewer hops (1 + 2 for a right edge of 7 at world 8)
    # than the one-way ring (7). Zigzag puts each rank's second chunk next to the previous rank's
    # first: a small causal window needs one hop each way (at world 3, two hops one way tie and
    # the one-way ring is kept). Full attention keeps the one-way ring.
    assert ring_schedule(world, 6, causal, sharding, window) == schedule


def test_skipped_steps_launch_nothing():
    # Contiguous, causal window of 2 over 6-row shards, world 4: rank r computes its own shard in
    # one piece (a contiguous shard is one run of positions) and, but for rank 0, at step 1 its
    # first two rows against rank r - 1's last two keys: 7 launches in 2 steps (a one-way ring of
    # all 4 would not add any). A piece whose rows hold no partial yet is copied in, not merged:
    # only the step-1 pieces merge, 3 of them.
    q, k, v, _, _ = _full_problem()
    merges = []
    merge = _ring_passes.merge_attention_states
    _ring_passes.merge_attention_states = lambda *args: merges.append(1) or merge(*args)
    try:
        with _Counts() as counts:
            out = simulate(q, k, v, 4, causal=True, sharding="contiguous", window_size=(2, -1))
    finally:
        _ring_passes.merge_attention_states = merge
    assert counts.launches["forward"] == 7
    assert len(merges) == 3
    torch.testing.assert_close(out, attention_reference(q, k, v, None, True, window_size=(2, -1))[0])


@pytest.mark.parametrize("causal, window", [(True, (2, -1)), (False, (2, 7)), (True, (7, -1)), (False, (0, 0))])
@pytest.mark.parametrize("world", [2, 3])
def test_odd_contiguous_shards_under_a_window(world, causal, window):
    # Contiguous shards of an odd length (5 rows): the window's pieces take each shard whole,
    # where halving it into two chunks would drop its last row.
    q, k, v, _, _ = _full_problem(seed=world, seqlen=5 * world)
    slopes = torch.rand(HEADS, dtype=torch.float32) * 0.5 + 0.05
    for alibi in (None, slopes):
        out, lse = simulate(q, k, v, world, causal=causal, sharding="contiguous", return_lse=True,
                            window_size=window, alibi_slopes=alibi)
        want_out, want_lse = attention_reference(q, k, v, None, causal, window_size=window, alibi_slopes=alibi)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(lse, want_lse)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_each_hop_holds_every_row_its_ranks_use(world):
    # What a hop carries (fattn._ring_schedule.travel_spans) against what the pieces read: at every step
    # each rank's pieces of a travelling block read K/V rows inside the rows that block holds
    # there, and each hop's rows lie inside the previous hop's (a rank forwards a slice of what it
    # received). Shards of 6 to 24 rows, both shardings, causal and not, windows one- and
    # two-sided, shorter and longer than a chunk, with and without ALiBi's per-chunk plans.
    windows = [(-1, -1), (0, 0), (1, 1), (2, -1), (4, -1), (7, -1), (13, -1), (2, 7), (-1, 3), (5, 2), (30, 30),
               (0, 40)]
    for local_len in (6, 8, 12, 24):
        for sharding in ("zigzag", "contiguous"):
            for causal in (False, True):
                for window in windows:
                    for alibi in (False, True):
                        behind, ahead = ring_schedule(world, local_len, causal, sharding, window)
                        spans = _ring_schedule.travel_spans(world, local_len, causal, sharding, window, alibi)
                        what = f"world {world} len {local_len} {sharding} causal={causal} window={window} alibi={alibi}"
                        assert set(spans) == {(1, h) for h in range(1, behind + 1)} | \
                            {(-1, h) for h in range(1, ahead + 1)}, what
                        for (direction, hop), (lo, hi) in spans.items():
                            assert 0 <= lo < hi <= local_len, what
                            if hop > 1:
                                before = spans[direction, hop - 1]
                                assert before[0] <= lo and hi <= before[1], f"{what}: hop {hop} not nested"
                        for rank in range(world):
                            for step in range(max(behind, ahead) + 1):
                                for source, direction, _ in blocks_at(step, rank, world, behind, ahead,
                                                                       None, None, None):
                                    lo, hi = spans[direction, step] if direction else (0, local_len)
                                    for p in plan(rank, source, world, local_len, causal, sharding, window, alibi):
                                        assert lo <= p.kv_rows.start and p.kv_rows.stop <= hi, \
                                            f"{what}: rank {rank} step {step} reads {p.kv_rows} outside {(lo, hi)}"
