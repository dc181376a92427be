"""fattn.reference.kvcache_reference, the float64 yardstick of every decode test, checked
independently: against attention_reference over full caches and explicit concatenations,
against plain loops for windows and softcap, and for not touching the cache."""

from __future__ import annotations

import pytest
import torch

from fattn.reference import attention_reference, kvcache_reference
from helpers import KVCache, new_tokens, seqlens_tensor


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_reference_full_cache_equals_attention_reference(heads, kv_heads, causal):
    q = torch.randn(3, 5, heads, 24, dtype=torch.float64)
    k_cache = torch.randn(3, 37, kv_heads, 24, dtype=torch.float64)
    v_cache = torch.randn_like(k_cache)
    want_out, want_lse = attention_reference(q, k_cache, v_cache, 0.3, causal)
    for cache_seqlens in (None, 37, seqlens_tensor([37, 37, 37])):
        out, lse = kvcache_reference(q, k_cache, v_cache, cache_seqlens, softmax_scale=0.3, causal=causal)
        torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=1e-12)
    # Paged: the same keys scattered over shuffled pages.
    page_size = 16
    pages_per_seq = 3
    table = torch.randperm(3 * pages_per_seq + 2)[: 3 * pages_per_seq].view(3, pages_per_seq).int()
    paged_k = torch.randn(3 * pages_per_seq + 2, page_size, kv_heads, 24, dtype=torch.float64)
    paged_v = torch.randn_like(paged_k)
    full_k = torch.zeros(3, pages_per_seq * page_size, kv_heads, 24, dtype=torch.float64)
    full_v = torch.zeros_like(full_k)
    for b in range(3):
        for p in range(pages_per_seq):
            full_k[b, p * page_size:(p + 1) * page_size] = paged_k[table[b, p]]
            full_v[b, p * page_size:(p + 1) * page_size] = paged_v[table[b, p]]
    out, lse = kvcache_reference(q, paged_k, paged_v, block_table=table, causal=causal)
    want_out, want_lse = attention_reference(q, full_k, full_v, None, causal)
    torch.testing.assert_close(out, want_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=1e-12)


def test_reference_append_equals_attention_over_the_concatenation_and_does_not_mutate():
    q = torch.randn(3, 4, 8, 16, dtype=torch.float64)
    cache = KVCache(3, 30, 2, 16, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, 4, 2, 16, torch.float64, "cpu")
    lengths = [0, 9, 26]
    snap = cache.snapshot()
    out, lse = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor(lengths), cache.block_table,
                                 causal=True, k=k, v=v)
    for got, before in zip(cache.bases, snap):
        assert torch.equal(got, before), "kvcache_reference modified the cache"
    for b, n in enumerate(lengths):
        keys = torch.stack([cache.k_cache[cache.slot(b, j)] for j in range(n)] + list(k[b].unbind(0)))
        values = torch.stack([cache.v_cache[cache.slot(b, j)] for j in range(n)] + list(v[b].unbind(0)))
        want_out, want_lse = attention_reference(q[b:b + 1], keys[None], values[None], None, True)
        torch.testing.assert_close(out[b:b + 1], want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse[b:b + 1], want_lse, atol=1e-12, rtol=1e-12)


def _loop_reference(q, keys, values, scale, causal, window, softcap):
    """One sequence, [seqlen_q, heads, d] and [seqlen_k, kv_heads, d], by explicit loops."""
    seqlen_q, heads, d = q.shape
    seqlen_k, kv_heads = keys.shape[:2]
    left, right = window
    if causal:
        right = 0
    out = torch.zeros(seqlen_q, heads, d, dtype=torch.float64)
    lse = torch.full((heads, seqlen_q), float("-inf"), dtype=torch.float64)
    for h in range(heads):
        kh = h // (heads // kv_heads)
        for t in range(seqlen_q):
            pos = t + seqlen_k - seqlen_q
            seen = [j for j in range(seqlen_k)
                    if (right < 0 or j <= pos + right) and (left < 0 or j >= pos - left)]
            if not seen:
                continue
            s = torch.stack([(q[t, h] * keys[j, kh]).sum() * scale for j in seen])
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            m = s.max()
            e = torch.exp(s - m)
            lse[h, t] = m + torch.log(e.sum())
            out[t, h] = sum(e[i] / e.sum() * values[j, kh] for i, j in enumerate(seen))
    return out, lse


