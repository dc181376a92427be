"""Decode over FP8 KV caches on the CPU op, the specification of the CUDA kernels: out and lse
against the plain PyTorch reference on the dequantized caches (fattn.reference.kvcache_reference),
and the appended entries bit for bit against torch's own quantization (quantize_kv)."""

from __future__ import annotations

import pytest
import torch

import fattn
from fattn.reference import quantize_kv
from helpers import FP8_CASES, check_outputs, fp8_call, fp8_case_id, fp8_problem, fp8_references, stored_tokens

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.mark.parametrize("q_dtype", [torch.float64, torch.bfloat16], ids=["float64", "bfloat16"])
@pytest.mark.parametrize("case", FP8_CASES, ids=fp8_case_id)
def test_fp8_cache_against_the_reference(case, q_dtype):
    p = fp8_problem(case, q_dtype, "cpu")
    snap = p.cache.snapshot()
    out, lse = fp8_call(p)
    ref_out, ref_lse, low_out = fp8_references(p, snap)
    check_outputs(out, lse, p.q, ref_out, ref_lse, low_out, what=case[0])  # float64: within 1e-10
    k, v = stored_tokens(p)
    p.cache.check_append(snap, k, v, p.cache_seqlens, what=case[0])  # bit for bit, nothing else written
    if k is not None and p.kw["k_descale"] is not None:  # the saturation was exercised
        assert (k.float().abs() == torch.finfo(k.dtype).max).any()


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("descale", [None, 0.5, 2.0 ** -12])
def test_append_rounds_every_float16_value_as_torch_does(dtype, descale):
    """Every finite float16 value appended (x / descale exact in float32: a power of two), compared
    bit for bit with torch's conversion of the clamped value: rounding to nearest even, ties,
    subnormals, underflow to zero and saturation."""
    codes = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    values = codes.view(torch.float16)
    values = values[torch.isfinite(values)]
    head_dim = 256
    values = torch.cat([values, values[: (-values.numel()) % head_dim]])
    k = values.reshape(1, -1, 1, head_dim)  # [batch 1, seqlen_new, kv_heads 1, head_dim]
    v = k.flip(1)
    capacity = k.shape[1]
    k_cache = torch.zeros(1, capacity, 1, head_dim).to(dtype)
    v_cache = torch.zeros(1, capacity, 1, head_dim).to(dtype)
    scale = None if descale is None else torch.full((1, 1), descale)
    q = torch.zeros(1, 1, 1, head_dim, dtype=torch.float16)
    fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=v, cache_seqlens=0, k_descale=scale, v_descale=scale)
    assert torch.equal(k_cache.view(torch.uint8), quantize_kv(k, scale, dtype).view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), quantize_kv(v, scale, dtype).view(torch.uint8))


def test_missing_descale_means_one():
    case = next(c for c in FP8_CASES if c[0] == "e4m3-contiguous-gqa4-append1")
    p = fp8_problem(case, torch.bfloat16, "cpu")
    p.kw.update(k_descale=None, v_descale=None)
    twin = p.to("cpu")
    ones = torch.ones(p.q.shape[0], p.cache.k_cache.shape[2])
    twin.kw.update(k_descale=ones, v_descale=ones)
    out, lse = fp8_call(p)
    out1, lse1 = fp8_call(twin)
    assert torch.equal(out, out1) and torch.equal(lse, lse1)
    for a, b in zip(p.cache.bases, twin.cache.bases):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_descales_follow_the_sequence_not_its_cache_row():
    """With cache_batch_idx, sequence b reads cache row cache_batch_idx[b] with descale[b]: the
    FP8 call equals a float64 call over caches dequantized that way."""
    torch.manual_seed(0)
    batch, rows, kv_heads, d = 3, 5, 2, 32
    k_cache = torch.randn(rows, 40, kv_heads, d).mul(8).to(E4M3)
    v_cache = torch.randn(rows, 40, kv_heads, d).mul(8).to(E4M3)
    batch_idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    k_descale, v_descale = torch.rand(batch, kv_heads) + 0.1, torch.rand(batch, kv_heads) + 0.1
    q = torch.randn(batch, 2, 4, d, dtype=torch.float64)
    lengths = torch.tensor([40, 17, 3], dtype=torch.int32)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_batch_idx=batch_idx,
                                             causal=True, k_descale=k_descale, v_descale=v_descale, return_lse=True)
    k64, v64 = torch.zeros(rows, 40, kv_heads, d, dtype=torch.float64), torch.zeros(rows, 40, kv_heads, d,
                                                                                    dtype=torch.float64)
    for b, row in enumerate(batch_idx.tolist()):
        k64[row] = k_cache[row].double() * k_descale[b].double()[None, :, None]
        v64[row] = v_cache[row].double() * v_descale[b].double()[None, :, None]
    want_out, want_lse = fattn.flash_attn_with_kvcache(q, k64, v64, cache_seqlens=lengths, cache_batch_idx=batch_idx,
                                                       causal=True, return_lse=True)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_append_rounds_once_near_ties(dtype):
    """Values a hair from the format's ties (2^-30 of them), on them, at the subnormals' first tie
    and past the largest value: the append rounds the exact quotient once, where float64 -> float32
    -> FP8 (torch's cast) would meet a tie that is not there; quantize_kv rounds to odd at float32
    for that reason, and must agree."""
    finfo = torch.finfo(dtype)
    step = 2.0 ** -3 if dtype == E4M3 else 2.0 ** -2  # the spacing of [1, 2)
    tie, tiny = 1 + step / 2, finfo.smallest_normal * (2.0 ** -3 if dtype == E4M3 else 2.0 ** -2) / 2
    values = [tie + 2 ** -30, tie - 2 ** -30, tie, -(tie + 2 ** -30), 1 + 1.5 * step + 2 ** -35, tiny, tiny + 2 ** -40,
              -(tiny + 2 ** -40), finfo.max * 1.01, -finfo.max * 3]
    want = [1 + step, 1.0, 1.0, -(1 + step), 1 + 2 * step, 0.0, 2 * tiny, -2 * tiny, finfo.max, -finfo.max]
    x = torch.tensor(values + [0.0] * (32 - len(values)), dtype=torch.float64).reshape(1, 1, 1, 32)
    k_cache = torch.zeros(1, 4, 1, 32).to(dtype)
    v_cache = torch.zeros(1, 4, 1, 32).to(dtype)
    fattn.flash_attn_with_kvcache(torch.zeros(1, 1, 1, 32, dtype=torch.float64), k_cache, v_cache, k=x, v=-x,
                                  cache_seqlens=1)
    assert k_cache[0, 1, 0, :len(want)].double().tolist() == want
    assert v_cache[0, 1, 0, :len(want)].double().tolist() == [-w for w in want]
    assert torch.equal(k_cache[:, 1:2].view(torch.uint8), quantize_kv(x, None, dtype).view(torch.uint8))
