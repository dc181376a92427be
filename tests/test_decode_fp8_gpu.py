"""Decode over FP8 KV caches on a GPU (skipped without one): the kernels against the float64
reference by flash-attn's 2x rule (check_outputs in tests/helpers/kvcache.py: max|out - ref64| <=
2 * max|ref_in_q_dtype - ref64| + 1e-5, the lse -inf pattern exact and within 5e-3), their append
bit for bit against the CPU op's (the specification), poisoned outputs, long caches, CUDA graph
capture and replay, and the clear error of an arch without FP8 kernels."""

from __future__ import annotations

import pytest
import torch

import fattn
from helpers import (
    FP8_CASES, Fp8Problem, KVCache, check_outputs, fp8_call, fp8_case_id, fp8_kernels_on, fp8_problem, fp8_references,
    fp8_step, poison_allocator, requires_gpu, seqlens_tensor, skip_without_ptx, stored_tokens,
)

pytestmark = [requires_gpu, pytest.mark.gpu]

DEV = "cuda"
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HALF = [torch.float16, torch.bfloat16]


# (without a GPU, requires_gpu gives the reason)
requires_fp8 = pytest.mark.skipif(torch.cuda.is_available() and not fp8_kernels_on(DEV),
                                  reason="needs an sm_89 or sm_90 GPU (the FP8 KV cache kernels' archs)")


def _poison(q):
    batch, seqlen_q, heads, head_dim = q.shape
    poison_allocator(((batch, seqlen_q, heads, head_dim), q.dtype), ((batch, heads, seqlen_q), torch.float32),
                     ((64 << 20,), torch.float32), *[((1 << 18,), torch.float32)] * 4, device=DEV)


def _check_against_the_cpu_op(p, num_splits=0, what=""):
    """The CUDA op on problem p against the float64 reference (2x rule) and its cache after the
    append against the CPU op's on a copy of the same problem."""
    cpu = p.to("cpu")
    snap = p.cache.snapshot()
    ref_out, ref_lse, low_out = fp8_references(p, snap)
    _poison(p.q)
    out, lse = fp8_call(p, num_splits=num_splits)
    torch.cuda.synchronize()
    check_outputs(out, lse, p.q, ref_out, ref_lse, low_out, what=what)
    fp8_call(cpu)  # the specification's append
    rotary = p.kw.get("rotary_cos") is not None
    for got, want in zip(p.cache.bases, cpu.cache.bases):
        steps = fp8_step(got.cpu(), want)
        # The kernel rotates in fp32, the CPU op in float64: a rotated key may round one step apart.
        limit = 1 if rotary else 0
        assert steps.max().item() <= limit, f"{what}: cache differs from the CPU op's by {steps.max().item()} steps"
    if p.k is not None and not rotary:  # and what the append stored is torch's quantization
        k, v = stored_tokens(p)
        p.cache.check_append(snap, k, v, p.cache_seqlens, what=what)
    return out, lse


@requires_fp8
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", FP8_CASES, ids=fp8_case_id)
def test_fp8_cache_against_the_reference(case, dtype):
    _check_against_the_cpu_op(fp8_problem(case, dtype, DEV), what=case[0])


@requires_fp8
@pytest.mark.parametrize("num_splits", [1, 3, 64])
def test_fp8_cache_split_counts(num_splits):
    case = next(c for c in FP8_CASES if c[0] == "e5m2-paged16-gqa4-append3")
    _check_against_the_cpu_op(fp8_problem(case, torch.bfloat16, DEV), num_splits, what=f"splits={num_splits}")


@requires_fp8
@pytest.mark.parametrize("case", FP8_CASES[:6], ids=fp8_case_id)
def test_fp8_cache_on_sm89_code_via_ptx(case, monkeypatch):
    """An 8.9 GPU's code, run here through the PTX (built with FATTN_PTX_ARCHS naming 86 and 89):
    the split kernel and the append from sm_89 (which holds the FP8 variants alone beside sm_86:
    configs.json served_by), the merge and the query rotation from sm_86."""
    skip_without_ptx(89, "attn_decode_split", "kv_append")
    skip_without_ptx(86, "attn_decode_merge", "rotate_queries")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "89")
    _check_against_the_cpu_op(fp8_problem(case, torch.bfloat16, DEV), what=f"sm_89 PTX {case[0]}")


