"""Context parallelism on CPU: the packed-batch layout, the head-parallel all-to-all (Ulysses) and
the ring over packed documents, in gloo worlds of 1 to 5 processes, against float64
single-process attention of the whole batch (out, lse and every gradient)."""


import pytest
import torch
import torch.distributed as dist

import fattn
from fattn._cp_sharding import packed_layout
from fattn._ring_schedule import blocks_at
from fattn._ring_varlen_passes import Options, PackedAccumulator, _call_forward
from fattn._ring_varlen_plan import varlen_plan
from fattn.reference import attention_reference
from fattn.ring import shard
from fattn.ulysses import kv_heads_of_ranks
from helpers import spawn_gloo

HEAD_DIM = 8
# Odd lengths, an empty document, documents shorter than the world (1 and 2 rows), one long one.
DOC_LENGTHS = [7, 0, 2, 13, 1, 9]

# (causal, window_size, softcap, sinks, alibi): windows shorter and longer than a chunk, one- and
# two-sided; ALiBi alone and with a cut window and the softcap.
VARIANTS = [(False, (-1, -1), 0.0, False, False), (True, (-1, -1), 0.0, False, False),
            (True, (3, -1), 0.0, True, False), (False, (2, 5), 1.5, False, False),
            (False, (-1, 2), 0.0, True, False), (False, (0, 0), 0.0, False, False),
            (True, (-1, -1), 0.0, False, True), (False, (4, 1), 1.5, True, True)]
FAST_VARIANTS = [VARIANTS[1], VARIANTS[7]]  # causal; everything at once


def _cu(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _heads(world):
    """Query heads that split over the world, and 2 KV heads: an even split at world 2, shared
    (replicated) KV heads at world 4, a split that straddles a KV group at worlds 3 and 5."""
    return 2 * world, 2


# ---------------------------------------------------------------- the layout, no process group

@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_shard_varlen_round_trip_and_balance(world):
    cu = _cu(DOC_LENGTHS + [30, 5])
    x = torch.arange(cu[-1] * 2).reshape(cu[-1], 2)
    shards = [fattn.shard_varlen(x, cu, world, r) for r in range(world)]
    torch.testing.assert_close(fattn.unshard_varlen(shards, torch.tensor(cu, dtype=torch.int32)), x)
    # The remainders go round the ranks over the batch: shard sizes differ by at most one row.
    sizes = [s.shape[0] for s in shards]
    assert max(sizes) - min(sizes) <= 1, sizes
    for r in range(world):
        info = fattn.varlen_shard_layout(cu, world, r)
        assert info.cu_seqlens.dtype == torch.int32 and info.cu_seqlens[-1] == sizes[r]
        torch.testing.assert_close(shards[r][:, 0], x[info.rows, 0])
        lengths = (info.cu_seqlens[1:] - info.cu_seqlens[:-1]).tolist()
        assert info.max_seqlen == max(lengths)
        for d, (start, n) in enumerate(zip(info.cu_seqlens.tolist(), lengths)):
            # Each rank's part of a document: chunk r, then chunk 2 * world - 1 - r, positions rising in each.
            positions = info.positions[start:start + n]
            torch.testing.assert_close(info.rows[start:start + n], positions + cu[d])


def test_zigzag_chunks_of_a_document():
    # 7 rows over 2 ranks: 4 chunks of 1 and 3 remainder rows, to ranks 0 and 1's first chunks
    # (chunks 0 and 1), then to rank 0's second (chunk 3). 13 rows: chunks of 3 and one remainder
    # row, to the next rank in turn (rank 1, its first chunk: chunk 1).
    layout = packed_layout((0, 7, 20), 2)
    assert layout.bounds[0] == (0, 2, 4, 5, 7)
    assert layout.bounds[1] == (0, 3, 7, 10, 13)
    assert [(run.position, run.length) for run in layout.runs(0)[1]] == [(0, 3), (10, 3)]
    assert [(run.position, run.length) for run in layout.runs(1)[1]] == [(3, 4), (7, 3)]


def test_sharding_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"start at 0 and never decrease"):
        fattn.shard_varlen(torch.zeros(5), [0, 3, 2], 2, 0)
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, world = 2\)"):
        fattn.varlen_shard_layout([0, 4], 2, 2)
    with pytest.raises(ValueError, match=r"x has 3 rows along dim 0 but cu_seqlens ends at 4"):
        fattn.shard_varlen(torch.zeros(3), [0, 4], 2, 0)
    with pytest.raises(ValueError, match=r"rank 1's shard has 1 rows"):
        fattn.unshard_varlen([torch.zeros(2), torch.zeros(1)], [0, 4])


