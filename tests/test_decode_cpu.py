"""fattn.flash_attn_with_kvcache (torch.ops.fattn.decode) on CPU: the op's semantic reference
against the float64 kvcache_reference, the in-place append and torch.compile. The reference
itself is checked in test_decode_reference.py, the bad-input rules in test_decode_bad_input.py;
opcheck and the fake run on the shared samples (test_op_samples.py).
"""

from __future__ import annotations

import math

import pytest
import torch

import fattn
from fattn.reference import attention_reference, kvcache_reference
from helpers import (
    KVCache, check_outputs, new_tokens, recompiles_forbidden, references, run_decode, seqlens_tensor,
)


# ---------------------------------------------------------------------------------------------
# The CPU implementation against the reference
# ---------------------------------------------------------------------------------------------

# (lengths, seqlen_q, heads, kv_heads, head_dim, page_size, seqlen_new, causal, window, softcap, layout)
CASES = [
    ([1, 17, 100], 1, 4, 4, 64, None, 0, False, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 1, 4, 4, 64, None, 1, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 2, 40, None, 5, True, (-1, -1), 0.0, "contiguous"),
    ([100, 1, 17], 16, 8, 1, 8, None, 0, True, (-1, -1), 0.0, "contiguous"),
    ([17, 100, 1], 3, 16, 2, 64, 16, 1, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 8, 40, 16, 5, True, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 7, 8, 1, 24, 32, 5, False, (-1, -1), 0.0, "contiguous"),
    ([0, 33, 64], 2, 4, 1, 64, 32, 0, False, (-1, -1), 0.0, "contiguous"),
    ([1, 17, 100], 4, 8, 2, 40, None, 1, False, (10, -1), 0.0, "contiguous"),
    ([1, 17, 100], 4, 8, 2, 40, 16, 5, False, (-1, 3), 0.0, "contiguous"),
    ([1, 17, 100], 6, 8, 2, 40, 32, 0, False, (7, 2), 0.0, "contiguous"),
    ([1, 17, 100], 6, 4, 4, 64, None, 5, True, (20, -1), 0.0, "contiguous"),
    ([1, 17, 100], 1, 8, 2, 64, 16, 1, True, (0, -1), 0.0, "contiguous"),
    ([1, 17, 100], 5, 8, 4, 40, None, 5, True, (-1, -1), 1.5, "contiguous"),
    ([1, 17, 100], 3, 8, 8, 8, 32, 1, False, (-1, -1), 0.7, "contiguous"),
    ([1, 17, 100], 9, 8, 2, 64, 16, 5, True, (30, -1), 3.0, "contiguous"),
    ([1, 17, 100], 5, 8, 2, 40, None, 5, True, (-1, -1), 0.0, "fused"),
    ([1, 17, 100], 5, 8, 2, 40, None, 1, False, (12, 4), 0.0, "transposed"),
    ([1, 17, 100], 5, 8, 2, 40, 16, 5, True, (-1, -1), 0.0, "fused"),
    ([1, 17, 100], 2, 8, 1, 64, 32, 1, True, (-1, -1), 1.0, "transposed"),
    ([5, 5], 16, 8, 8, 16, None, 0, True, (-1, -1), 0.0, "contiguous"),          # many empty causal rows
    ([2, 0, 7], 16, 4, 2, 16, 16, 0, False, (-1, 0), 0.0, "contiguous"),         # right-only window empties
    ([3, 12, 30], 8, 4, 2, 16, None, 5, False, (-1, 2**40), 0.0, "contiguous"),  # wider than any cache: no bound
    ([3, 12, 30], 8, 4, 2, 16, 16, 5, True, (2**64, 3), 0.0, "contiguous"),      # past int64 too (flash-attn takes it)
    ([1], 16, 4, 4, 256, 16, 5, True, (-1, -1), 0.0, "contiguous"),              # head_dim 256
]


def _case_id(c):
    lengths, sq, h, hk, d, ps, new, causal, window, softcap, layout = c
    return (f"len{'-'.join(map(str, lengths))}-sq{sq}-h{h}-hk{hk}-d{d}-{'paged' + str(ps) if ps else 'flat'}"
            f"-new{new}{'-causal' if causal else ''}-w{window[0]}_{window[1]}-cap{softcap}-{layout}")


