"""Sliding windows, softcap and ALiBi on a GPU: forward and gradients against the float64
reference with flash-attn's 2x rule (skipped without a GPU).

Every variant of the grid below (windows x softcap x ALiBi) runs on every shape, in both
dtypes, causal and not: odd sizes, seqlen_q above and below seqlen_k, GQA, head dims that
are not powers of two. Gradients run on a subset (a float64 autograd reference per case).
"""

import itertools

import pytest
import torch

import fattn
from helpers import check_accuracy, check_variant_gradients, make_qkv, poison_allocator, requires_gpu

pytestmark = [requires_gpu, pytest.mark.gpu]

WINDOWS = [(-1, -1), (0, 0), (64, 0), (256, 256), (1, 1)]
SOFTCAPS = [0.0, 30.0]
VARIANTS = list(itertools.product(WINDOWS, SOFTCAPS, [False, True]))  # window, softcap, alibi
# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim)
SHAPES = [(2, 113, 113, 4, 2, 64), (1, 1000, 1000, 8, 1, 128), (2, 17, 113, 4, 4, 80), (1, 1000, 3824, 4, 2, 96),
          (1, 3824, 1000, 2, 2, 32), (2, 128, 128, 4, 1, 256), (1, 1, 1000, 4, 2, 160), (3, 257, 513, 6, 3, 192)]
GRAD_SHAPES = [(2, 113, 113, 4, 2, 64), (1, 1000, 1000, 4, 1, 128), (1, 333, 517, 4, 2, 96),
               (1, 517, 333, 2, 2, 256)]


def _variant_id(variant):
    (left, right), softcap, alibi = variant
    return f"w{left}_{right}-cap{softcap:g}-{'alibi' if alibi else 'noalibi'}"


def _inputs(shape, dtype, variant, layout="contiguous"):
    batch, sq, sk, heads, kv_heads, d = shape
    q, k, v = make_qkv(batch, sq, sk, heads, kv_heads, d, dtype, "cuda", layout)
    window, softcap, alibi = variant
    # Slopes as ALiBi uses them (2^(-8 i / heads)), batch-shaped for odd batches to cover both forms.
    slopes = None
    if alibi:
        slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device="cuda") / heads)
        if batch % 2:
            slopes = slopes.expand(batch, heads).contiguous()
    return q, k, v, dict(window_size=window, softcap=softcap, alibi_slopes=slopes)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_forward_variants_match_reference(shape, variant, dtype, causal):
    q, k, v, options = _inputs(shape, dtype, variant)
    batch, sq, _, heads, _, d = shape
    poison_allocator(((batch, sq, heads, d), dtype), ((batch, heads, sq), torch.float32), device="cuda")
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, **options)
    torch.cuda.synchronize()
    check_accuracy(out, lse, q, k, v, None, causal, what=f"{shape} {_variant_id(variant)} {dtype} causal={causal}",
                   **options)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_gradient_variants_match_reference(shape, variant, causal):
    dtype = torch.bfloat16 if sum(shape) % 2 else torch.float16
    layout = "strided" if shape[5] == 96 else "contiguous"
    q, k, v, options = _inputs(shape, dtype, variant, layout)
    check_variant_gradients(q, k, v, f"{shape} {_variant_id(variant)} causal={causal}", causal=causal, **options)


@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_rows_outside_every_window_give_zero_minus_inf_and_no_nan_gradient(softcap):
    # seqlen_q > seqlen_k with a (0, 0) window: row i sees key i - 600 only, so rows 0..599 see none.
    q, k, v = make_qkv(2, 1000, 400, 4, 2, 64, torch.bfloat16, "cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = fattn.flash_attn_func(q, k, v, window_size=(0, 0), softcap=softcap, return_lse=True)
    assert torch.equal(out[:, :600], torch.zeros_like(out[:, :600]))
    assert torch.isneginf(lse[:, :, :600]).all() and torch.isfinite(lse[:, :, 600:]).all()
    (out.float().square().sum() + lse[:, :, 600:].sum()).backward()
    for t in (q, k, v):
        assert not torch.isnan(t.grad).any()
    assert torch.equal(q.grad[:, :600], torch.zeros_like(q.grad[:, :600]))


def test_plain_attention_is_unchanged_by_default_variant_arguments():
    q, k, v = make_qkv(2, 700, 900, 8, 2, 128, torch.float16, "cuda")
    plain = fattn.flash_attn_func(q, k, v, causal=True)
    explicit = fattn.flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None)
    wide = fattn.flash_attn_func(q, k, v, causal=True, window_size=(5000, 5000))
    assert torch.equal(plain, explicit) and torch.equal(plain, wide)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 8, 2, 128), (3, 517, 517, 4, 4, 64), (1, 333, 700, 4, 1, 96)],
                         ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_segment_ids_forward_and_gradients(shape, causal):
    batch, sq, sk, heads, kv_heads, d = shape
    q, k, v = make_qkv(batch, sq, sk, heads, kv_heads, d, torch.bfloat16, "cuda")
    cuts = torch.randint(0, sk, (batch, 3), device="cuda")
    ids = (torch.arange(sk, device="cuda")[None, :, None] >= cuts[:, None, :]).sum(-1).int()
    options = dict(q_segment_ids=ids[:, sk - sq:].contiguous(), kv_segment_ids=ids, window_size=(256, -1))
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, **options)
    check_accuracy(out, lse, q, k, v, None, causal, what=f"{shape} segments causal={causal}", **options)
    check_variant_gradients(q, k, v, f"{shape} segments causal={causal}", causal=causal, **options)
