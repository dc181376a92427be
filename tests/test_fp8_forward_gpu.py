"""The FP8 forward on a GPU (sm_89, sm_90): against float64 attention of the dequantized inputs
with the FP8 rule (tests/helpers/fp8.py: within 2x the FP8-emulated computation's error), e4m3
and e5m2, odd lengths and head dims, GQA, masks and score modifications, packed sequences,
strided views, poisoned outputs, CUDA graphs, and the error on GPUs without FP8 tensor cores.

The relative error distributions print with -s (pytest's capture off): the numbers that
docs/api.md's FP8 section quotes.
"""

import pytest
import torch

import fattn
from helpers import fp8_kernels_on, kernels_launched, poison_allocator, requires_gpu, skip_without_ptx
from helpers.fp8 import FP8_DTYPES, check_fp8_accuracy, fp8_qkv, fp8_references

pytestmark = [requires_gpu, pytest.mark.gpu]


needs_fp8 = pytest.mark.skipif(not torch.cuda.is_available() or not fp8_kernels_on("cuda"),
                               reason="needs an sm_89 or sm_90 GPU (the FP8 forward kernels' archs)")

# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim)
CASES = [(1, 1, 1, 2, 2, 64), (2, 113, 113, 4, 2, 64), (1, 1000, 1000, 8, 1, 128), (1, 3824, 3824, 2, 2, 128),
         (2, 17, 1000, 6, 3, 80), (1, 1000, 17, 4, 4, 256), (1, 333, 517, 4, 2, 96), (1, 128, 4096, 2, 1, 32),
         (1, 257, 257, 2, 2, 200), (2, 113, 1000, 4, 2, 256)]


def _check(case, fp8, causal=False, layout="contiguous", q_heads="kv", **variant):
    q, k, v, qd, kd, vd = fp8_qkv(*case, fp8, "cuda", q_descale_heads=q_heads, layout=layout, seed=sum(case))
    batch, sq, _, heads, _, d = case
    poison_allocator(((batch, sq, heads, d), torch.bfloat16), ((batch, heads, sq), torch.float32), device="cuda")
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, q_descale=qd, k_descale=kd,
                                     v_descale=vd, **variant)
    torch.cuda.synchronize()
    assert out.shape == (batch, sq, heads, d) and out.dtype == torch.bfloat16
    refs = fp8_references(q, k, v, qd, kd, vd, None, causal, **variant)
    stats = check_fp8_accuracy(out, lse, refs, what=f"{case} {fp8} causal={causal} {variant}")
    print(f"fp8 {str(fp8)[6:]} {case} causal={causal} relative error median {stats[0]:.2e} p99 {stats[1]:.2e} "
          f"max {stats[2]:.2e}")


@needs_fp8
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_fp8_forward_matches_reference(case, fp8, causal):
    _check(case, fp8, causal)


@needs_fp8
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("variant", [
    dict(window_size=(64, 16)), dict(softcap=5.0), dict(window_size=(100, -1), softcap=2.0),
    dict(sinks="heads"), dict(sinks="dominant"), dict(alibi="heads")], ids=str)
def test_fp8_forward_variants(variant, fp8, head_dim):
    """"dominant" sinks hold most of the weight of the rows of heads whose scores are small (logits
    about 8 against scores of about 1; fp8_qkv draws heads of several magnitudes):
    the kernel's row sums count its probabilities times the FP8 probability scale, and a sink
    left out of that scale would change the outputs several times over."""
    variant = dict(variant)
    heads = 4
    sinks = variant.pop("sinks", None)
    if sinks:
        variant["sinks"] = torch.randn(heads, device="cuda") + (8.0 if sinks == "dominant" else 0.0)
    if variant.pop("alibi", None):
        variant["alibi_slopes"] = torch.rand(heads, device="cuda") * 0.1
    _check((2, 400, 700, heads, 2, head_dim), fp8, causal=True, **variant)


@needs_fp8
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
def test_fp8_strided_views_and_q_descale_per_head(fp8):
    _check((2, 300, 400, 4, 2, 64), fp8, causal=True, layout="strided", q_heads="q")