@pytest.mark.parametrize("heads, kv_heads, world, want", [
    (8, 4, 2, [[0, 1], [2, 3]]),  # an even split
    (8, 2, 4, [[0], [0], [1], [1]]),  # fewer KV heads than ranks: each shared by two ranks
    (8, 1, 8, [[0]] * 8),  # MQA
    (6, 2, 3, [[0, 0], [0, 1], [1, 1]]),  # rank 1's heads 2, 3 read KV heads 0 and 1
    (10, 2, 5, [[0, 0], [0, 0], [0, 1], [1, 1], [1, 1]]),
])
def test_kv_heads_of_ranks(heads, kv_heads, world, want):
    assert kv_heads_of_ranks(heads, kv_heads, world) == want


def test_ulysses_heads_must_split_over_the_world():
    with pytest.raises(ValueError, match=r"the 6 query heads do not split over 4 ranks"):
        kv_heads_of_ranks(6, 2, 4)


# ---------------------------------------------------------------- references

def _packed_reference(q, k, v, cu, causal, window_size, softcap, sinks, alibi_slopes):
    """float64 attention of every document on its own: out [total, heads, d], lse [heads, total]."""
    outs, lses = [], []
    for d, (a, b) in enumerate(zip(cu, cu[1:])):
        if a == b:
            continue
        doc_slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[d])
        out, lse = attention_reference(q[None, a:b], k[None, a:b], v[None, a:b], None, causal, window_size=window_size,
                                       softcap=softcap, sinks=sinks, alibi_slopes=doc_slopes)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def _problem(shape_q, shape_kv, shape_lse, seed):
    """q, k, v and the weights of out and lse in the loss: the same on every rank (a seeded
    generator; each spawned process's own generator differs)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g, dtype=torch.float64)
    k, v = (torch.randn(*shape_kv, generator=g, dtype=torch.float64) for _ in range(2))
    w_out = torch.randn(*shape_q, generator=g, dtype=torch.float64)
    w_lse = torch.randn(*shape_lse, generator=g, dtype=torch.float64)
    return q, k, v, w_out, w_lse


def _variant_args(variant, heads, slopes_rows):
    causal, window, softcap, with_sinks, with_alibi = variant
    sinks = torch.linspace(-1.0, 1.5, heads).requires_grad_() if with_sinks else None
    slopes = torch.linspace(0.05, 0.4, slopes_rows * heads).reshape(slopes_rows, heads) if with_alibi else None
    return dict(causal=causal, window_size=window, softcap=softcap, sinks=sinks, alibi_slopes=slopes)


def _check_close(what, got, want, world):
    # float64: rounding grows with the number of merged pieces; the sinks are float32
    tol = 1e-5 if got.dtype == torch.float32 else 1e-10 * world
    torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def _check_sinks(what, sinks, ref_sinks, world):
    if sinks is not None:  # each rank's share of the sinks' gradient; summed, the whole
        dsinks = sinks.grad.clone()
        dist.all_reduce(dsinks)
        _check_close(f"{what} dsinks", dsinks, ref_sinks.grad, world)


# ---------------------------------------------------------------- the packed ring's plan, in one process

def _simulate_packed_ring(q, k, v, cu, world, causal, window, slopes):
    """The packed ring's forward for `world` virtual ranks in one process: each rank's calls
    against each block as the plan has it arrive (only the rows its hop carries)."""
    plan = varlen_plan(tuple(cu), world, causal, window, slopes is not None)
    qs, ks, vs = ([fattn.shard_varlen(t, cu, world, r) for r in range(world)] for t in (q, k, v))
    options = Options(None, 0.0, slopes, False)
    outs, lses = [], []
    for rank in range(world):
        acc = PackedAccumulator(qs[rank])
        for step in range(max(plan.behind, plan.ahead) + 1):
            for source, direction, _ in blocks_at(step, rank, world, plan.behind, plan.ahead, None, None, None):
                held = [i for a, b in plan.held(source, direction, step).intervals for i in range(a, b)]
                for call in plan.calls(rank, source, direction, step):
                    out, lse = _call_forward(call, qs[rank], ks[source][held], vs[source][held], options)
                    acc.add(call.tensors(q.device)[0], call.q_slices, out, lse)
        outs.append(acc.out)
        lses.append(acc.lse)
    return fattn.unshard_varlen(outs, cu), fattn.unshard_varlen(lses, cu, dim=1)


WINDOWS = [(-1, -1), (0, 0), (1, 1), (3, -1), (2, 5), (-1, 2), (7, -1), (40, 40), (0, 12)]


@pytest.mark.parametrize("world", [2, 3] + [pytest.param(w, marks=pytest.mark.slow) for w in (1, 4, 5, 8)])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_ring_plan_matches_attention(world, causal):
    # Every pair of runs cut to its window (shorter and longer than the chunks, one- and
    # two-sided), ALiBi's offsets, and each hop's rows, without a process group.
    cu = _cu(DOC_LENGTHS + [30])
    g = torch.Generator().manual_seed(world)
    q = torch.randn(cu[-1], 4, HEAD_DIM, generator=g, dtype=torch.float64)
    k, v = (torch.randn(cu[-1], 2, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
    for window in WINDOWS:
        for slopes in (None, torch.linspace(0.1, 0.5, 4)):
            out, lse = _simulate_packed_ring(q, k, v, cu, world, causal, window, slopes)
            want_out, want_lse = _packed_reference(q, k, v, cu, causal, window, 0.0, None, slopes)
            what = f"world {world} causal={causal} window={window} alibi={slopes is not None}"
            torch.testing.assert_close(out, want_out, atol=1e-10, rtol=1e-10, msg=lambda m: f"{what}: {m}")
            torch.testing.assert_close(lse, want_lse, atol=1e-10, rtol=1e-10, msg=lambda m: f"{what}: {m}")


def test_packed_ring_hops_carry_only_rows_ahead_use():
    # World 4, one document of 64 rows: chunks of 8, rank r holding positions [8r, 8r + 8) and
    # [56 - 8r, 64 - 8r). Plain causal attention: a block's first hops go to later ranks, whose
    # both chunks follow its first chunk and precede its second, so they carry the first chunk
    # alone until a hop reaches a rank before the owner. A causal window of 4 reaches back only
    # into the chunk just before: 4 rows of it, one hop each way (the second chunks' neighbours
    # are the next rank's).
    plan = varlen_plan((0, 64), 4, True, (-1, -1), False)
    assert (plan.behind, plan.ahead) == (3, 0)
    assert plan.sets[0, 1, 1].intervals == ((0, 8),)  # rank 0's block: ranks 1, 2, 3 need its first chunk
    assert plan.sets[2, 1, 1].intervals == ((0, 16),)  # rank 2's: rank 3 its first chunk, ranks 0, 1 both
    assert plan.sets[2, 1, 2].intervals == ((0, 16),)
    windowed = varlen_plan((0, 64), 4, True, (4, -1), False)
    assert (windowed.behind, windowed.ahead) == (1, 1)
    assert windowed.sets[1, 1, 1].intervals == ((4, 8),)  # rank 2 sees positions 12-15 of rank 1's chunk 1
    assert windowed.sets[1, -1, 1].intervals == ((12, 16),)  # rank 0's chunk 7 sees 52-55 of rank 1's chunk 6
    for rank in range(4):  # each hop's rows inside the previous hop's: a rank forwards part of what it got
        for direction, hops in ((1, plan.behind), (-1, plan.ahead)):
            for hop in range(2, hops + 1):
                inner, outer = plan.sets[rank, direction, hop], plan.sets[rank, direction, hop - 1]
                assert all(any(a <= c and d <= b for a, b in outer.intervals) for c, d in inner.intervals)


def test_packed_ring_calls_share_kernels():
    # Plain causal attention over many documents: one varlen call per (rank, block) pair,
    # whatever the number of documents (the full pairs of a document coalesce; documents are a
    # call's sequences), where ALiBi needs one call per pair of chunks that meet.
    cu = _cu([5, 9, 12, 3, 0, 20, 7])
    plain, alibi = (varlen_plan(tuple(cu), 3, True, (-1, -1), a) for a in (False, True))
    for rank in range(3):
        for step in range(plain.behind + 1):
            source = (rank - step) % 3
            assert len(plain.calls(rank, source, 1 if step else 0, step)) <= 1
    assert len(alibi.calls(0, 2, 1, 1)) > 1  # rank 0's second chunk against both of rank 2's, per document


# ---------------------------------------------------------------- Ulysses, in a process group

def _check_ulysses_dense(rank, world, variants, product=None):
    """ulysses_flash_attn_func against attention_reference; with product = (groups, part), the
    product with the ring: `part(t, sharding, dim)` is this rank's part of a full tensor."""
    heads, kv_heads = _heads(world)
    batch, seqlen = 2, 6 * world
    q, k, v, w_out, w_lse = _problem((batch, seqlen, heads, HEAD_DIM), (batch, seqlen, kv_heads, HEAD_DIM),
                                     (batch, heads, seqlen), world)
    groups, part = product or ({}, lambda t, sharding, dim=1: shard(t, world, rank, sharding, dim))
    for variant in variants:
        for sharding in ("zigzag", "contiguous"):
            ref = _variant_args(variant, heads, batch)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_out, ref_lse = attention_reference(*leaves, None, ref["causal"], window_size=ref["window_size"],
                                                   softcap=ref["softcap"], sinks=ref["sinks"],
                                                   alibi_slopes=ref["alibi_slopes"])
            ((ref_out * w_out).sum() + (ref_lse * w_lse).sum()).backward()
            args = _variant_args(variant, heads, batch)
            local = [part(t, sharding).clone().requires_grad_() for t in (q, k, v)]
            out, lse = fattn.ulysses_flash_attn_func(*local, return_lse=True, sharding=sharding, **groups, **args)
            ((out * part(w_out, sharding)).sum() + (lse * part(w_lse, sharding, dim=2)).sum()).backward()
            what = f"ulysses rank {rank}/{world} {variant} {sharding} product={product is not None}"
            _check_close(what, out, part(ref_out, sharding), world)
            _check_close(f"{what} lse", lse, part(ref_lse, sharding, dim=2), world)
            for got, leaf, name in zip(local, leaves, ("dq", "dk", "dv")):
                _check_close(f"{what} {name}", got.grad, part(leaf.grad, sharding), world)
            _check_sinks(what, args["sinks"], ref["sinks"], world)