def _run_case(case, dtype, softmax_scale=None, num_splits=0):
    lengths, sq, heads, kv_heads, d, page_size, new, causal, window, softcap, layout = case
    batch = len(lengths)
    cache = KVCache(batch, max(lengths) + new + 3, kv_heads, d, dtype, "cpu", page_size, layout)
    q = torch.randn(batch, sq, heads, d, dtype=dtype)
    k, v = new_tokens(batch, new, kv_heads, d, dtype, "cpu")
    return run_decode(q, cache, seqlens_tensor(lengths), k, v, what=_case_id(case), num_splits=num_splits,
                      softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_decode_cpu_float64_matches_reference(case):
    _run_case(case, torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[9], CASES[13], CASES[18], CASES[21]], ids=_case_id)
def test_decode_cpu_low_precision_matches_reference(case, dtype):
    _run_case(case, dtype)


@pytest.mark.parametrize("seqlen_q", [1, 2, 3, 8, 13, 16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (8, 1), (16, 2)])
def test_decode_cpu_seqlen_q_and_gqa(seqlen_q, heads, kv_heads):
    case = ([1, 17, 100], seqlen_q, heads, kv_heads, 40, 16, 1, True, (-1, -1), 0.0, "contiguous")
    _run_case(case, torch.float64)


def test_explicit_softmax_scale():
    case = ([1, 17, 100], 3, 8, 2, 40, 32, 5, True, (-1, -1), 0.0, "contiguous")
    _run_case(case, torch.float64, softmax_scale=0.37)
    _run_case(case, torch.float32, softmax_scale=1.3)


def test_default_softmax_scale_is_inverse_sqrt_head_dim():
    q = torch.randn(2, 3, 4, 40, dtype=torch.float64)
    cache = KVCache(2, 50, 2, 40, torch.float64, "cpu")
    lengths = seqlens_tensor([20, 50])
    got = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths)
    want = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths,
                                         softmax_scale=1 / math.sqrt(40))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    other = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths, softmax_scale=0.5)
    assert not torch.allclose(got, other)


def test_causal_forces_right_window_zero():
    q = torch.randn(2, 6, 4, 16, dtype=torch.float64)
    cache = KVCache(2, 40, 2, 16, torch.float64, "cpu")
    lengths = seqlens_tensor([10, 35])
    args = (q, cache.k_cache, cache.v_cache)
    a = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=True, window_size=(4, 7), return_lse=True)
    b = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=False, window_size=(4, 0), return_lse=True)
    c = fattn.flash_attn_with_kvcache(*args, cache_seqlens=lengths, causal=False, window_size=(4, 7), return_lse=True)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.allclose(a[0], c[0])


@pytest.mark.parametrize("paged", [False, True])
def test_alibi_matches_the_reference_and_forward(paged):
    q = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    cache = KVCache(2, 48, 2, 16, torch.float64, "cpu", page_size=16 if paged else None)
    k, v = new_tokens(2, 3, 2, 16, torch.float64, "cpu")
    slopes = torch.rand(2, 4) * 0.3
    run_decode(q, cache, seqlens_tensor([7, 40]), k, v, what="alibi", causal=True, softcap=2.0,
               alibi_slopes=slopes)
    # One sequence's decode equals flash_attn_func over its keys with the same slopes.
    cache = KVCache(1, 48, 2, 16, torch.float64, "cpu")
    got = fattn.flash_attn_with_kvcache(q[:1], cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([20]),
                                        causal=True, alibi_slopes=slopes[0])
    want = fattn.flash_attn_func(q[:1], cache.k_cache[:, :20], cache.v_cache[:, :20], causal=True,
                                 alibi_slopes=slopes[0])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_rows_with_no_visible_key():
    q = torch.randn(3, 4, 4, 32, dtype=torch.float32)
    cache = KVCache(3, 40, 2, 32, torch.float32, "cpu", page_size=16)
    # Sequence 0: empty cache, no append -> every row empty. Sequence 1: 2 keys for 4 causal
    # queries -> rows 0 and 1 empty. Sequence 2: full rows.
    out, lse = run_decode(q, cache, seqlens_tensor([0, 2, 30]), causal=True, what="empty rows")
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    assert torch.all(out[1, :2] == 0) and torch.all(lse[1, :, :2] == float("-inf"))
    assert torch.isfinite(lse[1, :, 2:]).all() and torch.isfinite(lse[2]).all()
    # A right window without causal: 1 key for 4 queries, right 1: row t sees j <= t - 2.
    out, lse = run_decode(q, cache, seqlens_tensor([1, 1, 0]), window_size=(-1, 1), what="window empties")
    assert torch.all(out[:2, :2] == 0) and torch.all(lse[:2, :, :2] == float("-inf"))
    assert torch.isfinite(lse[:2, :, 2:]).all() and torch.all(lse[2] == float("-inf"))