@pytest.mark.parametrize("causal,window,softcap", [
    (False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (3, -1), 0.0), (False, (-1, 1), 0.0),
    (False, (2, 1), 1.5), (True, (4, -1), 0.8), (True, (2, 5), 0.0), (False, (-1, -1), 2.0),
])
def test_reference_against_explicit_loops(causal, window, softcap):
    q = torch.randn(3, 5, 4, 8, dtype=torch.float64)
    cache = KVCache(3, 24, 2, 8, torch.float64, "cpu", page_size=16)
    k, v = new_tokens(3, 2, 2, 8, torch.float64, "cpu")
    lengths = [0, 2, 20]  # 2 keys for 5 queries: rows with no visible key under causal/right windows
    out, lse = kvcache_reference(q, cache.k_cache, cache.v_cache, seqlens_tensor(lengths), cache.block_table,
                                 softmax_scale=0.9, causal=causal, window_size=window, softcap=softcap, k=k, v=v)
    for b, n in enumerate(lengths):
        keys = torch.stack([cache.k_cache[cache.slot(b, j)] for j in range(n)] + list(k[b].unbind(0)))
        values = torch.stack([cache.v_cache[cache.slot(b, j)] for j in range(n)] + list(v[b].unbind(0)))
        want_out, want_lse = _loop_reference(q[b], keys, values, 0.9, causal, window, softcap)
        torch.testing.assert_close(out[b], want_out, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(lse[b], want_lse, atol=1e-12, rtol=1e-12)


def test_reference_softcap_and_window_change_the_result():
    # Guards the parametrisations below against testing knobs that do nothing.
    q = torch.randn(1, 4, 2, 16, dtype=torch.float64)
    k_cache = torch.randn(1, 50, 2, 16, dtype=torch.float64)
    v_cache = torch.randn_like(k_cache)
    plain = kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0)[0]
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, softcap=2.0)[0])
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(5, -1))[0])
    assert not torch.allclose(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(-1, 0))[0])
    # Any negative bound is no bound.
    torch.testing.assert_close(plain, kvcache_reference(q, k_cache, v_cache, softmax_scale=1.0, window_size=(-7, -40))[0])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotated_queries_round_to_the_given_dtype(interleaved):
    # The op rounds the rotated queries to its q's dtype: a float64 reference of a bf16 call
    # (q.double() in) rounds them to bf16 with rotated_q_dtype, and then equals the reference over
    # queries rotated and rounded beforehand; without it they stay unrounded, a different result.
    from fattn.reference import rotary_reference

    torch.manual_seed(5)
    q = torch.randn(2, 3, 4, 32, dtype=torch.bfloat16)
    k_cache = torch.randn(2, 40, 2, 32, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    angles = torch.rand(64, 8, dtype=torch.float64) * 6.3
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    lengths = seqlens_tensor([10, 30], "cpu")
    call = dict(causal=True, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    rounded = kvcache_reference(q.double(), k_cache, v_cache, lengths, rotated_q_dtype=torch.bfloat16, **call)
    exact = kvcache_reference(q.double(), k_cache, v_cache, lengths, **call)
    positions = lengths[:, None] + torch.arange(3)  # causal: query t at cache_seqlens[b] + t
    q_rot = rotary_reference(q, cos, sin, positions, interleaved).to(torch.bfloat16)
    want = kvcache_reference(q_rot.double(), k_cache, v_cache, lengths, causal=True)
    assert torch.equal(rounded[0], want[0]) and torch.equal(rounded[1], want[1])
    assert not torch.equal(exact[0], want[0])
