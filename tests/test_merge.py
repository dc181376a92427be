"""fattn.merge_attention_states: attention over key chunks, merged, equals attention over all keys.
opcheck and the fake run on the shared samples (test_op_samples.py)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn
from fattn.reference import attention_reference
from helpers import MERGE, check_fake_raises_like_op, expected_lse_dtype, make_qkv, requires_gpu


def _chunked(q, k, v, bounds, causal=False, dtype=None):
    """Partial (out, lse) of q over each key chunk [a, b) of `bounds`."""
    outs, lses = [], []
    for a, b in bounds:
        out, lse = attention_reference(q, k[:, a:b], v[:, a:b], None, False, dtype=torch.float64)
        outs.append(out.to(dtype or q.dtype))
        lses.append(lse.to(expected_lse_dtype(dtype or q.dtype)))
    return outs, lses


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_merge_equals_full_attention_cpu(splits):
    q, k, v = make_qkv(2, 7, 50, 4, 2, 16, torch.float64, "cpu")
    edges = torch.linspace(0, 50, splits + 1).long().tolist()
    outs, lses = _chunked(q, k, v, list(zip(edges[:-1], edges[1:])))
    out, lse = fattn.merge_attention_states(outs, lses)
    want_out, want_lse = attention_reference(q, k, v)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)


def test_minus_inf_partials_are_ignored_even_with_garbage_outputs():
    q, k, v = make_qkv(1, 5, 20, 2, 2, 8, torch.float64, "cpu")
    outs, lses = _chunked(q, k, v, [(0, 12), (12, 20)])
    outs.append(torch.full_like(outs[0], float("nan")))  # a part that saw no key
    lses.append(torch.full_like(lses[0], float("-inf")))
    out, lse = fattn.merge_attention_states(outs, lses)
    torch.testing.assert_close(out, attention_reference(q, k, v)[0])
    # A row that no part saw: out 0, lse -inf.
    out, lse = fattn.merge_attention_states(outs[2:], lses[2:])
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_merge_compiles_fullgraph():
    f = torch.compile(lambda o, l: fattn.merge_attention_states(o, l), fullgraph=True, dynamic=True)
    for s in (5, 9, 13):
        outs, lses = torch.randn(2, 1, s, 2, 8), torch.randn(2, 1, 2, s)
        got = f(outs, lses)
        want = torch.ops.fattn.merge_attention_states(outs, lses)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("bad,match", [
    (lambda o, l: (o[0], l), r"outs must be a 5-D tensor \[splits, batch, seqlen_q, heads, head_dim\]"),
    (lambda o, l: (o, l[:, :, :, :3]), r"lses has shape \[2, 1, 2, 3\] but must be \[splits, batch, heads, seqlen_q\]"),
    (lambda o, l: (o, l.double()), r"lses has dtype float64; expected float32"),
    (lambda o, l: (o.int(), l), r"outs has dtype int32"),
    (lambda o, l: (o[..., :12], l), r"head_dim 12 is not supported"),
])
def test_merge_bad_input(bad, match):
    outs, lses = torch.randn(2, 1, 4, 2, 16), torch.randn(2, 1, 2, 4)
    check_fake_raises_like_op(MERGE, bad(outs, lses), match)


def test_merge_fake_applies_the_cuda_rules():
    # Fake CUDA tensors need no GPU: float64 partials are for the CPU definition only.
    with FakeTensorMode():
        outs, lses = torch.randn(2, 1, 4, 2, 16, device="cuda"), torch.randn(2, 1, 2, 4, device="cuda")
        out, lse = MERGE(outs, lses)
        assert out.device == outs.device and lse.dtype == torch.float32
        with pytest.raises(RuntimeError, match=r"outs has dtype float64; expected float32, float16 or bfloat16"):
            MERGE(outs.double(), lses.double())
        with pytest.raises(RuntimeError, match=r"lses is on cpu but outs is on cuda:0"):
            MERGE(outs, torch.randn(2, 1, 2, 4))


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("partial_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 256])
def test_merge_gpu_matches_cpu_definition(d, partial_dtype):
    torch.manual_seed(d)
    splits, b, s, h = 4, 2, 333, 6
    outs = torch.randn(splits, b, s, h, d, device="cuda").to(partial_dtype)
    lses = torch.randn(splits, b, h, s, device="cuda") * 3
    lses[1, :, :, :100] = float("-inf")
    lses[:, 1, 2, 7] = float("-inf")  # a row no part saw
    outs[1, :, :100] = float("nan")
    out, lse = fattn.merge_attention_states(outs, lses)
    want_out, want_lse = torch.ops.fattn.merge_attention_states(outs.cpu().double(), lses.cpu().double())
    assert out.dtype == partial_dtype and lse.dtype == torch.float32
    tol = 1e-5 if partial_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.cpu().double(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.cpu().double(), want_lse, atol=1e-5, rtol=1e-5)
    assert out[1, 7, 2].eq(0).all() and lse[1, 2, 7] == float("-inf")


@requires_gpu
@pytest.mark.gpu
def test_flash_attn_over_chunks_merges_to_full_attention_gpu():
    q, k, v = make_qkv(2, 200, 1000, 8, 2, 128, torch.bfloat16, "cuda")
    parts = [fattn.flash_attn_func(q, k[:, a:b], v[:, a:b], return_lse=True) for a, b in ((0, 300), (300, 1000))]
    out, lse = fattn.merge_attention_states([p[0].float() for p in parts], [p[1] for p in parts])
    full_out, full_lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    torch.testing.assert_close(out, full_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, full_lse, atol=1e-4, rtol=1e-4)
