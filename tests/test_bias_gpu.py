"""The additive bias and boolean masks on a GPU: out, lse and every gradient (dbias included)
against the float64 reference with the 2x rule, for biases of shape (b, h, q, k), (1, h, q, k),
(b, 1, q, k), boolean masks with rows that see nothing, and with window, softcap, ALiBi and sinks
(skipped without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import check_accuracy, check_loss_gradients, make_qkv, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]

# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim)
SHAPES = [(2, 113, 113, 4, 2, 64), (1, 1000, 1000, 8, 1, 128), (1, 1, 3824, 2, 2, 32), (2, 17, 113, 4, 4, 80)]
KINDS = ["bhqk", "1hqk", "b1qk", "mask"]
VARIANTS = [dict(causal=False), dict(causal=True), dict(causal=False, window_size=(64, 64), softcap=30.0),
            dict(causal=True, alibi=True, sinks=True)]
SHAPE_ID = "b{}-sq{}-sk{}-h{}-hk{}-d{}".format


def _bias(kind, shape, dtype):
    batch, seqlen_q, seqlen_k, heads = shape[:4]
    dims = {"bhqk": (batch, heads), "1hqk": (1, heads), "b1qk": (batch, 1), "mask": (batch, 1)}[kind]
    if kind == "mask":
        mask = torch.rand(*dims, seqlen_q, seqlen_k, device="cuda") > 0.3
        mask[..., seqlen_q // 2, :] = False  # a row that sees no key
        return mask
    return (torch.randn(*dims, seqlen_q, seqlen_k, device="cuda") * 2).to(dtype)


def _options(variant, heads):
    options = dict(variant)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(heads, device="cuda") * 0.1
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(heads, device="cuda")
    return options


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: SHAPE_ID(*c))
def test_forward_matches_reference(shape, kind, variant, dtype):
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = _options(variant, shape[3])
    causal = options.pop("causal")
    bias = _bias(kind, shape, dtype)
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, bias=bias, **options)
    check_accuracy(out, lse, q, k, v, None, causal, what=f"{shape} {kind} {variant} {dtype}", bias=bias, **options)
    if kind == "mask":
        row = shape[1] // 2
        if options.get("sinks") is None:
            assert torch.all(out[:, row] == 0) and torch.all(lse[:, :, row] == float("-inf"))


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda c: SHAPE_ID(*c))
def test_gradients_match_reference(shape, kind, variant):
    dtype = torch.bfloat16
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = _options(variant, shape[3])
    causal = options.pop("causal")
    bias = _bias(kind, shape, dtype)
    w_out = torch.randn(q.shape, device="cuda")
    w_lse = torch.randn(shape[0], shape[3], shape[1], device="cuda")
    with_bias = kind != "mask"  # a boolean mask has no gradient
    tensors = (q, k, v, bias) if with_bias else (q, k, v)

    def fattn_fn(q, k, v, b=bias):
        return fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, bias=b, **options)

    def reference(dtype):
        def fn(q, k, v, b=bias):
            return attention_reference(q, k, v, None, causal, dtype=dtype, bias=b, **options)
        return fn

    lse_mask = None
    if kind == "mask":  # rows with lse -inf: keep their weight out of the loss
        lse_mask = torch.isfinite(attention_reference(q, k, v, None, causal, bias=bias, **options)[1])
        w_lse = w_lse * lse_mask
    check_loss_gradients(fattn_fn, reference, tensors, w_out, w_lse, dtype, what=f"{shape} {kind} {variant}")
