"""flash-attn's cache options on CPU: the rotary embedding applied inside the call, cache_batch_idx,
cache_leftpad, and query chunks longer than the decoding tile (chunked prefill), alone and
combined, against the float64 reference; the reference's own rules checked independently."""

from __future__ import annotations

import math

import pytest
import torch

import fattn
from fattn.reference import attention_reference, kvcache_reference, rotary_reference
from helpers import CACHE_OPTION_CASES, KVCache, cache_option_case_id, run_cache_option_case, seqlens_tensor

F64 = torch.float64


@pytest.mark.parametrize("case", CACHE_OPTION_CASES, ids=cache_option_case_id)
def test_cache_options_float64(case):
    run_cache_option_case(case, F64, "cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CACHE_OPTION_CASES[1::3], ids=cache_option_case_id)
def test_cache_options_low_precision(case, dtype):
    run_cache_option_case(case, dtype, "cpu")


# ----------------------------------------------------------------- the reference's rules


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_reference_is_a_complex_rotation(interleaved):
    # Each rotated pair (a, b) is the complex number a + ib times e^(i angle).
    x = torch.randn(2, 5, 3, 24, dtype=F64)
    angles = torch.rand(40, 8, dtype=F64) * 2 * math.pi
    positions = torch.tensor([[0, 3, 7, 9, 11], [30, 31, 32, 33, 39]])
    got = rotary_reference(x, angles.cos(), angles.sin(), positions, interleaved)
    if interleaved:
        pairs = torch.complex(x[..., 0:16:2], x[..., 1:16:2])
    else:
        pairs = torch.complex(x[..., :8], x[..., 8:16])
    turned = pairs * torch.polar(torch.ones_like(angles), angles)[positions][:, :, None, :]
    want = x.clone()
    if interleaved:
        want[..., 0:16:2], want[..., 1:16:2] = turned.real, turned.imag
    else:
        want[..., :8], want[..., 8:16] = turned.real, turned.imag
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.equal(got[..., 16:], x[..., 16:])  # past rotary_dim: untouched


def test_reference_leftpad_is_attention_over_the_keys_after_it():
    q = torch.randn(1, 4, 2, 16, dtype=F64)
    k_cache, v_cache = torch.randn(1, 30, 2, 16, dtype=F64), torch.randn(1, 30, 2, 16, dtype=F64)
    for causal, window in ((True, (-1, -1)), (False, (5, 1))):
        out, lse = kvcache_reference(q, k_cache, v_cache, seqlens_tensor([25]), causal=causal, window_size=window,
                                     cache_leftpad=seqlens_tensor([6]))
        # The bottom-right diagonal is the same counted from key 0 or from the padding.
        want, want_lse = attention_reference(q, k_cache[:, 6:25], v_cache[:, 6:25], causal=causal,
                                             window_size=window)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
        torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12)


def test_reference_batch_idx_is_the_gathered_cache():
    q = torch.randn(2, 3, 4, 16, dtype=F64)
    k_cache, v_cache = torch.randn(5, 20, 2, 16, dtype=F64), torch.randn(5, 20, 2, 16, dtype=F64)
    rows = seqlens_tensor([4, 1])
    got = kvcache_reference(q, k_cache, v_cache, seqlens_tensor([7, 19]), cache_batch_idx=rows, causal=True)
    want = kvcache_reference(q, k_cache[rows.long()], v_cache[rows.long()], seqlens_tensor([7, 19]), causal=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


# ----------------------------------------------------------------- the op's rules


def _rotary_tables(rows, rotary_dim, dtype=F64):
    angles = torch.rand(rows, rotary_dim // 2, dtype=F64) * 2 * math.pi
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("causal,window,per_token", [(True, (-1, -1), True), (False, (-1, -1), False),
                                                     (False, (3, -1), True), (False, (-1, 64), False)])
def test_rotary_query_positions_follow_flash_attn(causal, window, per_token):
    # Query t is rotated at cache_seqlens + t when the mask is causal or local (a window side
    # below the capacity of 64), at cache_seqlens for every t otherwise.
    q = torch.randn(1, 3, 2, 16, dtype=F64)
    k_cache, v_cache = torch.zeros(1, 64, 2, 16, dtype=F64), torch.randn(1, 64, 2, 16, dtype=F64)
    k_new, v_new = torch.randn(1, 3, 2, 16, dtype=F64), torch.randn(1, 3, 2, 16, dtype=F64)
    cos, sin = _rotary_tables(64, 16)
    seqlens = seqlens_tensor([10])
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens, causal=causal,
                                        window_size=window)
    steps = torch.arange(3) if per_token else torch.zeros(3, dtype=torch.long)
    q_rot = rotary_reference(q, cos, sin, 10 + steps[None], True)
    want, _ = attention_reference(q_rot, k_cache[:, :13], v_cache[:, :13], causal=causal, window_size=window)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    # The appended keys are rotated at 10, 11, 12.
    torch.testing.assert_close(k_cache[:, 10:13], rotary_reference(k_new, cos, sin, 10 + torch.arange(3)[None], True),
                               rtol=0, atol=1e-12)


def test_batch_idx_appends_to_the_named_rows_only():
    cache = KVCache(2, 24, 2, 16, F64, "cpu", spare_rows=3)
    before = cache.snapshot()
    q = torch.randn(2, 1, 4, 16, dtype=F64)
    k_new, v_new = torch.randn(2, 2, 2, 16, dtype=F64), torch.randn(2, 2, 2, 16, dtype=F64)
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k_new, v_new, cache_seqlens=seqlens_tensor([3, 9]),
                                  cache_batch_idx=cache.cache_batch_idx)
    cache.check_append(before, k_new, v_new, seqlens_tensor([3, 9]))
    untouched = [r for r in range(5) if r not in cache.cache_batch_idx.tolist()]
    assert torch.equal(cache.k_cache[untouched], cache.views(before)[0][untouched])


def test_leftpad_hides_keys_even_when_a_window_reaches_them():
    q = torch.randn(1, 1, 2, 16, dtype=F64)
    k_cache, v_cache = torch.randn(1, 32, 2, 16, dtype=F64), torch.randn(1, 32, 2, 16, dtype=F64)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens_tensor([20]),
                                             cache_leftpad=seqlens_tensor([12]), window_size=(15, 0),
                                             return_softmax_lse=True)
    want, want_lse = attention_reference(q, k_cache[:, 12:20], v_cache[:, 12:20])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12)


def test_long_query_chunk_equals_causal_attention_over_the_sequence():
    # Chunked prefill: a 300-token chunk appended after 200 cached tokens attends like causal
    # attention of the whole 500-token sequence's last 300 queries.
    keys, values = torch.randn(1, 500, 2, 32, dtype=F64), torch.randn(1, 500, 2, 32, dtype=F64)
    q = torch.randn(1, 300, 8, 32, dtype=F64)
    k_cache, v_cache = torch.zeros(1, 512, 2, 32, dtype=F64), torch.zeros(1, 512, 2, 32, dtype=F64)
    k_cache[:, :200], v_cache[:, :200] = keys[:, :200], values[:, :200]
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, keys[:, 200:], values[:, 200:],
                                        cache_seqlens=seqlens_tensor([200]), causal=True)
    want, _ = attention_reference(q, keys, values, causal=True)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
