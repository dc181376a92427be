"""Head dims that are not a multiple of 8 on a GPU (padded in the wrapper): forward and gradients
against the float64 reference with flash-attn's 2x rule (skipped without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import check_accuracy, check_gradients, grads_of, make_qkv, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [1, 20, 36, 100, 250])
def test_padded_head_dims_match_reference(head_dim, dtype, causal):
    q, k, v = make_qkv(2, 333, 517, 4, 2, head_dim, dtype, "cuda")
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert out.shape == q.shape
    check_accuracy(out, lse, q, k, v, None, causal, what=f"d{head_dim} {dtype} causal={causal}")
    w_out = torch.randn(q.shape, device="cuda")
    w_lse = torch.randn(lse.shape, device="cuda")
    got = grads_of(lambda q, k, v: fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True), q, k, v, w_out,
                   w_lse)
    ref = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal), q.double(), k.double(), v.double(),
                   w_out.double(), w_lse.double())
    low = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=dtype), q, k, v, w_out, w_lse)
    check_gradients(got, ref, low, dtype, what=f"d{head_dim} {dtype} causal={causal}")
