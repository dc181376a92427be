"""Head dims that are not a multiple of 8 through the public functions (padded in the wrapper,
python/fattn/_head_dim.py): results and gradients against the reference, which needs no padding."""

import math

import pytest
import torch

import fattn
from fattn.reference import attention_reference


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
