"""Forward kernels on a GPU against the float64 reference (skipped without a GPU).

Run on the device machine before resolving kernel work; see docs/performance.md, "GPU tests and benchmarks".
"""

import pytest
import torch

import fattn
from helpers import check_accuracy, make_qkv, poison_allocator, requires_gpu, skip_without_ptx

pytestmark = [requires_gpu, pytest.mark.gpu]

HEAD_DIMS = [32, 64, 80, 96, 128, 160, 192, 256]
SEQLENS = [(1, 1), (17, 17), (113, 113), (128, 128), (1000, 1000), (3824, 3824), (4096, 4096),
           (1, 1000), (113, 17), (17, 113), (1000, 3824), (3824, 1000), (128, 4096), (4096, 1)]
# (batch, heads, kv_heads): GQA ratios 1, 2, 4, 8.
HEADS = [(1, 1, 1), (2, 4, 2), (3, 8, 2), (4, 16, 2), (2, 16, 16), (1, 8, 1), (2, 12, 3)]
MAX_SCORES = 2**26  # batch * heads * seqlen_q * seqlen_k per case, so float64 references fit


def _cases():
    cases = []
    for d_index, d in enumerate(HEAD_DIMS):
        for s_index, (sq, sk) in enumerate(SEQLENS):
            batch, heads, kv_heads = HEADS[(d_index + s_index) % len(HEADS)]
            while batch * heads * sq * sk > MAX_SCORES and batch > 1:
                batch -= 1
            while batch * heads * sq * sk > MAX_SCORES and heads > kv_heads:
                heads //= 2
            cases.append((batch, sq, sk, heads, kv_heads, d))
    return cases


def _run(case, dtype, causal, layout="contiguous", softmax_scale=None):
    batch, sq, sk, heads, kv_heads, d = case
    q, k, v = make_qkv(batch, sq, sk, heads, kv_heads, d, dtype, "cuda", layout)
    poison_allocator(((batch, sq, heads, d), dtype), ((batch, heads, sq), torch.float32), device="cuda")
    out, lse = fattn.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, return_lse=True)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == (batch, heads, sq) and lse.dtype == torch.float32
    return check_accuracy(out, lse, q, k, v, softmax_scale, causal, what=f"{case} {dtype} causal={causal}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_forward_matches_reference(case, dtype, causal):
    _run(case, dtype, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 96, 128])
def test_forward_strided_views(d, causal):
    _run((2, 333, 517, 8, 2, d), torch.bfloat16, causal, layout="strided")


def test_forward_softmax_scale():
    _run((2, 200, 300, 4, 4, 64), torch.float16, True, softmax_scale=0.37)


def test_forward_misaligned_view_is_copied():
    # A view starting 8 bytes into its buffer breaks the kernels' 16-byte alignment
    # promise; the op must notice and copy rather than read out of alignment.
    base = torch.randn(1 * 100 * 2 * 64 + 4, dtype=torch.float16, device="cuda")
    q = base[4:].view(1, 100, 2, 64)
    k = torch.randn(1, 90, 2, 64, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    check_accuracy(out, lse, q, k, v, None, False, what="misaligned q")


PTX_CASES = [(2, 113, 1000, 4, 2, 64), (1, 1000, 113, 8, 1, 96), (1, 257, 257, 2, 2, 256), (3, 17, 17, 4, 4, 32)]


@pytest.mark.parametrize("arch", ["80", "75"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", PTX_CASES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_forward_older_arch_code_paths_via_ptx(case, dtype, causal, arch, monkeypatch):
    skip_without_ptx(arch, "attn_fwd")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", arch)
    _run(case, dtype, causal)


def test_torch_compile_fullgraph_cuda():
    q, k, v = make_qkv(2, 300, 300, 8, 2, 64, torch.bfloat16, "cuda")

    @torch.compile(fullgraph=True)
    def f(q, k, v):
        return fattn.flash_attn_func(q * 0.5, k, v, causal=True).float().sum(-1)

    got = f(q, k, v)
    want = fattn.flash_attn_func(q * 0.5, k, v, causal=True).float().sum(-1)
    torch.testing.assert_close(got, want)


def test_runs_on_the_current_stream():
    q, k, v = make_qkv(2, 512, 512, 4, 4, 128, torch.float16, "cuda")
    new_q = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy, then change q on it
        q.copy_(new_q)
        out = fattn.flash_attn_func(q, k, v)  # must run after the copy, on `side`
    side.synchronize()
    want = fattn.flash_attn_func(new_q, k, v)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay():
    static = make_qkv(2, 300, 700, 8, 4, 96, torch.bfloat16, "cuda")
    fattn.flash_attn_func(*static, causal=True)  # load the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fattn.flash_attn_func(*static, causal=True, return_lse=True)
    for _ in range(2):
        fresh = make_qkv(2, 300, 700, 8, 4, 96, torch.bfloat16, "cuda")
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        check_accuracy(out, lse, *fresh, None, True, what="graph replay")


def test_no_cubin_for_arch_error_names_built_archs(monkeypatch):
    """The error names the archs whose PTX the build holds (none where FATTN_PTX_ARCHS kept none)."""
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", "70")
    q, k, v = make_qkv(1, 8, 8, 1, 1, 64, torch.float16, "cuda")
    with_ptx = sorted({r["arch"] for r in fattn.build_info()["kernels"] if r["kernel"] == "attn_fwd" and r["ptx_size"]})
    held = "sm_" if with_ptx else "none"
    with pytest.raises(RuntimeError, match=rf"FATTN_FORCE_PTX_ARCH=70 but this build has attn_fwd PTX for {held}"):
        fattn.flash_attn_func(q, k, v)


def test_offsets_past_2_pow_31_elements():
    # q's second batch starts 3 * 2**30 elements into its buffer: 32-bit offsets would wrap.
    seq_stride_rows = 3 * 2**20
    big = torch.empty(2, seq_stride_rows, 8, 128, dtype=torch.bfloat16, device="cuda")
    q = big[:, :200]
    q.normal_()
    assert q.stride(0) * (q.shape[0] - 1) > 2**31
    k = torch.randn(2, 300, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    check_accuracy(out, lse, q.contiguous(), k, v, None, True, what="int64 offsets")
    del big


def test_bad_input_cuda_rules():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.float16, "cuda")
    with pytest.raises(RuntimeError, match=r"k is on cpu but q is on cuda:0"):
        fattn.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(RuntimeError, match=r"q has dtype float32; expected float16 or bfloat16 "
                                           r"\(or float8_e4m3fn/float8_e5m2\)$"):
        fattn.flash_attn_func(q.float(), k.float(), v.float())
