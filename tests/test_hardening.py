"""Regression tests for defects found by fuzzing: each failed silently or left inputs changed."""

import pytest
import torch

import fattn
from helpers import requires_gpu

F64 = torch.float64


def _decode_inputs():
    q = torch.randn(2, 1, 4, 16, dtype=F64)
    k_cache, v_cache = torch.randn(2, 32, 2, 16, dtype=F64), torch.randn(2, 32, 2, 16, dtype=F64)
    k_new, v_new = torch.randn(2, 1, 2, 16, dtype=F64), torch.randn(2, 1, 2, 16, dtype=F64)
    return q, k_cache, v_cache, k_new, v_new, torch.tensor([3, 5], dtype=torch.int32)


@pytest.mark.parametrize("call, match", [
    (lambda q: torch.ops.fattn.forward(q, q.to("meta"), q, None, False, False), "k is on meta but q is on cpu"),
    (lambda q: torch.ops.fattn.backward(q, q, q, q, q, torch.zeros(1, 2, 3, dtype=F64),
                                        torch.zeros(1, 2, 3, dtype=F64, device="meta"), None, False, False),
     "dlse is on meta but q is on cpu"),
    (lambda q: torch.ops.fattn.merge_attention_states(torch.randn(2, 1, 3, 2, 16),
                                                      torch.randn(2, 1, 2, 3, device="meta")),
     "lses is on meta but outs is on cpu"),
])
def test_a_meta_tensor_among_cpu_inputs_raises(call, match):
    with pytest.raises(RuntimeError, match=match):
        call(torch.randn(1, 3, 2, 16, dtype=F64))


@pytest.mark.parametrize("which", ["cache_seqlens", "block_table"])
def test_decode_with_a_meta_index_tensor_raises_and_writes_nothing(which):
    q, k_cache, v_cache, k_new, v_new, seqlens = _decode_inputs()
    before = k_cache.clone()
    if which == "cache_seqlens":
        args, kwargs = (q, k_cache, v_cache, k_new, v_new), dict(cache_seqlens=seqlens.to("meta"))
    else:
        pages = torch.randn(4, 16, 2, 16, dtype=F64)
        k_cache, before = pages, pages.clone()
        args = (q, pages, pages.clone(), k_new, v_new)
        kwargs = dict(cache_seqlens=seqlens, block_table=torch.zeros(2, 2, dtype=torch.int32, device="meta"))
    with pytest.raises(RuntimeError, match=f"{which} is on meta but q is on cpu"):
        torch.ops.fattn.decode(*args, **kwargs)
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize("which", ["k_descale", "v_descale"])
def test_decode_with_a_meta_descale_raises_and_writes_nothing(which):
    # An FP8 cache's descale on the meta device has no data for the CPU op to read.
    q, k_cache, v_cache, k_new, v_new, seqlens = _decode_inputs()
    k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    before = k_cache.view(torch.uint8).clone()
    with pytest.raises(RuntimeError, match=f"{which} is on meta but q is on cpu"):
        torch.ops.fattn.decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                               **{which: torch.ones(2, 2, device="meta")})
    assert torch.equal(k_cache.view(torch.uint8), before)


def test_second_order_gradients_raise_instead_of_being_zero():
    q = torch.randn(1, 5, 2, 16, dtype=F64, requires_grad=True)
    k, v = torch.randn(1, 5, 2, 16, dtype=F64), torch.randn(1, 5, 2, 16, dtype=F64)
    out = fattn.flash_attn_func(q, k, v)
    with pytest.raises(RuntimeError, match="second-order gradients are not supported"):
        torch.autograd.grad((out * out).sum(), q, create_graph=True)
    # First-order gradients are unaffected.
    g, = torch.autograd.grad((fattn.flash_attn_func(q, k, v) ** 2).sum(), q)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[requires_gpu, pytest.mark.gpu])])
@pytest.mark.parametrize("split", [0, 1])
def test_merge_propagates_a_nan_lse(split, device):
    outs = torch.randn(2, 1, 3, 2, 16, device=device)
    lses = torch.randn(2, 1, 2, 3, device=device)
    lses[split, 0, 1, 2] = float("nan")
    out, lse = fattn.merge_attention_states(outs, lses)
    assert torch.isnan(lse[0, 1, 2]) and torch.isnan(out[0, 2, 1]).all()
    lse[0, 1, 2] = 0
    assert torch.isfinite(lse).all()  # only the poisoned row


@pytest.mark.parametrize("bad", ["expanded v_cache", "k_cache requires grad", "inference-mode cache"])
def test_decode_refuses_a_cache_it_cannot_append_to_before_writing(bad):
    q, k_cache, v_cache, k_new, v_new, seqlens = _decode_inputs()
    if bad == "expanded v_cache":
        v_cache = torch.randn(2, 1, 2, 16, dtype=F64).expand(2, 32, 2, 16)
        match = "v_cache is an expanded view"
    elif bad == "k_cache requires grad":
        k_cache.requires_grad_()
        match = "k_cache requires grad"
    else:
        with torch.inference_mode():
            v_cache = torch.randn(2, 32, 2, 16, dtype=F64)
        match = "v_cache was created under torch.inference_mode"
    before = k_cache.detach().clone()
    with pytest.raises(RuntimeError, match=match):
        fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens)
    assert torch.equal(k_cache.detach(), before), "k_cache was written before the error"


def test_decode_op_refuses_an_expanded_cache_too():
    q, k_cache, _, k_new, v_new, seqlens = _decode_inputs()
    v_cache = torch.randn(2, 1, 2, 16, dtype=F64).expand(2, 32, 2, 16)
    before = k_cache.clone()
    with pytest.raises(RuntimeError, match="v_cache is an expanded view"):
        torch.ops.fattn.decode(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens)
    assert torch.equal(k_cache, before)


def test_ring_simulate_refuses_kv_of_another_length():
    q, k = torch.randn(1, 8, 2, 16, dtype=F64), torch.randn(1, 12, 2, 16, dtype=F64)
    with pytest.raises(ValueError, match="k and v must have q's sequence length 8"):
        fattn.ring.simulate(q, k, k, 2)


@pytest.mark.parametrize("call, match", [
    (lambda q: fattn.ring.simulate(q, q, q, 0), "world must be an int >= 1, got 0"),
    (lambda q: fattn.ring.shard(q, 0, 0), "world must be an int >= 1, got 0"),
    (lambda q: fattn.ring.shard(q, 2, 2), r"rank 2 is not in \[0, world = 2\)"),
    (lambda q: fattn.ring.ring_schedule(0, 8), "fattn.ring.ring_schedule: world must be an int >= 1, got 0"),
    (lambda q: fattn.ring.ring_schedule(2, 8, sharding="striped"), "sharding must be one of"),
    (lambda q: fattn.flash_attn_func(q, q, q, window_size=4), "window_size must be a \\(left, right\\) pair"),
    (lambda q: fattn.flash_attn_with_kvcache(q[:, :1], q, q, window_size=4),
     "window_size must be a \\(left, right\\) pair"),
])
def test_misuse_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(torch.randn(1, 8, 2, 16, dtype=F64))
