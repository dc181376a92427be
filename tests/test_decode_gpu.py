"""fattn.flash_attn_with_kvcache (torch.ops.fattn.decode) on a GPU against the float64
kvcache_reference (skipped without a GPU).

Accuracy is flash-attn's rule: max|fattn - ref64| <= 2 * max|ref_in_q_dtype - ref64| + 1e-5,
the lse -inf pattern exact and |lse - ref64| <= 5e-3 (check_outputs in tests/helpers/kvcache.py).
Every call's cache is checked after the in-place append: the new tokens at
cache_seqlens[b] + i, every other byte of the cache's storage unchanged.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fattn
from helpers import (KVCache, check_outputs, fp8_kernels_on, launch_grids, new_tokens, poison_allocator, references,
                     requires_gpu, seqlens_tensor, skip_without_ptx)

pytestmark = [requires_gpu, pytest.mark.gpu]

DEV = "cuda"
MIXED = [1, 17, 1000, 8191]           # one batch, lengths from a token to a long context
LONG = [1, 17, 1000, 8191, 65536]     # the same with a 64k context (capacity >= 65536 + 5)


def _poison(batch, seqlen_q, heads, head_dim, dtype):
    # The outputs, and big fp32 blocks for the split-K partials (the caching allocator
    # splits them for any later large request): unwritten memory then reads as NaN.
    poison_allocator(((batch, seqlen_q, heads, head_dim), dtype), ((batch, heads, seqlen_q), torch.float32),
                     ((64 << 20,), torch.float32), *[((1 << 18,), torch.float32)] * 4, device=DEV)


def decode_case(lengths, seqlen_q, heads, kv_heads, head_dim, dtype, page_size=None, seqlen_new=0, causal=True,
                window=(-1, -1), softcap=0.0, softmax_scale=None, num_splits=0, layout="contiguous", cache=None,
                what="", alibi=False):
    """Build (or reuse) a cache, run one decode step on the GPU and check it. Returns (out, lse, cache)."""
    batch = len(lengths)
    if cache is None:
        capacity = max(lengths) + seqlen_new + 3
        cache = KVCache(batch, capacity, kv_heads, head_dim, dtype, DEV, page_size, layout)
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=DEV)
    k, v = new_tokens(batch, seqlen_new, kv_heads, head_dim, dtype, DEV)
    cache_seqlens = seqlens_tensor(lengths, DEV)
    kw = dict(softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap)
    if alibi:  # ALiBi's slopes 2^(-8 i / heads), one set per sequence
        kw["alibi_slopes"] = (2.0 ** (-8.0 * torch.arange(1, heads + 1, device=DEV) / heads)).expand(batch, heads)
    what = what or (f"len={lengths} sq={seqlen_q} h={heads}/{kv_heads} d={head_dim} {dtype} page={page_size} "
                    f"new={seqlen_new} {kw} splits={num_splits} {layout}")
    # The reference first: it reads the cache as it is before the op's append.
    ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, cache_seqlens, cache.block_table, k, v, **kw)
    snap = cache.snapshot()
    _poison(batch, seqlen_q, heads, head_dim, dtype)
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                             block_table=cache.block_table, num_splits=num_splits, return_lse=True,
                                             **kw)
    torch.cuda.synchronize()
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=what)
    cache.check_append(snap, k, v, cache_seqlens, what=what)
    assert cache_seqlens.tolist() == lengths, f"{what}: cache_seqlens was modified"
    return out, lse, cache


# ---------------------------------------------------------------------------------------------
# Dtypes x head dims x GQA x paging x appends x seqlen_q, mixed lengths in every batch
# ---------------------------------------------------------------------------------------------

HEAD_DIMS = [64, 80, 128, 256, 40, 96]
HEADS = [(32, 8), (8, 8), (16, 1), (12, 4), (64, 8), (16, 2)]   # GQA 4, 1, 16 (MQA), 3, 8, 8
# (page_size, seqlen_new, seqlen_q, causal)
VARIANTS = [(None, 1, 1, True), (16, 5, 5, True), (256, 0, 16, True), (None, 5, 8, False), (256, 1, 3, False)]


def _cases():
    cases = []
    for d_index, d in enumerate(HEAD_DIMS):
        for v_index, (page_size, new, sq, causal) in enumerate(VARIANTS):
            if d_index >= 4 and v_index >= 2:  # d 40 and 96: two variants each
                continue
            heads, kv_heads = HEADS[(d_index + v_index) % len(HEADS)]
            cases.append((d, heads, kv_heads, page_size, new, sq, causal))
    return cases


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: "d{}-h{}-hk{}-page{}-new{}-sq{}-causal{}".format(*c))
def test_decode_matches_reference(case, dtype):
    d, heads, kv_heads, page_size, new, sq, causal = case
    decode_case(MIXED, sq, heads, kv_heads, d, dtype, page_size, new, causal)


@pytest.mark.parametrize("seqlen_q", range(1, 17))
def test_every_seqlen_q(seqlen_q):
    decode_case([1, 17, 300, 2000], seqlen_q, 32, 8, 128, torch.bfloat16, 16, seqlen_q % 6, True)


# ---------------------------------------------------------------------------------------------
# A 64k context in the same batch as 1-token ones (few variants: each is large)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,page_size,new,sq,num_splits", [
    (torch.bfloat16, None, 5, 5, 0),
    (torch.float16, 256, 1, 1, 0),
    (torch.bfloat16, 16, 5, 16, 7),
], ids=["bf16-flat-new5-sq5", "fp16-page256-new1-sq1", "bf16-page16-new5-sq16-splits7"])
def test_long_context_in_a_mixed_batch(dtype, page_size, new, sq, num_splits):
    decode_case(LONG, sq, 32, 8, 128, dtype, page_size, new, True, num_splits=num_splits)


def test_long_context_window_and_softcap():
    decode_case(LONG, 4, 32, 8, 128, torch.bfloat16, 256, 1, True, window=(4096, -1), softcap=30.0, softmax_scale=0.5)


# ---------------------------------------------------------------------------------------------
# Windows, softcap, softmax scale
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal,window,softcap,scale", [
    (True, (256, -1), 0.0, None),     # causal + left window
    (False, (100, 0), 0.0, None),     # the same through the window alone
    (False, (-1, 3), 0.0, None),      # right only
    (False, (64, 16), 0.0, None),     # both
    (False, (0, 0), 0.0, None),       # one key per row
    (True, (-1, -1), 2.0, None),      # softcap
    (True, (-1, -1), 30.0, 0.5),      # softcap on large scores
    (False, (500, 7), 5.0, 0.2),      # everything together
])
# Pages of 16 keys are looked up key by key; of 64 (one sm_90 key tile) and 256, once per key tile.
@pytest.mark.parametrize("page_size", [None, 16, 64])
def test_window_and_softcap(causal, window, softcap, scale, page_size):
    decode_case(MIXED, 8, 16, 4, 128, torch.bfloat16, page_size, 5, causal, window=window, softcap=softcap,
                softmax_scale=scale)


@pytest.mark.parametrize("num_splits", [1, 0, 7])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_alibi(page_size, num_splits):
    decode_case(MIXED, 4, 16, 4, 128, torch.bfloat16, page_size, 2, True, window=(900, -1), softcap=30.0,
                num_splits=num_splits, alibi=True)


def test_softcap_fp16_head_dim_80():
    decode_case(MIXED, 2, 12, 4, 80, torch.float16, 16, 1, True, window=(37, -1), softcap=1.5)


# ---------------------------------------------------------------------------------------------
# Split-K
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [None, 256])
def test_num_splits_agree(page_size):
    lengths, sq, heads, kv_heads, d = [1, 17, 3000, 8191], 4, 32, 8, 128
    cache = KVCache(len(lengths), max(lengths) + 8, kv_heads, d, torch.bfloat16, DEV, page_size)
    q = torch.randn(len(lengths), sq, heads, d, dtype=torch.bfloat16, device=DEV)
    cache_seqlens = seqlens_tensor(lengths, DEV)
    ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, cache_seqlens, cache.block_table,
                                           None, None, causal=True)
    base = (low_out.double() - ref_out).abs().max().item()
    results = {}
    for n in (0, 1, 2, 7, 64, 256):
        _poison(len(lengths), sq, heads, d, torch.bfloat16)
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=cache_seqlens,
                                                 block_table=cache.block_table, causal=True, num_splits=n,
                                                 return_lse=True)
        torch.cuda.synchronize()
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"num_splits={n}")
        results[n] = (out, lse)
    for n, (out, lse) in results.items():
        diff = (out.double() - results[0][0].double()).abs().max().item()
        assert diff <= 2 * base + 1e-5, f"num_splits={n} vs auto: {diff:.3e} > 2 x {base:.3e} + 1e-5"
        finite = torch.isfinite(ref_lse)  # check_outputs proved the -inf pattern of each
        lse_diff = (lse[finite] - results[0][1][finite]).abs().max().item()
        assert lse_diff <= 1e-3, f"num_splits={n} vs auto: lse differs by {lse_diff:.3e}"


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_paged_chunk_runs_the_row_tile_of_a_contiguous_one(page_size, softcap):
    # A query chunk runs the wide row tile whatever the cache's layout: a paged cache whose tiled
    # variant is missing or whose pages are shorter than a key tile steps down to per-key lookups at
    # the same row tile, never to the decoding tile (6.8x the time for a 2k chunk, decode.md D17).
    # The row tile is read from the split kernel's grid: y = kv_heads * ceil(seqlen_q * group / BLOCK_M).
    lengths, sq, heads, kv_heads, d = [700, 3000], 200, 16, 4, 128
    grids = {}
    for paged in (None, page_size):
        cache = KVCache(len(lengths), max(lengths) + 8, kv_heads, d, torch.bfloat16, DEV, paged)
        q = torch.randn(len(lengths), sq, heads, d, dtype=torch.bfloat16, device=DEV)
        call = lambda: fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache,  # noqa: E731
                                                     cache_seqlens=seqlens_tensor(lengths, DEV),
                                                     block_table=cache.block_table, causal=True, softcap=softcap)
        grids[paged] = {g[1] for g in launch_grids(call, "attn_decode_split")}
    assert len(grids[None]) == 1 and grids[page_size] == grids[None], \
        f"page_size={page_size}: split grids' y {grids[page_size]} against {grids[None]} for a contiguous cache"


def test_more_splits_than_keys_and_empty_rows():
    # 256 splits over short or empty sequences: most splits see no key (their partials must be
    # ignored), sequence 0 has no key at all, sequence 1 only 2 keys for 8 causal queries.
    for n in (0, 256):
        out, lse, _ = decode_case([0, 2, 5, 40], 8, 16, 2, 64, torch.float16, None, 0, True, num_splits=n,
                                  what=f"short, num_splits={n}")
        assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
        assert torch.all(out[1, :6] == 0) and torch.all(lse[1, :, :6] == float("-inf"))
    # A right window that ends before the first key (not causal): rows 0..5 of the 1-key sequence.
    decode_case([1, 3000], 8, 8, 8, 128, torch.bfloat16, 16, 0, False, window=(-1, 1), num_splits=7)


# ---------------------------------------------------------------------------------------------
# Cache layouts
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["fused", "transposed"])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_strided_cache_views(layout, page_size):
    decode_case(MIXED, 5, 32, 8, 128, torch.bfloat16, page_size, 5, True, layout=layout)
    decode_case([3, 700], 1, 8, 2, 64, torch.float16, page_size, 1, False, layout=layout, window=(50, -1))


def test_whole_cache_when_cache_seqlens_is_none():
    for page_size in (None, 16):
        cache = KVCache(3, 1000, 4, 64, torch.bfloat16, DEV, page_size)
        q = torch.randn(3, 4, 16, 64, dtype=torch.bfloat16, device=DEV)
        full = seqlens_tensor([cache.capacity] * 3, DEV)
        ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, full, cache.block_table, None, None,
                                               causal=True)
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, block_table=cache.block_table,
                                                 causal=True, return_lse=True)
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"cache_seqlens=None page={page_size}")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("paged", [False, True])
def test_empty_batch(cache_dtype, paged):
    # Batch 0 with the automatic split count (which divides by the programs of the grid): empty
    # out and lse, nothing launched, no error.
    if cache_dtype != torch.bfloat16 and not fp8_kernels_on(DEV):
        pytest.skip("an FP8 cache needs sm_89 or sm_90")
    q = torch.randn(0, 1, 8, 64, dtype=torch.bfloat16, device=DEV)
    rows = 4 if paged else 0
    k_cache = torch.zeros(rows, 16, 2, 64, device=DEV).to(cache_dtype)
    v_cache = torch.zeros_like(k_cache)
    table = torch.zeros(0, 2, dtype=torch.int32, device=DEV) if paged else None
    seqlens = torch.zeros(0, dtype=torch.int32, device=DEV)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                             return_lse=True)
    torch.cuda.synchronize()
    assert out.shape == (0, 1, 8, 64) and lse.shape == (0, 8, 1)


def test_int_cache_seqlens():
    cache = KVCache(2, 600, 2, 128, torch.float16, DEV, 16)
    q = torch.randn(2, 3, 8, 128, dtype=torch.float16, device=DEV)
    k, v = new_tokens(2, 3, 2, 128, torch.float16, DEV)
    ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, 500, cache.block_table, k, v, causal=True)
    snap = cache.snapshot()
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=500,
                                             block_table=cache.block_table, causal=True, return_lse=True)
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what="int cache_seqlens")
    cache.check_append(snap, k, v, 500, what="int cache_seqlens")


@pytest.mark.parametrize("paged", [False, True])
def test_offsets_past_2_pow_31_elements(paged):
    # Cache views whose second sequence (or high pages) lie more than 2^31 elements into their
    # buffer: 32-bit offsets would wrap. Only the parts in use are initialised.
    kv_heads, d, dtype = 8, 128, torch.bfloat16
    lengths, new = [300, 1000], 2
    token_elems = 2 * kv_heads * d  # k and v of one token, fused
    if paged:
        page_size = 256
        pages_per_seq = -(-(max(lengths) + new) // page_size)
        first = 2**31 // (page_size * token_elems) + 1  # the first page in use starts past 2^31
        num_pages = first + 2 * pages_per_seq
        big = torch.empty(num_pages, page_size, 2 * kv_heads, d, dtype=dtype, device=DEV)
        table = torch.arange(first, num_pages, device=DEV, dtype=torch.int32)
        table = table[torch.randperm(2 * pages_per_seq, device=DEV)].view(2, pages_per_seq)
        big[table.long().flatten()] = torch.randn(2 * pages_per_seq, page_size, 2 * kv_heads, d, dtype=dtype,
                                                  device=DEV)
        assert int(table.min()) * big.stride(0) > 2**31
    else:
        capacity = 1024
        rows = 2**31 // token_elems + 64  # sequence 1 starts past 2^31 elements
        big = torch.empty(2, rows, 2 * kv_heads, d, dtype=dtype, device=DEV)
        big[:, :capacity] = torch.randn(2, capacity, 2 * kv_heads, d, dtype=dtype, device=DEV)
        table = None
        assert big.stride(0) > 2**31
    k_cache, v_cache = big[:, :, :kv_heads], big[:, :, kv_heads:]
    if not paged:
        k_cache, v_cache = k_cache[:, :capacity], v_cache[:, :capacity]
    q = torch.randn(2, 2, 32, d, dtype=dtype, device=DEV)
    k, v = new_tokens(2, new, kv_heads, d, dtype, DEV)
    cache_seqlens = seqlens_tensor(lengths, DEV)
    ref_out, ref_lse, low_out = references(q, k_cache, v_cache, cache_seqlens, table, k, v, causal=True)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                             block_table=table, causal=True, return_lse=True)
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"int64 offsets paged={paged}")
    for b, n in enumerate(lengths):
        for i in range(new):
            pos = n + i
            idx = (int(table[b, pos // page_size]), pos % page_size) if paged else (b, pos)
            assert torch.equal(k_cache[idx], k[b, i]) and torch.equal(v_cache[idx], v[b, i])
    del big


def test_page_spanning_2_pow_31_elements():
    # A page whose keys lie further apart than 32-bit offsets reach within it (slot stride x page
    # size > 2^31 elements): the decoding tile's page tiles address a page's keys in 32 bits, so
    # the launcher must take the per-key lookups (decode_cuda.cpp page_tiles_fit). K and V are
    # views of one buffer, V a row's second half; only the rows in use are initialised.
    page_size, heads, d, dtype = 64, 4, 64, torch.bfloat16
    slot_stride = 2**31 // page_size + 64
    assert page_size * slot_stride > 2**31
    buffer = torch.empty((page_size - 1) * slot_stride + 2 * d, dtype=dtype, device=DEV)
    rows = buffer.as_strided((page_size, 2 * d), (slot_stride, 1))
    rows.copy_(torch.randn(page_size, 2 * d, dtype=dtype, device=DEV))
    k_cache = buffer.as_strided((1, page_size, 1, d), (page_size * slot_stride, slot_stride, d, 1))
    v_cache = buffer.as_strided((1, page_size, 1, d), (page_size * slot_stride, slot_stride, d, 1), d)
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEV)
    q = torch.randn(1, 1, heads, d, dtype=dtype, device=DEV)
    for length in (page_size, 37):
        cache_seqlens = seqlens_tensor([length], DEV)
        ref_out, ref_lse, low_out = references(q, k_cache, v_cache, cache_seqlens, table, None, None)
        out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                 block_table=table, return_lse=True)
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"page of {page_size} slots {slot_stride} apart")
    del buffer


def test_append_past_capacity_stays_inside_the_sequence():
    # Documented, not checked, on CUDA: an append past capacity is dropped and the sequence is
    # clamped. Whatever is kept, nothing outside sequence 0's own slots may change, and the
    # other sequence's result must be right.
    for page_size in (None, 16):
        cache = KVCache(2, 64, 2, 64, torch.bfloat16, DEV, page_size, spare_pages=2)
        q = torch.randn(2, 5, 8, 64, dtype=torch.bfloat16, device=DEV)
        k, v = new_tokens(2, 5, 2, 64, torch.bfloat16, DEV)
        cache_seqlens = seqlens_tensor([cache.capacity - 2, 10], DEV)
        ref_out, ref_lse, low_out = references(q[1:], cache.k_cache[1:] if page_size is None else cache.k_cache,
                                               cache.v_cache[1:] if page_size is None else cache.v_cache,
                                               cache_seqlens[1:],
                                               None if page_size is None else cache.block_table[1:],
                                               k[1:], v[1:], causal=True)
        snap = cache.snapshot()
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v,
                                                 cache_seqlens=cache_seqlens, block_table=cache.block_table,
                                                 causal=True, return_lse=True)
        torch.cuda.synchronize()
        check_outputs(out[1:], lse[1:], q[1:], ref_out, ref_lse, low_out, what=f"sequence 1, page={page_size}")
        assert not torch.isnan(out).any()
        # Expected: sequence 1 appended; sequence 0's slots may hold anything.
        exp = [t.clone() for t in snap]
        exp_k, exp_v = cache.views(exp)
        got_k, got_v = cache.k_cache, cache.v_cache
        for i in range(5):
            idx = cache.slot(1, 10 + i)
            exp_k[idx], exp_v[idx] = k[1, i], v[1, i]
        for j in range(cache.capacity):  # sequence 0's own slots: take what the op left there
            idx = cache.slot(0, j)
            exp_k[idx], exp_v[idx] = got_k[idx], got_v[idx]
        for got, want in zip(cache.bases, exp):
            assert torch.equal(got, want), f"page={page_size}: an append past capacity wrote outside its sequence"


# ---------------------------------------------------------------------------------------------
# CUDA graphs, older arch code paths, torch.compile, devices
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [None, 16])
def test_cuda_graph_decode_step_with_append(page_size):
    batch, sq, heads, kv_heads, d, new, dtype = 3, 2, 32, 8, 128, 2, torch.bfloat16
    cache = KVCache(batch, 8192, kv_heads, d, dtype, DEV, page_size)
    cap = cache.capacity
    q = torch.randn(batch, sq, heads, d, dtype=dtype, device=DEV)
    k, v = new_tokens(batch, new, kv_heads, d, dtype, DEV)
    cache_seqlens = seqlens_tensor([5, 100, 7], DEV)
    step = dict(k=k, v=v, cache_seqlens=cache_seqlens, block_table=cache.block_table, causal=True, return_lse=True)
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)  # load the modules before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)
    for lengths in ([3, 17, 1], [1000, 0, 4000], [cap - new, 8000, 1], [0, 0, 0], [6000, cap - 5, 17]):
        cache_seqlens.copy_(seqlens_tensor(lengths, DEV))
        for dst in (q, k, v):
            dst.copy_(torch.randn_like(dst))
        ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, cache_seqlens, cache.block_table,
                                               k, v, causal=True)
        snap = cache.snapshot()
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"graph replay lengths={lengths}")
        cache.check_append(snap, k, v, cache_seqlens, what=f"graph replay lengths={lengths}")


DECODE_KERNELS = ("attn_decode_split", "attn_decode_merge", "kv_append", "rotate_queries")


@pytest.mark.parametrize("case", [
    dict(lengths=MIXED, seqlen_q=5, heads=32, kv_heads=8, head_dim=128, page_size=16, seqlen_new=5),
    dict(lengths=MIXED, seqlen_q=1, heads=16, kv_heads=16, head_dim=80, page_size=None, seqlen_new=1,
         window=(300, -1), softcap=5.0),
    dict(lengths=[2, 5000], seqlen_q=16, heads=8, kv_heads=1, head_dim=256, page_size=256, seqlen_new=0,
         num_splits=3),
    dict(lengths=[0, 17, 3000], seqlen_q=3, heads=12, kv_heads=4, head_dim=64, page_size=None, seqlen_new=2,
         layout="fused"),
], ids=["gqa4-d128-paged16", "d80-window-softcap", "mqa-d256-page256-splits3", "d64-fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sm80_code_path_via_ptx(case, dtype, monkeypatch):
    # Same mechanism as test_forward_gpu.py: the library reads FATTN_FORCE_PTX_ARCH at every
    # launch and JIT-loads the sm_80 PTX of each kernel.
    _skip_without_sm80_decode_kernels()
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "80")
    case = dict(case)
    decode_case(case.pop("lengths"), case.pop("seqlen_q"), case.pop("heads"), case.pop("kv_heads"),
                case.pop("head_dim"), dtype, **case)


def _skip_without_sm80_decode_kernels():
    kernels = fattn.build_info()["kernels"]
    built = {name: {k["arch"] for k in kernels if k["kernel"] == name} for name in DECODE_KERNELS}
    assert all(built.values()), f"decode kernels missing from the build: {built}"
    skip_without_ptx(80, *DECODE_KERNELS)


def test_sm80_code_path_in_a_fresh_process():
    # The same PTX path with FATTN_FORCE_PTX_ARCH set before the library loads: two of the
    # reference cases (d128, paged, append) in a subprocess.
    _skip_without_sm80_decode_kernels()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, FATTN_FORCE_PTX_ARCH="80")
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q", "-p", "no:cacheprovider", "-m", "gpu",
           "-k", "test_decode_matches_reference and d128 and page16"]
    result = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    log = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, log
    assert re.search(r"\b[1-9]\d* passed\b", result.stdout), log
    assert not re.search(r"\b(failed|skipped|error|deselected.*0 selected)\b", result.stdout), log


def test_force_ptx_arch_reaches_decode(monkeypatch):
    # Proves the tests above do run PTX: an arch with no PTX in the build is refused by name.
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "70")
    cache = KVCache(1, 32, 1, 64, torch.float16, DEV)
    q = torch.randn(1, 1, 1, 64, dtype=torch.float16, device=DEV)
    with pytest.raises(RuntimeError, match=r"FATTN_FORCE_PTX_ARCH=70"):
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([9], DEV))


def test_torch_compile_fullgraph_with_append_cuda():
    cache = KVCache(2, 2048, 8, 128, torch.bfloat16, DEV, 16)
    eager = cache.clone()
    cache_seqlens = seqlens_tensor([5, 1500], DEV)

    @torch.compile(fullgraph=True)
    def f(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
        out = fattn.flash_attn_with_kvcache(q * 0.5, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                            block_table=block_table, causal=True)
        return out.float().sum(-1)

    q = torch.randn(2, 3, 32, 128, dtype=torch.bfloat16, device=DEV)
    k, v = new_tokens(2, 3, 8, 128, torch.bfloat16, DEV)
    got = f(q, cache.k_cache, cache.v_cache, k, v, cache_seqlens, cache.block_table)
    want = fattn.flash_attn_with_kvcache(q * 0.5, eager.k_cache, eager.v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                         block_table=eager.block_table, causal=True).float().sum(-1)
    torch.testing.assert_close(got, want)
    for a, b in zip(cache.bases, eager.bases):
        assert torch.equal(a, b), "the compiled call's append differs from eager's"


def test_bad_input_cuda_rules():
    cache = KVCache(2, 64, 2, 64, torch.float16, DEV, 16)
    q = torch.randn(2, 3, 4, 64, dtype=torch.float16, device=DEV)
    k, v = new_tokens(2, 1, 2, 64, torch.float16, DEV)
    cache_seqlens = seqlens_tensor([3, 9], DEV)
    ok = dict(k=k, v=v, cache_seqlens=cache_seqlens, block_table=cache.block_table)

    def expect(match, q=q, k_cache=cache.k_cache, v_cache=cache.v_cache, **changes):
        kw = dict(ok, **changes)
        with pytest.raises(RuntimeError, match=r"(?s)fattn\.decode: .*" + match):
            fattn.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)

    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **ok)  # the valid call
    expect(r"\bk_cache\b", k_cache=cache.k_cache.cpu())
    expect(r"\bv_cache\b", v_cache=cache.v_cache.cpu())
    expect(r"\bk\b", k=k.cpu())
    expect(r"cache_seqlens", cache_seqlens=cache_seqlens.cpu())
    expect(r"block_table", block_table=cache.block_table.cpu())
    expect(r"\bq\b", q=q.float(), k_cache=cache.k_cache.float(), v_cache=cache.v_cache.float(), k=k.float(),
           v=v.float())
    expect(r"num_splits", num_splits=257)
    expect(r"softcap", softcap=-0.5)