@requires_fp8
@pytest.mark.parametrize("cache_dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("page_size", [None, 256], ids=["contiguous", "paged256"])
def test_fp8_long_cache_gqa_d128(cache_dtype, page_size):
    """The bar's shape, smaller: GQA 32/8, d128, one query token over caches up to 64k keys."""
    lengths = [1, 1000, 65536]
    case = ("long", cache_dtype, lengths, 1, 32, 8, 128, page_size, "contiguous", 1, True, (-1, -1),
            dict(descales="kv"))
    _check_against_the_cpu_op(fp8_problem(case, torch.bfloat16, DEV), what=f"long {cache_dtype} page={page_size}")


@requires_fp8
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
def test_fp8_cache_queries_of_any_magnitude(dtype):
    """The FP8 cache's products run in float16 with each query row scaled by a power of two into
    its range (triton_src/decode.py _fp8_products_query). One KV group holds query rows beyond
    float16's largest value (bf16; near it for fp16), rows of float16 subnormals and ordinary
    rows; k_descale (and the new keys) shrink by the large factor so that the large rows' scores
    stay of ordinary size. All within the 2x rule, whose low-precision reference computes in q's
    dtype."""
    case = next(c for c in FP8_CASES if c[0] == "e4m3-contiguous-gqa4-append1")
    p = fp8_problem(case, dtype, DEV)
    big = 2.0 ** 16 if dtype == torch.bfloat16 else 2.0 ** 12
    factors = torch.tensor([big, 2.0 ** -20, big, 1.0], device=DEV).repeat(p.q.shape[2] // 4)
    p.q = (p.q.double() * factors[:, None]).to(dtype)
    p.kw["k_descale"] = p.kw["k_descale"] / big
    p.k = (p.k.double() / big).to(dtype)  # the same FP8 values once divided by the descale
    if dtype == torch.bfloat16:
        assert p.q.abs().max() > torch.finfo(torch.float16).max
    _check_against_the_cpu_op(p, what=f"query rows scaled by {factors[:4].tolist()}")


@requires_fp8
def test_fp8_cache_descales_are_factors_like_any_other():
    """No descale value is refused (reading them needs a host sync): negative ones flip their
    head's keys or values, the appended tokens' quantization included, as the CPU op (the
    specification) computes them."""
    case = next(c for c in FP8_CASES if c[0] == "e5m2-paged16-gqa4-append3")
    p = fp8_problem(case, torch.bfloat16, DEV)
    k_descale, v_descale = p.kw["k_descale"].clone(), p.kw["v_descale"].clone()
    k_descale[0, 1], v_descale[1, 0], v_descale[2, 1] = -k_descale[0, 1], -v_descale[1, 0], -v_descale[2, 1]
    p.kw["k_descale"], p.kw["v_descale"] = k_descale, v_descale
    _check_against_the_cpu_op(p, what="negative descales")


@requires_fp8
def test_fp8_misaligned_view_is_copied_when_read_and_refused_when_appended():
    """FP8 caches whose token strides are not multiples of 16 bytes read correctly at d128 (the
    padded code serves them: the exact-dim code promises 16-byte strides), and one that does not
    start 16-byte aligned (v_cache here, 8 bytes into the buffer) is read through an aligned copy;
    appending to that one in place is refused before any write."""
    batch, kv_heads, d = 2, 1, 128
    base = torch.randn(batch, 64, kv_heads, d + 8, device=DEV).to(E4M3)
    k_cache, v_cache = base[..., :d], base[..., 8:]
    q = torch.randn(batch, 1, 4, d, dtype=torch.bfloat16, device=DEV)
    descale = torch.full((batch, kv_heads), 0.5, device=DEV)
    lengths = seqlens_tensor([10, 64], DEV)
    out = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, k_descale=descale,
                                        v_descale=descale)
    want = fattn.flash_attn_with_kvcache(q.cpu().double(), k_cache.cpu(), v_cache.cpu(), cache_seqlens=lengths.cpu(),
                                         k_descale=descale.cpu(), v_descale=descale.cpu())
    assert (out.double().cpu() - want).abs().max().item() < 2e-2
    before = base.view(torch.uint8).clone()
    k = torch.randn(batch, 1, kv_heads, d, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RuntimeError, match=r"fattn\.decode: v_cache must start 16-byte aligned with strides that "
                                           r"are multiples of 8 elements"):
        fattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=k, v=k, cache_seqlens=lengths, k_descale=descale,
                                      v_descale=descale)
    assert torch.equal(base.view(torch.uint8), before)