def test_append_writes_exactly_the_new_slots():
    # Page boundaries crossed by the append: positions 14..18 straddle pages of 16.
    for page_size in (None, 16, 32):
        cache = KVCache(3, 60, 2, 16, torch.float64, "cpu", page_size=page_size)
        q = torch.randn(3, 5, 4, 16, dtype=torch.float64)
        k, v = new_tokens(3, 5, 2, 16, torch.float64, "cpu")
        snap = cache.snapshot()
        lengths = seqlens_tensor([14, 0, 27])
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=lengths,
                                      block_table=cache.block_table, causal=True)
        cache.check_append(snap, k, v, lengths, what=f"page_size={page_size}")
        for b, n in enumerate(lengths.tolist()):  # the same, spelled out slot by slot
            for i in range(5):
                assert torch.equal(cache.k_cache[cache.slot(b, n + i)], k[b, i])
                assert torch.equal(cache.v_cache[cache.slot(b, n + i)], v[b, i])
        assert lengths.tolist() == [14, 0, 27], "cache_seqlens must not be modified"


def test_decode_loop_against_attention_over_the_whole_sequence():
    # A prompt in the cache, then token-by-token decoding that appends and advances cache_seqlens;
    # checked against attention_reference over the explicit concatenation (no kvcache_reference).
    batch, heads, kv_heads, d, prompt = 2, 8, 2, 40, [5, 11]
    cache = KVCache(batch, 32, kv_heads, d, torch.float64, "cpu", page_size=16)
    keys = [[cache.k_cache[cache.slot(b, j)].clone() for j in range(prompt[b])] for b in range(batch)]
    values = [[cache.v_cache[cache.slot(b, j)].clone() for j in range(prompt[b])] for b in range(batch)]
    lengths = seqlens_tensor(prompt)
    for step in range(6):
        new = 1 if step % 2 == 0 else 3
        q = torch.randn(batch, new, heads, d, dtype=torch.float64)
        k, v = new_tokens(batch, new, kv_heads, d, torch.float64, "cpu")
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=v, cache_seqlens=lengths,
                                                 block_table=cache.block_table, causal=True, return_lse=True)
        for b in range(batch):
            keys[b] += list(k[b].unbind(0))
            values[b] += list(v[b].unbind(0))
            want_out, want_lse = attention_reference(q[b:b + 1], torch.stack(keys[b])[None],
                                                     torch.stack(values[b])[None], None, True)
            torch.testing.assert_close(out[b:b + 1], want_out, atol=1e-10, rtol=1e-10)
            torch.testing.assert_close(lse[b:b + 1], want_lse, atol=1e-10, rtol=1e-10)
        lengths += new


@pytest.mark.parametrize("paged", [False, True])
def test_cache_seqlens_none_uses_the_whole_capacity(paged):
    q = torch.randn(2, 3, 4, 16, dtype=torch.float64)
    cache = KVCache(2, 48, 2, 16, torch.float64, "cpu", page_size=16 if paged else None)
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, block_table=cache.block_table,
                                             causal=True, return_lse=True)
    full = seqlens_tensor([cache.capacity] * 2)
    ref_out, ref_lse, low = references(q, cache.k_cache, cache.v_cache, full, cache.block_table, None, None, causal=True)
    check_outputs(out, lse, q, ref_out, ref_lse, low, what="cache_seqlens=None")