def _check_packed(rank, world, variants, attention, lengths=DOC_LENGTHS, product=None):
    """`attention` (a varlen context-parallel function) against _packed_reference; product as in
    _check_ulysses_dense, `part(t, cu, dim)`."""
    heads, kv_heads = _heads(world)
    cu = _cu(lengths)
    total = cu[-1]
    q, k, v, w_out, w_lse = _problem((total, heads, HEAD_DIM), (total, kv_heads, HEAD_DIM), (heads, total),
                                     100 + world)
    groups, part = product or ({}, lambda t, cu, dim=0: fattn.shard_varlen(t, cu, world, rank, dim))
    for variant in variants:
        for per_document_slopes in ((False, True) if variant[4] else (False,)):
            rows = len(lengths) if per_document_slopes else None
            ref = _variant_args(variant, heads, rows or 1)
            args = _variant_args(variant, heads, rows or 1)
            if not per_document_slopes and ref["alibi_slopes"] is not None:
                ref["alibi_slopes"], args["alibi_slopes"] = ref["alibi_slopes"][0], args["alibi_slopes"][0]
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_out, ref_lse = _packed_reference(*leaves, cu, **ref)
            ((ref_out * w_out).sum() + (ref_lse * w_lse).sum()).backward()
            local = [part(t, cu).clone().requires_grad_() for t in (q, k, v)]
            out, lse = attention(*local, torch.tensor(cu, dtype=torch.int32), return_lse=True, **groups, **args)
            ((out * part(w_out, cu)).sum() + (lse * part(w_lse, cu, dim=1)).sum()).backward()
            what = (f"{attention.__name__} rank {rank}/{world} {variant} per-document slopes={per_document_slopes} "
                    f"product={product is not None}")
            _check_close(what, out, part(ref_out, cu), world)
            _check_close(f"{what} lse", lse, part(ref_lse, cu, dim=1), world)
            for got, leaf, name in zip(local, leaves, ("dq", "dk", "dv")):
                _check_close(f"{what} {name}", got.grad, part(leaf.grad, cu), world)
            _check_sinks(what, args["sinks"], ref["sinks"], world)