@requires_fp8
@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_cuda_graph_decode_step_with_append(page_size):
    """A captured FP8 decode step replayed with new lengths, tokens and descales: every replay
    equal to the reference (2x rule) and its append to the CPU op's, bit for bit."""
    batch, sq, heads, kv_heads, d, new, dtype = 3, 1, 32, 8, 128, 1, torch.bfloat16
    cache = KVCache(batch, 4096, kv_heads, d, E4M3, DEV, page_size)
    cap = cache.capacity
    q = torch.randn(batch, sq, heads, d, dtype=dtype, device=DEV)
    k = torch.randn(batch, new, kv_heads, d, dtype=dtype, device=DEV)
    v = torch.randn_like(k)
    k_descale = torch.rand(batch, kv_heads, device=DEV) + 0.05
    v_descale = torch.rand(batch, kv_heads, device=DEV) + 0.05
    cache_seqlens = seqlens_tensor([5, 100, 7], DEV)
    step = dict(k=k, v=v, cache_seqlens=cache_seqlens, block_table=cache.block_table, causal=True, return_lse=True,
                k_descale=k_descale, v_descale=v_descale)
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)  # load the modules before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)
    for lengths in ([3, 17, 1], [1000, 0, 4000], [cap - new, 2000, 1], [0, 0, 0]):
        cache_seqlens.copy_(seqlens_tensor(lengths, DEV))
        for dst in (q, k, v):
            dst.copy_(torch.randn_like(dst))
        for dst in (k_descale, v_descale):
            dst.copy_(torch.rand_like(dst) + 0.05)
        p = Fp8Problem(q, cache, k, v, cache_seqlens, dict(causal=True, window_size=(-1, -1), k_descale=k_descale,
                                                            v_descale=v_descale))
        cpu = p.to("cpu")
        fp8_call(cpu)  # the specification's append, on copies
        ref_out, ref_lse, low_out = fp8_references(p, cache.snapshot())
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        what = f"graph replay lengths={lengths}"
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=what)
        for got, want in zip(cache.bases, cpu.cache.bases):
            assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), what


def test_fp8_cache_refused_on_an_arch_without_fp8_kernels(monkeypatch):
    """On a GPU without FP8 kernels (or, on sm_89/sm_90, through the sm_80 PTX), the call fails
    naming the archs, before any write."""
    if fp8_kernels_on(DEV):
        skip_without_ptx(80, "attn_decode_split")
        monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "80")
    cache = KVCache(2, 64, 2, 64, E4M3, DEV)
    before = [b.view(torch.uint8).clone() for b in cache.bases]
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=DEV)
    k = torch.randn(2, 1, 2, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(RuntimeError, match=r"fattn\.decode: an FP8 KV cache \(float8_e4m3fn\) needs sm_89 or sm_90"):
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, k=k, v=k, cache_seqlens=seqlens_tensor([3, 9], DEV))
    assert all(torch.equal(b.view(torch.uint8), w) for b, w in zip(cache.bases, before))


def test_descale_on_another_device():
    cache = KVCache(2, 64, 2, 64, E4M3, DEV)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=DEV)
    for name in ("k_descale", "v_descale"):
        with pytest.raises(RuntimeError, match=rf"fattn\.decode: {name} is on cpu but q is on cuda:0"):
            fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([3, 9], DEV),
                                          **{name: torch.ones(2, 2)})