@needs_fp8
def test_fp8_varlen_matches_each_sequence():
    lens = [(1, 1), (113, 200), (700, 650)]
    pieces = [fp8_qkv(1, sq, sk, 4, 2, 128, torch.float8_e4m3fn, "cuda", seed=i) for i, (sq, sk) in enumerate(lens)]
    q, k, v = (torch.cat([p[i][0] for p in pieces]) for i in range(3))
    qd, kd, vd = (torch.cat([p[i] for p in pieces]) for i in (3, 4, 5))
    cu_q = torch.tensor([0, 1, 114, 814], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 1, 201, 851], dtype=torch.int32, device="cuda")
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 700, 650, causal=True, return_lse=True,
                                            q_descale=qd, k_descale=kd, v_descale=vd)
    for b, p in enumerate(pieces):
        # The dense calls may run another kernel (the packed ones keep one tile per program): each
        # sequence is held to the FP8 rule on its own.
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        check_fp8_accuracy(out[None, rows], lse[None, :, rows], fp8_references(*p, None, True), what=f"sequence {b}")


@needs_fp8
def test_fp8_cuda_graph_and_compile():
    static = fp8_qkv(1, 300, 300, 4, 2, 128, torch.float8_e4m3fn, "cuda")
    fattn.flash_attn_func(*static[:3], causal=True)  # load the module before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fattn.flash_attn_func(*static[:3], causal=True, q_descale=static[3], k_descale=static[4],
                                    v_descale=static[5])
    fresh = fp8_qkv(1, 300, 300, 4, 2, 128, torch.float8_e4m3fn, "cuda", seed=5)
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = fattn.flash_attn_func(*fresh[:3], causal=True, q_descale=fresh[3], k_descale=fresh[4], v_descale=fresh[5])
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    compiled = torch.compile(lambda *a: fattn.flash_attn_func(*a[:3], causal=True, q_descale=a[3], k_descale=a[4],
                                                              v_descale=a[5]), fullgraph=True)
    torch.testing.assert_close(compiled(*fresh), want, atol=0, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a CUDA GPU of sm_90 (the Hopper kernel)")
@pytest.mark.parametrize("d,kernel", [(64, "attn_fwd"), (128, "attn_fwd_sm90"), (256, "attn_fwd_sm90")])
def test_fp8_long_calls_run_the_expected_kernel(d, kernel):
    """On sm_90 long FP8 calls at d128 and d256 run the Gluon kernel (V^T by TMA, P in e4m3 from
    registers), d64 the Triton one (configs.json); both meet the FP8 rule."""
    case = (1, 8192 if d == 64 else 2048, 2048, 4, 2, d)
    q, k, v, qd, kd, vd = fp8_qkv(*case, torch.float8_e4m3fn, "cuda")
    names = kernels_launched(lambda: fattn.flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd))
    assert kernel in names and ({"attn_fwd", "attn_fwd_sm90"} - {kernel}).isdisjoint(names), names
    assert "fp8_transpose_v" in names, names
    _check(case, torch.float8_e4m3fn, causal=False)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs a CUDA GPU of sm_90 (the Hopper kernel)")
def test_fp8_rows_tma_cannot_read_run_attn_fwd():
    """d120 FP8 rows are 120 bytes: odd heads start 8 bytes off 16, which TMA refuses, so a long
    call that would run the Hopper kernel runs attn_fwd, and is right."""
    case = (1, 2048, 2048, 3, 3, 120)
    q, k, v, qd, kd, vd = fp8_qkv(*case, torch.float8_e4m3fn, "cuda")
    names = kernels_launched(lambda: fattn.flash_attn_func(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd))
    assert "attn_fwd" in names and "attn_fwd_sm90" not in names, names
    _check(case, torch.float8_e4m3fn, causal=True)


