"""Attention sinks on a GPU: forward, the gradients of q, k, v and of the sinks, packed
sequences and decode with several splits, against the float64 reference with the 2x rule
(skipped without a GPU)."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import (
    KVCache, check_accuracy, check_gradients, check_outputs, grads_of, make_qkv, references, requires_gpu,
    seqlens_tensor,
)

pytestmark = [requires_gpu, pytest.mark.gpu]

# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim)
SHAPES = [(2, 113, 113, 4, 2, 64), (1, 1000, 1000, 8, 1, 128), (1, 3824, 1000, 2, 2, 32), (2, 17, 113, 4, 4, 80)]
VARIANTS = [dict(causal=False), dict(causal=True), dict(causal=True, window_size=(64, -1)),
            dict(causal=False, window_size=(256, 256), softcap=30.0)]


def _sinks(heads):
    return torch.randn(heads, device="cuda") * 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_forward_matches_reference(shape, variant, dtype):
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = dict(variant)
    causal = options.pop("causal")
    sinks = _sinks(shape[3])
    out, lse = fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, sinks=sinks, **options)
    check_accuracy(out, lse, q, k, v, None, causal, what=f"{shape} {variant} {dtype}", sinks=sinks, **options)


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda c: "b{}-sq{}-sk{}-h{}-hk{}-d{}".format(*c))
def test_gradients_match_reference(shape, variant):
    dtype = torch.bfloat16
    q, k, v = make_qkv(*shape, dtype, "cuda")
    options = dict(variant)
    causal = options.pop("causal")
    sinks = _sinks(shape[3])
    w_out = torch.randn(q.shape, device="cuda")
    w_lse = torch.randn(shape[0], shape[3], shape[1], device="cuda")

    def with_sinks_grad(fn, sinks, *tensors):
        s = sinks.detach().clone().requires_grad_()
        out, lse = fn(*tensors, s)
        loss = (out.to(w_out.dtype) * w_out).sum() + (lse.to(w_lse.dtype) * w_lse).sum()
        return torch.autograd.grad(loss, s)[0].double()

    fattn_fn = lambda q, k, v, s: fattn.flash_attn_func(q, k, v, causal=causal, return_lse=True, sinks=s,  # noqa: E731
                                                       **options)
    got = grads_of(lambda q, k, v: fattn_fn(q, k, v, sinks), q, k, v, w_out, w_lse)
    ref = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, sinks=sinks, **options), q.double(),
                   k.double(), v.double(), w_out.double(), w_lse.double())
    low = grads_of(lambda q, k, v: attention_reference(q, k, v, None, causal, dtype=dtype, sinks=sinks, **options),
                   q, k, v, w_out, w_lse)
    check_gradients(got, ref, low, dtype, what=f"{shape} {variant}")
    d_got = with_sinks_grad(fattn_fn, sinks, q, k, v)
    d_ref = with_sinks_grad(lambda q, k, v, s: attention_reference(q, k, v, None, causal, sinks=s, **options), sinks,
                            q.double(), k.double(), v.double())
    d_low = with_sinks_grad(lambda q, k, v, s: attention_reference(q, k, v, None, causal, dtype=dtype, sinks=s,
                                                                   **options), sinks, q, k, v)
    err, base = (d_got - d_ref).abs().max().item(), (d_low - d_ref).abs().max().item()
    # dsinks = -sum_i p_i (dout_i . out_i - dlse_i) reads out as stored, in bf16: half an ulp of each
    # out element, summed over the rows (hundreds here), bounds what that rounding alone adds.
    out_ref, lse_ref = attention_reference(q.double(), k.double(), v.double(), None, causal, sinks=sinks, **options)
    share = torch.exp(sinks.double()[:, None] - lse_ref)  # [batch, heads, seqlen_q]
    reach = (w_out.double().abs() * out_ref.abs()).sum(-1).transpose(1, 2)  # [batch, heads, seqlen_q]
    rounding = (share * reach).sum((0, 2)).max().item() * torch.finfo(dtype).eps / 2
    assert err <= 2 * base + rounding + 1e-5, f"{shape} {variant} dsinks {err:.3e} {base:.3e} {rounding:.3e}"


def test_varlen_matches_reference_per_sequence():
    lengths = [1, 113, 1000, 517]
    heads, kv_heads, d = 4, 2, 64
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths), heads, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths), kv_heads, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    sinks = _sinks(heads)
    out, lse = fattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                            return_lse=True, sinks=sinks)
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        check_accuracy(out[None, start:end], lse[None, :, start:end], q[None, start:end], k[None, start:end],
                       v[None, start:end], None, True, what=f"sequence {b}", sinks=sinks)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("page_size", [None, 256])
def test_decode_counts_the_sink_once_whatever_the_splits(page_size, num_splits):
    lengths = [0, 1, 777, 3000]  # an empty sequence: out 0, lse = sink
    cache = KVCache(len(lengths), 3072, 2, 128, torch.bfloat16, "cuda", page_size)
    q = torch.randn(len(lengths), 2, 8, 128, device="cuda", dtype=torch.bfloat16)
    sinks = _sinks(8)
    seqlens = seqlens_tensor(lengths, "cuda")
    out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens,
                                             block_table=cache.block_table, causal=True, num_splits=num_splits,
                                             return_lse=True, sinks=sinks)
    ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, seqlens, cache.block_table, None, None,
                                           causal=True, sinks=sinks)
    check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=f"page {page_size} splits {num_splits}")
    torch.testing.assert_close(lse[0], sinks[:, None].expand(8, 2), rtol=0, atol=1e-6)
