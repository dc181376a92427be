"""Backward kernels on a GPU against float64 autograd of the reference (skipped without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import check_gradients, grads_of, make_qkv, requires_gpu, skip_without_ptx

pytestmark = [requires_gpu, pytest.mark.gpu]

HEAD_DIMS = [32, 64, 80, 96, 128, 160, 192, 256]
SEQLENS = [(1, 1), (17, 17), (113, 113), (128, 128), (1000, 1000), (3824, 3824), (4096, 4096),
           (1, 1000), (113, 17), (17, 113), (1000, 3824), (3824, 1000)]
HEADS = [(1, 1, 1), (2, 4, 2), (3, 8, 2), (4, 16, 2), (2, 16, 16), (1, 8, 1), (2, 12, 3)]
MAX_SCORES = 2**25


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


def check_backward(case, dtype, causal, layout="contiguous", with_dlse=True, what=""):
    batch, sq, sk, heads, kv_heads, d = case
    q, k, v = make_qkv(batch, sq, sk, heads, kv_heads, d, dtype, "cuda", layout)
    w_out = torch.randn(batch, sq, heads, d, device="cuda")
    # lse of rows that see no key is -inf: weight them 0 so the loss stays finite.
    w_lse = torch.randn(batch, heads, sq, device="cuda") if with_dlse else torch.zeros(batch, heads, sq, device="cuda")
    if causal and sq > sk:
        w_lse[:, :, : sq - sk] = 0
    got = grads_of(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True), q, k, v, w_out,
                   w_lse)
    ref = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=torch.float64),
                   q.double(), k.double(), v.double(), w_out.double(), w_lse.double())
    low = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=dtype), q, k, v, w_out, w_lse)
    check_gradients(got, ref, low, dtype, what=what)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", _cases(), ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_backward_matches_reference(case, dtype, causal):
    check_backward(case, dtype, causal, what=f"{case} {dtype} causal={causal}")


@pytest.mark.parametrize("causal", [False, True])
def test_backward_strided_without_dlse(causal):
    check_backward((2, 333, 517, 8, 2, 96), torch.bfloat16, causal, layout="strided", with_dlse=False)


PTX_CASES = [(2, 113, 1000, 4, 2, 64), (1, 1000, 113, 8, 1, 96), (1, 257, 257, 2, 2, 256), (3, 17, 17, 4, 4, 32)]


@pytest.mark.parametrize("arch", ["80", "75"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", PTX_CASES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_backward_older_arch_code_paths_via_ptx(case, dtype, causal, arch, monkeypatch):
    skip_without_ptx(arch, "attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", arch)
    check_backward(case, dtype, causal, what=f"sm_{arch} PTX {case}")


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_bitwise_over_100_runs(causal):
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 1000, 1000, 8, 2, 128, torch.bfloat16, "cuda"))
    dout = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    out = fattn.flash_attn_func(q, k, v, causal=causal, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    for _ in range(99):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def test_backward_memory_is_linear_in_seqlen():
    # No seqlen^2 buffer: peak memory beyond inputs, outputs and grads stays O(seqlen).
    b, s, h, d = 1, 16384, 4, 64
    q, k, v = (t.requires_grad_() for t in make_qkv(b, s, s, h, h, d, torch.bfloat16, "cuda"))
    out = fattn.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    # Allowed: the gradients plus fp32 per-row statistics, a float32 copy of dq (where the dK/dV
    # pass accumulates dQ: deterministic=False, as here) and slack; one seqlen^2 bf16 score matrix
    # alone would be 2 GiB here.
    budget = grad_bytes + 16 * b * h * s * 4 + q.numel() * 4 + (8 << 20)
    assert extra <= budget, f"backward used {extra / 2**20:.1f} MiB beyond its inputs; budget {budget / 2**20:.1f}"


def test_compiled_training_step_cuda():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 300, 300, 8, 2, 64, torch.bfloat16, "cuda"))

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out.float().square().sum() + lse.sum()

    got = torch.autograd.grad(loss_fn(q, k, v), (q, k, v))
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    want = torch.autograd.grad(out.float().square().sum() + lse.sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