def _check_product(rank, world, ulysses_world):
    """The all-to-all over groups of `ulysses_world` consecutive ranks, the ring across them."""
    ring_world = world // ulysses_world
    ring_rank, ulysses_rank = divmod(rank, ulysses_world)
    # Every rank creates every group, in one order.
    ulysses_groups = [dist.new_group([r * ulysses_world + u for u in range(ulysses_world)]) for r in range(ring_world)]
    ring_groups = [dist.new_group([r * ulysses_world + u for r in range(ring_world)]) for u in range(ulysses_world)]
    groups = dict(group=ulysses_groups[ring_rank], ring_group=ring_groups[ulysses_rank])

    def dense_part(t, sharding, dim=1):
        return shard(t, ring_world, ring_rank, sharding, dim).tensor_split(ulysses_world, dim)[ulysses_rank]

    def packed_part(t, cu, dim=0):
        return fattn.shard_varlen(t, cu, ring_world, ring_rank, dim).tensor_split(ulysses_world, dim)[ulysses_rank]

    # Each feature once (the every-variant runs hold each scheme to all of them).
    variants = [VARIANTS[i] for i in (1, 2, 3, 7)]
    _check_ulysses_dense(rank, world, variants, (groups, dense_part))
    _check_packed(rank, world, variants, fattn.ulysses_flash_attn_varlen_func, product=(groups, packed_part))


