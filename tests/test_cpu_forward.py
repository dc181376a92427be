"""The CPU implementation (the op's semantic reference) and torch.compile; opcheck and the
fake run on the shared samples (test_op_samples.py)."""

import math

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import make_qkv, recompiles_forbidden


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape",
    [(1, 1, 1, 1, 1, 8), (2, 17, 17, 4, 2, 16), (1, 5, 33, 8, 1, 24), (2, 33, 5, 6, 3, 40), (1, 113, 113, 2, 2, 256)],
    ids=lambda s: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*s),
)
def test_cpu_matches_float64_reference(shape, causal):
    q, k, v = make_qkv(*shape, torch.float64, "cpu")
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, None, causal)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=1e-6)  # lse is float32 by contract


def test_cpu_against_independent_softmax():
    # A reference that shares no code with attention_reference: explicit loops over rows.
    q, k, v = make_qkv(1, 6, 9, 2, 1, 8, torch.float64, "cpu")
    out = fattn.flash_attn_func(q, k, v, softmax_scale=0.3, causal=True)
    for h in range(2):
        for i in range(6):
            visible = i + (9 - 6) + 1
            s = torch.stack([(q[0, i, h] * k[0, j, 0]).sum() * 0.3 for j in range(visible)])
            p = torch.softmax(s, 0)
            want = sum(p[j] * v[0, j, 0] for j in range(visible))
            torch.testing.assert_close(out[0, i, h], want)


def test_causal_rows_with_no_key_are_zero_with_minus_inf_lse():
    q, k, v = make_qkv(1, 10, 4, 2, 2, 16, torch.float32, "cpu")
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    # Bottom-right alignment: row i sees keys j <= i - 6, so rows 0..5 see nothing.
    assert torch.all(out[:, :6] == 0)
    assert torch.all(lse[:, :, :6] == float("-inf"))
    assert torch.isfinite(lse[:, :, 6:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_low_precision_inputs(dtype):
    q, k, v = make_qkv(2, 40, 50, 4, 2, 32, dtype, "cpu")
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, _ = attention_reference(q, k, v, None, True)
    # Computed in float64, so only the final rounding to `dtype` differs from the reference.
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)


def test_cpu_strided_views():
    q, k, v = make_qkv(2, 31, 47, 4, 2, 64, torch.float64, "cpu", layout="strided")
    assert not q.is_contiguous() and not k.is_contiguous()
    out = fattn.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, attention_reference(q, k, v, None, True)[0])


def test_default_softmax_scale_is_inverse_sqrt_head_dim():
    q, k, v = make_qkv(1, 7, 7, 1, 1, 24, torch.float64, "cpu")
    torch.testing.assert_close(fattn.flash_attn_func(q, k, v),
                               fattn.flash_attn_func(q, k, v, softmax_scale=1 / math.sqrt(24)))


def test_zero_length_sequences():
    q, k, v = make_qkv(2, 0, 5, 2, 2, 16, torch.float32, "cpu")
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    assert out.shape == (2, 0, 2, 16) and lse.shape == (2, 2, 0)
    q, k, v = make_qkv(1, 3, 0, 2, 2, 16, torch.float32, "cpu")
    out, lse = fattn.flash_attn_func(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_compile_fullgraph_dynamic_no_recompiles():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, dynamic=True, backend="inductor")
    def step(q, k, v):
        out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True)
        return out * 2 + 1, lse.exp()

    for i, seqlen in enumerate((19, 37, 100)):  # none equal to another dim, or duck sizing would tie them
        q, k, v = make_qkv(1, seqlen, seqlen + 3, 4, 2, 16, torch.float32, "cpu")
        with recompiles_forbidden(i):
            got_out, got_p = step(q, k, v)
        want_out, want_lse = attention_reference(q, k, v, None, True)
        torch.testing.assert_close(got_out, want_out * 2 + 1, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_p, want_lse.exp(), atol=1e-4, rtol=1e-5)