@needs_fp8
def test_fp8_varlen_seqused_k_never_reads_the_unused_keys():
    """Keys past seqused_k hold NaN (e4m3's 0x7F): V^T leaves them out, so no 0 * NaN reaches out."""
    lens, used = [(64, 700), (300, 900)], [500, 1]
    pieces = [fp8_qkv(1, sq, sk, 4, 2, 128, torch.float8_e4m3fn, "cuda", seed=i) for i, (sq, sk) in enumerate(lens)]
    q, k, v = (torch.cat([p[i][0] for p in pieces]) for i in range(3))
    for t in (k, v):
        t.view(torch.uint8)[500:700] = 0x7F
        t.view(torch.uint8)[701:] = 0x7F
    qd, kd, vd = (torch.cat([p[i] for p in pieces]) for i in (3, 4, 5))
    cu_q = torch.tensor([0, 64, 364], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 700, 1600], dtype=torch.int32, device="cuda")
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda")
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 300, 900, seqused_k=seqused, return_lse=True,
                                            q_descale=qd, k_descale=kd, v_descale=vd)
    for b, (n, start) in enumerate(zip(used, (0, 700))):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(start, start + n)
        refs = fp8_references(q[None, rows], k[None, keys], v[None, keys], qd[b:b + 1], kd[b:b + 1], vd[b:b + 1])
        check_fp8_accuracy(out[None, rows], lse[None, :, rows], refs, what=f"sequence {b}")


@needs_fp8
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
def test_fp8_forward_on_sm89_code_via_ptx(fp8, monkeypatch):
    """An 8.9 GPU's code, run here through the PTX (built with FATTN_PTX_ARCHS naming 86 and 89):
    sm_89 holds the FP8 variants alone where sm_86 is built too (configs.json served_by), so FP8
    calls run sm_89's, and a 16-bit call, which sm_89 lacks, the next older arch's (sm_86's)."""
    skip_without_ptx(89, "attn_fwd", "fp8_transpose_v")
    skip_without_ptx(86, "attn_fwd")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "89")
    for case in [(2, 113, 1000, 4, 2, 64), (1, 257, 300, 4, 4, 128), (1, 100, 100, 2, 1, 256)]:
        for causal in (False, True):
            _check(case, fp8, causal)
    _check((1, 300, 300, 4, 2, 128), fp8, True, window_size=(64, 16), softcap=5.0)
    q, k, v = (torch.randn(2, 300, h, 128, dtype=torch.bfloat16, device="cuda") for h in (4, 2, 2))
    out = fattn.flash_attn_func(q, k, v, causal=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).double(), k.transpose(1, 2).double(), v.transpose(1, 2).double(), is_causal=True,
        enable_gqa=True).transpose(1, 2)
    assert (out.double() - want).abs().max().item() < 2e-2


def test_fp8_needs_fp8_tensor_cores(monkeypatch):
    """On an arch without FP8 tensor cores (run here through sm_80's PTX) the call fails naming it."""
    skip_without_ptx(80, "attn_fwd")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "80")
    q, k, v, *_ = fp8_qkv(1, 16, 16, 2, 2, 64, torch.float8_e4m3fn, "cuda")
    with pytest.raises(RuntimeError, match=r"float8 q, k and v need FP8 tensor cores \(sm_89 or sm_90\); this GPU "
                                           r"is sm_80"):
        fattn.flash_attn_func(q, k, v)


@needs_fp8
@pytest.mark.parametrize("fp8", FP8_DTYPES, ids=str)
def test_fp8_descales_are_factors_like_any_other(fp8):
    """No descale value is refused (reading them needs a host sync): a negative one flips its
    head's dequantized values and a zero one zeroes them, as the reference's dequantization does.
    d128 runs the Hopper kernel on sm_90, d64 attn_fwd."""
    for case in [(2, 200, 300, 4, 2, 128), (2, 150, 90, 4, 2, 64)]:
        q, k, v, qd, kd, vd = fp8_qkv(*case, fp8, "cuda", seed=7)
        kd[0, 1], vd[1, 0], qd[1, 1] = -kd[0, 1], -vd[1, 0], 0.0
        out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True, q_descale=qd, k_descale=kd,
                                         v_descale=vd)
        torch.cuda.synchronize()
        refs = fp8_references(q, k, v, qd, kd, vd, None, True)
        check_fp8_accuracy(out, lse, refs, what=f"{case} {fp8} negative and zero descales")