def _check_ring_bad_input(rank, world):
    heads, kv_heads = _heads(world)
    cu = _cu(DOC_LENGTHS)
    q, k, v, _, _ = _problem((cu[-1], heads, HEAD_DIM), (cu[-1], kv_heads, HEAD_DIM), (heads, cu[-1]), 0)
    local = [fattn.shard_varlen(t, cu, world, rank) for t in (q, k, v)]
    other = _cu(DOC_LENGTHS[:-1] + [DOC_LENGTHS[-1] + world])  # the last document longer, on every rank alike
    mixed = cu if rank == 0 else other
    mixed_local = local if rank == 0 else [fattn.shard_varlen(torch.cat([t, t[:world]]), other, world, rank)
                                           for t in (q, k, v)]
    with pytest.raises(ValueError, match=r"has total rows|has cu_seqlens checksum"):
        fattn.ring_flash_attn_varlen_func(*mixed_local, mixed, causal=True)
    with pytest.raises(ValueError, match=r"part of the batch is \d+ rows"):
        fattn.ring_flash_attn_varlen_func(*(t[1:] for t in local), cu)
    with pytest.raises(ValueError, match=r"start at 0 and never decrease"):
        fattn.ring_flash_attn_varlen_func(*local, [0, 5, 3])
    with pytest.raises(RuntimeError, match=rf"alibi_slopes has shape \[2, {heads}\]"):
        fattn.ring_flash_attn_varlen_func(*local, cu, alibi_slopes=torch.ones(2, heads))


def _check_every_variant(rank, world):
    _check_ulysses_dense(rank, world, VARIANTS)
    for attention in (fattn.ulysses_flash_attn_varlen_func, fattn.ring_flash_attn_varlen_func):
        _check_packed(rank, world, VARIANTS, attention)