@pytest.mark.parametrize("new", [0, 2])
def test_int_cache_seqlens(new):
    q = torch.randn(3, 2, 4, 16, dtype=torch.float64)
    cache = KVCache(3, 30, 2, 16, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, new, 2, 16, torch.float64, "cpu")
    twin = cache.clone()
    out, lse = run_decode(q, cache, 9, k, v, causal=True, what="int cache_seqlens")
    want = fattn.flash_attn_with_kvcache(q, twin.k_cache, twin.v_cache, k=k, v=v, cache_seqlens=seqlens_tensor([9] * 3),
                                         block_table=twin.block_table, causal=True, return_lse=True)
    torch.testing.assert_close((out, lse), want, atol=0, rtol=0)
    for a, b in zip(cache.bases, twin.bases):
        assert torch.equal(a, b)


def test_num_splits_is_ignored_on_cpu():
    q = torch.randn(2, 4, 8, 40, dtype=torch.float32)
    cache = KVCache(2, 120, 2, 40, torch.float32, "cpu", page_size=16)
    lengths = seqlens_tensor([3, 100])
    outs = [fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=lengths,
                                          block_table=cache.block_table, causal=True, num_splits=n, return_lse=True)
            for n in (0, 1, 7, 256)]
    for got in outs[1:]:
        torch.testing.assert_close(got, outs[0], atol=0, rtol=0)


def test_return_lse_false_returns_only_out():
    q = torch.randn(1, 2, 2, 16, dtype=torch.float64)
    cache = KVCache(1, 20, 2, 16, torch.float64, "cpu")
    out = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([10]))
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    ref = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor([10]))[0]
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)


def test_op_called_directly_matches_the_api():
    q = torch.randn(2, 3, 8, 24, dtype=torch.float64)
    cache = KVCache(2, 40, 2, 24, torch.float64, "cpu", page_size=16, layout="fused")
    k, v = new_tokens(2, 3, 2, 24, torch.float64, "cpu")
    lengths = seqlens_tensor([4, 30])
    snap = cache.snapshot()
    out, lse = torch.ops.fattn.decode(q, cache.k_cache, cache.v_cache, k, v, None, None, lengths, None, None,
                                      cache.block_table, 0.4, True, 9, -1, 2.5, True, None, 0)
    k0, v0 = cache.views(snap)
    ref_out, ref_lse, low = references(q, k0, v0, lengths, cache.block_table, k, v, softmax_scale=0.4,
                                       causal=True, window_size=(9, -1), softcap=2.5)
    check_outputs(out, lse, q, ref_out, ref_lse, low, what="torch.ops.fattn.decode")
    cache.check_append(snap, k, v, lengths, what="torch.ops.fattn.decode")


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("paged", [False, True])
def test_compile_fullgraph_with_append(paged):
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="inductor")
    def step(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
        out, lse = fattn.flash_attn_with_kvcache(q * 0.5, k_cache, v_cache, k=k, v=v, cache_seqlens=cache_seqlens,
                                                 block_table=block_table, causal=True, window_size=(20, -1),
                                                 return_lse=True)
        return out * 2 + 1, lse.exp()

    cache = KVCache(2, 48, 2, 16, torch.float32, "cpu", page_size=16 if paged else None)
    lengths = seqlens_tensor([3, 30])
    for i in range(3):  # same shapes, new cache_seqlens values: one graph
        q = torch.randn(2, 2, 4, 16)
        k, v = new_tokens(2, 2, 2, 16, torch.float32, "cpu")
        snap = cache.snapshot()
        eager = cache.clone()
        with recompiles_forbidden(i):
            got_out, got_p = step(q, cache.k_cache, cache.v_cache, k, v, lengths, cache.block_table)
        want_out, want_lse = fattn.flash_attn_with_kvcache(q * 0.5, eager.k_cache, eager.v_cache, k=k, v=v,
                                                           cache_seqlens=lengths, block_table=eager.block_table,
                                                           causal=True, window_size=(20, -1), return_lse=True)
        torch.testing.assert_close(got_out, want_out * 2 + 1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_p, want_lse.exp(), atol=1e-5, rtol=1e-5)
        cache.check_append(snap, k, v, lengths, what="compiled call")  # the compiled call mutated the cache
        for a, b in zip(cache.bases, eager.bases):
            assert torch.equal(a, b)
        ref_out, _ = kvcache_reference(q * 0.5, *cache.views(snap), lengths, cache.block_table, causal=True,
                                       window_size=(20, -1), k=k, v=v)
        torch.testing.assert_close(got_out, ref_out * 2 + 1, atol=1e-5, rtol=1e-5)
        lengths = lengths + 2
