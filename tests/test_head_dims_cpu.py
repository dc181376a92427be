"""Head dims that are not a multiple of 8 through every public function (padded in the wrapper,
python/fattn/_head_dim.py): results and gradients against the reference, which needs no padding;
the caches a decode call appends to receive the new tokens."""

import math

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import (
    KVCache, check_outputs, check_paged_varlen, device_dtype_params, new_tokens, references, seqlens_tensor,
)


@pytest.mark.parametrize("head_dim", [1, 5, 20, 60, 250])
def test_any_head_dim_matches_the_reference(head_dim):
    q, k, v = (torch.randn(2, 9, h, head_dim, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, window_size=(4, -1), return_lse=True)
    want_out, want_lse = attention_reference(q, k, v, None, True, window_size=(4, -1))
    assert out.shape == q.shape
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum() + lse.sum(), (q, k, v))
    want = torch.autograd.grad((want_out * w).sum() + want_lse.sum(), (q, k, v))
    for g, r in zip(got, want):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


def test_the_default_scale_is_the_real_head_dim_s():
    q, k, v = (torch.randn(1, 6, 2, 20, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(fattn.flash_attn_func(q, k, v),
                               fattn.flash_attn_func(q, k, v, softmax_scale=1 / math.sqrt(20)), rtol=0, atol=0)


def test_varlen_pads_too():
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = (torch.randn(11, 2, 12, dtype=torch.float64) for _ in range(3))
    out = fattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
    for b in range(2):
        s, e = int(cu[b]), int(cu[b + 1])
        want, _ = attention_reference(q[None, s:e], k[None, s:e], v[None, s:e], None, True)
        torch.testing.assert_close(out[s:e], want[0], rtol=1e-12, atol=1e-12)


def test_mismatched_or_oversized_head_dims_still_raise():
    q = torch.randn(1, 4, 2, 20, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="k has head_dim 24 but q has 20"):
        fattn.flash_attn_func(q, torch.randn(1, 4, 2, 24, dtype=torch.float64), torch.randn(1, 4, 2, 24,
                                                                                            dtype=torch.float64))
    big = torch.randn(1, 4, 2, 260, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="head_dim 260 is not supported"):
        fattn.flash_attn_func(big, big, big)


@pytest.mark.parametrize("device,dtype", device_dtype_params([torch.float64], [torch.float16]))
@pytest.mark.parametrize("page_size", [None, 16], ids=["contiguous", "paged"])
@pytest.mark.parametrize("head_dim", [5, 59])
def test_kvcache_pads_and_appends_to_the_caller_s_caches(head_dim, page_size, device, dtype):
    """flash_attn_with_kvcache at a head dim the kernels lack: out matches the reference, and the
    appended tokens land in the caller's caches (the op wrote padded copies), nothing else changed."""
    q = torch.randn(2, 2, 4, head_dim, dtype=dtype, device=device)
    k, v = new_tokens(2, 2, 2, head_dim, dtype, device)
    cache = KVCache(2, 48, 2, head_dim, dtype, device, page_size=page_size)
    seqlens = seqlens_tensor([3, 17], device)
    snapshot = cache.snapshot()
    ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, seqlens, cache.block_table, k, v,
                                           causal=True)
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k, v, cache_seqlens=seqlens,
                                             block_table=cache.block_table, causal=True, return_softmax_lse=True)
    assert out.shape == q.shape  # a view of the padded output's first head_dim columns, as flash-attn's
    check_outputs(out.contiguous(), lse, q, ref_out, ref_lse, low_out, f"head_dim {head_dim}")
    cache.check_append(snapshot, k, v, seqlens, f"head_dim {head_dim}")


@pytest.mark.parametrize("device,dtype", device_dtype_params([torch.float64], [torch.bfloat16]))
def test_paged_varlen_pads_too(device, dtype):
    check_paged_varlen([3, 5], [20, 33], 4, 2, 44, 16, dtype, device, causal=True)


def test_merge_takes_any_head_dim():
    outs, lses = torch.randn(3, 1, 4, 2, 13, dtype=torch.float64), torch.randn(3, 1, 2, 4, dtype=torch.float64)
    out, lse = fattn.merge_attention_states(outs, lses)
    want_lse = torch.logsumexp(lses, 0)
    want_out = (torch.exp(lses - want_lse).permute(0, 1, 3, 2)[..., None] * outs).sum(0)
    torch.testing.assert_close(lse, want_lse)
    torch.testing.assert_close(out, want_out)