def _check_fast(rank, world):
    _check_ulysses_dense(rank, world, FAST_VARIANTS)
    for attention in (fattn.ulysses_flash_attn_varlen_func, fattn.ring_flash_attn_varlen_func):
        _check_packed(rank, world, FAST_VARIANTS, attention)
    _check_ring_bad_input(rank, world)


def _check_compiled(rank, world):
    # The all-to-alls trace into one graph and each ring is one opaque op (fullgraph: a graph
    # break raises), forward and backward; the compiled step gives the eager one's out and
    # gradients, and a second batch (new offsets, in a tensor) reuses the ring's graph.
    heads, kv_heads = _heads(world)
    cu = _cu(DOC_LENGTHS)
    dense = _problem((2, 6 * world, heads, HEAD_DIM), (2, 6 * world, kv_heads, HEAD_DIM), (1,), 7)[:3]
    packed = _problem((cu[-1], heads, HEAD_DIM), (cu[-1], kv_heads, HEAD_DIM), (1,), 8)[:3]
    sinks = torch.linspace(-1.0, 1.0, heads)

    def ring(q, k, v, cu_seqlens):
        return fattn.ring_flash_attn_varlen_func(q, k, v, cu_seqlens, causal=True, window_size=(4, -1), sinks=sinks)

    cases = [(lambda q, k, v: fattn.ulysses_flash_attn_func(q, k, v, causal=True, window_size=(5, -1)),
              [shard(t, world, rank) for t in dense], ()),
             (lambda q, k, v: fattn.ring_flash_attn_func(q, k, v, causal=True, window_size=(5, -1), sinks=sinks),
              [shard(t, world, rank) for t in dense], ()),
             (lambda q, k, v: fattn.ulysses_flash_attn_varlen_func(q, k, v, cu, 13, causal=True),
              [fattn.shard_varlen(t, cu, world, rank) for t in packed], ()),
             (ring, [fattn.shard_varlen(t, cu, world, rank) for t in packed], (torch.tensor(cu),))]
    for fn, inputs, extra in cases:
        results = []
        for step in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
            leaves = [t.clone().requires_grad_() for t in inputs]
            out = step(*leaves, *extra)
            (out * out).sum().backward()
            results.append([out] + [t.grad for t in leaves])
        for got, want in zip(*results):
            _check_close(f"compiled rank {rank}", got, want, world)
    # Offsets are data, not constants of the graph: a new batch (shapes symbolic) compiles nothing.
    compiled = torch.compile(lambda q, k, v, cu_seqlens: ring(q, k, v, cu_seqlens), backend="aot_eager",
                             fullgraph=True, dynamic=True)
    for i, lengths in enumerate((DOC_LENGTHS, [3, 11, 0, 18, 4])):
        other = _cu(lengths)
        q, k, v = _problem((other[-1], heads, HEAD_DIM), (other[-1], kv_heads, HEAD_DIM), (1,), 9)[:3]
        local = [fattn.shard_varlen(t, other, world, rank).requires_grad_() for t in (q, k, v)]
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            got = compiled(*local, torch.tensor(other))
        _check_close(f"compiled ring, batch {lengths}", got, ring(*local, torch.tensor(other)), world)


def _check_product_of_pairs(rank, world):
    _check_product(rank, world, 2)




# One spawn per world runs every check (a spawn costs seconds).
def test_context_parallel_matches_single_process_attention():
    # World 3: the remainders of odd documents, a straddled KV group (6 heads over 2 KV heads).
    spawn_gloo(3, _check_fast)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_context_parallel_every_variant(world):
    spawn_gloo(world, _check_every_variant)


@pytest.mark.slow
def test_context_parallel_compiles_without_graph_breaks():
    spawn_gloo(2, _check_compiled)


@pytest.mark.slow
def test_ulysses_times_ring_matches_single_process_attention():
    # 4 ranks: all-to-all over pairs, the ring across them; 8 query heads, 2 KV heads.
    spawn_gloo(4, _check_product_of_pairs)
