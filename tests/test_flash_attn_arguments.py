"""What the public functions accept where flash-attn does (python/fattn/_arguments.py): window_size
in any form that unpacks to two ints (flash-attn's own tests pass a tensor), numpy numbers, lengths
as 0-d tensors; one window rule for every entry point; clear errors naming the caller's argument
for what no form makes sense of. And the forward-only functions run on inputs that require grad,
refusing the backward instead of dropping the gradient."""

import numpy as np
import pytest
import torch

import fattn
from helpers import paged_varlen_inputs

F64 = torch.float64


def _qkv(seqlen=9):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, seqlen, h, 16, dtype=F64, generator=g) for h in (4, 2, 2)]


def _packed(q, k, v):
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    return q[0], k[0], v[0], cu


def _calls():
    """Each public entry point taking window_size, as fn(window_size=..., **extra)."""
    q, k, v = _qkv()
    pq, pk, pv, cu = _packed(q, k, v)
    k_cache, v_cache = (torch.randn(2, 32, 2, 16, dtype=F64) for _ in range(2))
    pool_q, k_pool, v_pool, cu_q, cu_k, table = paged_varlen_inputs([4, 6], [30, 50], 4, 2, 16, 16, F64, "cpu")
    return {
        "flash_attn_func": lambda **kw: fattn.flash_attn_func(q, k, v, **kw),
        "flash_attn_varlen_func": lambda **kw: fattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 5, 5, **kw),
        "flash_attn_with_kvcache": lambda **kw: fattn.flash_attn_with_kvcache(q, k_cache, v_cache,
                                                                              cache_seqlens=20, **kw),
        "flash_attn_varlen_func(block_table)": lambda **kw: fattn.flash_attn_varlen_func(
            pool_q, k_pool, v_pool, cu_q, cu_k, 6, 50, block_table=table, **kw),
    }


CALLS = list(_calls())


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("form", ["tensor", "numpy", "list", "np.int64 pair"])
def test_window_size_in_any_pair_form(call, form):
    fn = _calls()[call]
    want = fn(window_size=(3, 1))
    window = {"tensor": torch.tensor([3, 1]), "numpy": np.array([3, 1]), "list": [3, 1],
              "np.int64 pair": (np.int64(3), np.int32(1))}[form]
    assert torch.equal(fn(window_size=window), want)


@pytest.mark.parametrize("call", CALLS)
def test_a_window_wider_than_any_sequence_is_unbounded(call):
    fn = _calls()[call]
    assert torch.equal(fn(window_size=(2**64, 2**70)), fn(window_size=(-1, -1)))
    assert torch.equal(fn(window_size=(2**64, 0)), fn(window_size=(-1, 0)))


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("window", [(-3, 0), (-7, -2), (0, -2)])
def test_one_window_rule_everywhere(call, window):
    with pytest.raises(RuntimeError, match=r"window_size is \(-?\d+, -?\d+\); expected each side -1 \(unbounded\)"):
        _calls()[call](window_size=window)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("window", [4, (1, 2, 3), (1.5, 2), torch.tensor([1.0, 2.0]), "ab", (True, 0)])
def test_what_is_no_pair_of_ints_is_a_type_error_naming_window_size(call, window):
    with pytest.raises(TypeError, match="window_size must be a \\(left, right\\) pair of ints"):
        _calls()[call](window_size=window)


def test_numpy_numbers_and_0d_tensors_where_flash_attn_takes_them():
    q, k, v = _qkv()
    want = fattn.flash_attn_func(q, k, v, 0.0, 0.3, True, softcap=2.0)
    got = fattn.flash_attn_func(q, k, v, np.float32(0.0), np.float64(0.3), np.bool_(True), softcap=np.float32(2.0))
    assert torch.equal(got, want)
    pq, pk, pv, cu = _packed(q, k, v)
    want = fattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, 5, 5, causal=True)
    for lengths in ((np.int64(5), np.int32(5)), (torch.tensor(5), torch.tensor(5, dtype=torch.int32))):
        assert torch.equal(fattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, *lengths, causal=True), want)
    k_cache, v_cache = (torch.randn(2, 32, 2, 16, dtype=F64) for _ in range(2))
    want = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20, num_splits=2)
    got = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=np.int64(20), num_splits=np.int32(2))
    assert torch.equal(got, want)


@pytest.mark.parametrize("name,value,error,match", [
    ("max_seqlen_q", 4.0, TypeError, r"flash_attn_varlen_func: max_seqlen_q must be an int, got 4.0"),
    ("max_seqlen_k", torch.tensor([5, 5]), TypeError, r"max_seqlen_k must be an int"),
    ("max_seqlen_q", -1, RuntimeError, r"max_seqlen_q is -1; expected >= 0"),
    ("softmax_scale", "0.5", TypeError, r"softmax_scale must be a number or None"),
    ("causal", 1, TypeError, r"causal must be a bool, got 1"),
])
def test_varlen_arguments_that_make_no_sense_name_themselves(name, value, error, match):
    q, k, v = _qkv()
    pq, pk, pv, cu = _packed(q, k, v)
    kw = dict(max_seqlen_q=5, max_seqlen_k=5)
    kw[name] = value
    with pytest.raises(error, match=match):
        fattn.flash_attn_varlen_func(pq, pk, pv, cu, cu, **kw)


def test_kvcache_scalar_arguments_name_themselves():
    q, _, _ = _qkv()
    k_cache, v_cache = (torch.randn(2, 32, 2, 16, dtype=F64) for _ in range(2))
    with pytest.raises(TypeError, match="cache_seqlens must be an int, got 2.5"):
        fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=2.5)
    with pytest.raises(RuntimeError, match="cache_seqlens is -1; expected >= 0"):
        fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=-1)
    with pytest.raises(TypeError, match="num_splits must be an int"):
        fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=3, num_splits=1.0)


def test_kvcache_runs_on_inputs_that_require_grad_and_refuses_the_backward():
    q, _, _ = _qkv()
    k_cache, v_cache = (torch.randn(2, 32, 2, 16, dtype=F64) for _ in range(2))
    new_k, new_v = (torch.randn(2, 1, 2, 16, dtype=F64) for _ in range(2))
    with torch.no_grad():
        want = fattn.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), new_k, new_v, cache_seqlens=20)
    needs_grad = [t.detach().requires_grad_() for t in (q, new_k, new_v)]
    out, lse = fattn.flash_attn_with_kvcache(needs_grad[0], k_cache, v_cache, *needs_grad[1:], cache_seqlens=20,
                                             return_softmax_lse=True)
    assert torch.equal(out.detach(), want) and out.requires_grad
    out.mul_(2)  # an output of its own: the caller may write to it
    with pytest.raises(RuntimeError, match="flash_attn_with_kvcache has no backward"):
        (out.sum() + lse.sum()).backward()
    assert all(t.grad is None for t in needs_grad)
