"""flash_attn_func and its packed forms take flash-attn 2.8's parameters in flash-attn's order, so
code ported from flash-attn means the same thing here; what fattn does not implement yet raises."""

import inspect
import tomllib
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck

import fattn

FLASH_ATTN_PARAMS = ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap",
                     "alibi_slopes", "deterministic", "return_attn_probs"]


def _positional(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


def test_positional_order_is_flash_attn_s():
    assert _positional(fattn.flash_attn_func) == FLASH_ATTN_PARAMS
    assert _positional(fattn.flash_attn_qkvpacked_func) == ["qkv"] + FLASH_ATTN_PARAMS[3:]
    assert _positional(fattn.flash_attn_kvpacked_func) == ["q", "kv"] + FLASH_ATTN_PARAMS[3:]
    assert _keyword_only(fattn.flash_attn_func) == ["return_lse", "q_segment_ids", "kv_segment_ids", "sinks", "bias",
                                                    "q_descale", "k_descale", "v_descale"]


def _keyword_only(fn):
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def test_varlen_positional_order_is_flash_attn_s():
    varlen = ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    assert _positional(fattn.flash_attn_varlen_func) == FLASH_ATTN_PARAMS[:3] + varlen + FLASH_ATTN_PARAMS[3:] + [
        "block_table"]
    assert _positional(fattn.flash_attn_varlen_qkvpacked_func) == ["qkv", "cu_seqlens", "max_seqlen"] + \
        FLASH_ATTN_PARAMS[3:]
    assert _positional(fattn.flash_attn_varlen_kvpacked_func) == ["q", "kv"] + varlen + FLASH_ATTN_PARAMS[3:]
    assert _keyword_only(fattn.flash_attn_varlen_func) == ["seqused_k", "return_lse", "sinks", "q_descale",
                                                           "k_descale", "v_descale"]


def test_a_call_ported_from_flash_attn_means_the_same():
    q, k, v = (torch.randn(2, 7, 4, 16, dtype=torch.float64) for _ in range(3))
    # flash_attn_func(q, k, v, 0.0, None, True): no dropout, default scale, causal.
    ported = fattn.flash_attn_func(q, k, v, 0.0, None, True)
    want = fattn.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(ported, want, rtol=0, atol=0)
    scaled = fattn.flash_attn_func(q, k, v, 0.0, 0.5)
    torch.testing.assert_close(scaled, fattn.flash_attn_func(q, k, v, softmax_scale=0.5), rtol=0, atol=0)
    assert not torch.allclose(scaled, fattn.flash_attn_func(q, k, v))


def test_return_attn_probs_gives_out_lse_none():
    q, k, v = (torch.randn(1, 5, 2, 16, dtype=torch.float64) for _ in range(3))
    out, lse, probs = fattn.flash_attn_func(q, k, v, return_attn_probs=True)
    want_out, want_lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    assert probs is None
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)


@pytest.mark.parametrize("fn", ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"])
def test_dropout_p_in_fourth_place_drops_and_manual_seed_reproduces_it(fn):
    q = torch.randn(1, 5, 2, 16, dtype=torch.float64)
    args = {"flash_attn_func": (q, q, q), "flash_attn_qkvpacked_func": (torch.stack([q, q, q], 2),),
            "flash_attn_kvpacked_func": (q, torch.stack([q, q], 2))}[fn]
    torch.manual_seed(3)
    dropped = getattr(fattn, fn)(*args, 0.5)
    torch.manual_seed(3)
    again = getattr(fattn, fn)(*args, 0.5)
    assert torch.equal(dropped, again)
    assert not torch.allclose(dropped, getattr(fattn, fn)(*args, 0.0))


def test_packed_forms_equal_the_unpacked_call_with_gradients():
    qkv = torch.randn(2, 6, 3, 4, 16, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.unbind(2)
    torch.testing.assert_close(fattn.flash_attn_qkvpacked_func(qkv, causal=True),
                               fattn.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)
    assert gradcheck(lambda t: fattn.flash_attn_qkvpacked_func(t, causal=True), (qkv,), eps=1e-6, atol=1e-5)
    q = torch.randn(2, 5, 4, 16, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 6, 2, 2, 16, dtype=torch.float64, requires_grad=True)  # GQA: 2 kv heads
    out, lse = fattn.flash_attn_kvpacked_func(q, kv, causal=True, return_lse=True)
    want_out, want_lse = fattn.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], causal=True, return_lse=True)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)
    assert gradcheck(lambda a, b: fattn.flash_attn_kvpacked_func(a, b), (q, kv), eps=1e-6, atol=1e-5)


def test_version_is_pyproject_s():
    pyproject = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    assert fattn.__version__ == pyproject["project"]["version"]


# flash-attn 2.8's flash_attn_with_kvcache parameters, in order.
FLASH_ATTN_KVCACHE_PARAMS = ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens",
                             "cache_batch_idx", "cache_leftpad", "block_table", "softmax_scale", "causal",
                             "window_size", "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
                             "return_softmax_lse"]


def test_kvcache_positional_order_is_flash_attn_s():
    assert _positional(fattn.flash_attn_with_kvcache) == FLASH_ATTN_KVCACHE_PARAMS
    assert _keyword_only(fattn.flash_attn_with_kvcache) == ["return_lse", "sinks", "k_descale", "v_descale"]


def test_a_kvcache_call_ported_from_flash_attn_means_the_same():
    q = torch.randn(2, 1, 4, 16, dtype=torch.float64)
    k_cache, v_cache = (torch.randn(2, 32, 2, 16, dtype=torch.float64) for _ in range(2))
    seqlens = torch.tensor([5, 20], dtype=torch.int32)
    # flash_attn_with_kvcache(q, k_cache, v_cache, None, None, None, None, cache_seqlens, None, None, None,
    #                         0.5, True, (-1, -1), 0.0, True, None, 0, True)
    ported = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, None, None, None, None, seqlens, None, None, None, 0.5,
                                           True, (-1, -1), 0.0, True, None, 0, True)
    want = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, softmax_scale=0.5, causal=True,
                                         return_lse=True)
    for got, expected in zip(ported, want):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


