"""Attention sinks on CPU: one logit per head in every row's softmax denominator, against the
float64 reference (written independently, with the sink as an extra score column), in the
dense, packed, decode and ring paths; the gradient reaching the sinks; bad input."""

import pytest
import torch
from torch.autograd import gradcheck

import fattn
from fattn.reference import attention_reference, kvcache_reference
from helpers import FORWARD, check_fake_raises_like_op

VARIANTS = [dict(causal=False), dict(causal=True), dict(causal=True, window_size=(3, -1)),
            dict(causal=False, window_size=(2, 2), softcap=1.5), dict(causal=False, alibi=True)]


def _problem(seqlen_q=9, seqlen_k=13, heads=4, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, heads, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, seqlen_k, kv_heads, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, seqlen_k, kv_heads, 16, generator=g, dtype=torch.float64)
    sinks = torch.randn(heads, generator=g)
    return q, k, v, sinks


def _options(variant, heads):
    options = dict(variant)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(heads) * 0.3
    return options


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_forward_and_gradients_match_the_reference(variant):
    q, k, v, sinks = _problem()
    options = _options(variant, q.shape[2])
    causal = options.pop("causal")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = fattn.flash_attn_func(*leaves[:3], causal=causal, return_lse=True, sinks=leaves[3], **options)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    ref_out, ref_lse = attention_reference(*ref_leaves[:3], None, causal, sinks=ref_leaves[3], **options)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves)
    want = torch.autograd.grad((ref_out * w_out).sum() + (ref_lse * w_lse).sum(), ref_leaves)
    for g, w, name in zip(got, want, ("dq", "dk", "dv", "dsinks")):
        torch.testing.assert_close(g, w, rtol=1e-6 if name == "dsinks" else 1e-10,
                                   atol=1e-6 if name == "dsinks" else 1e-10, msg=name)


def test_sinks_gradient_matches_finite_differences():
    q, k, v, sinks = _problem(seed=3)
    w = torch.randn(q.shape, dtype=torch.float64)

    def loss(s):
        return (fattn.flash_attn_func(q, k, v, causal=True, sinks=s) * w).sum().item()

    leaf = sinks.clone().requires_grad_()
    (grad,) = torch.autograd.grad((fattn.flash_attn_func(q, k, v, causal=True, sinks=leaf) * w).sum(), leaf)
    eps = 1e-3
    for h in range(sinks.shape[0]):
        step = torch.zeros_like(sinks)
        step[h] = eps
        numeric = (loss(sinks + step) - loss(sinks - step)) / (2 * eps)
        assert abs(grad[h].item() - numeric) <= 1e-4 * max(1.0, abs(numeric)), (h, grad[h].item(), numeric)


def test_gradcheck_of_q_k_v_with_sinks():
    q, k, v, sinks = _problem(seqlen_q=5, seqlen_k=7)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    assert gradcheck(lambda q, k, v: FORWARD(q, k, v, None, True, False, -1, -1, 0.0, None, None, None, sinks),
                     leaves, eps=1e-6, atol=1e-6)


def test_a_row_without_keys_has_out_zero_and_lse_equal_to_its_sink():
    q, k, v, sinks = _problem(seqlen_q=12, seqlen_k=5)  # causal: the first 7 rows see no key
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True, sinks=sinks)
    assert torch.all(out[:, :7] == 0)
    torch.testing.assert_close(lse[:, :, :7], sinks.double()[None, :, None].expand(2, -1, 7), rtol=0, atol=0)
    assert torch.isfinite(lse).all()


def test_varlen_matches_the_dense_reference_per_sequence():
    q, k, v, sinks = _problem(seqlen_q=12, seqlen_k=12)
    packed = [t.reshape(-1, *t.shape[2:])[:19] for t in (q, k, v)]  # sequences of 12 and 7 rows
    cu = torch.tensor([0, 12, 19], dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in (*packed, sinks)]
    out, lse = fattn.flash_attn_varlen_func(*leaves[:3], cu, cu, 12, 12, causal=True, return_lse=True,
                                            sinks=leaves[3])
    w_out, w_lse = torch.randn_like(out), torch.randn_like(lse)
    got = torch.autograd.grad((out * w_out).sum() + (lse * w_lse).sum(), leaves[3])[0]
    ref_sinks = sinks.clone().requires_grad_()
    total = 0
    for start, end in ((0, 12), (12, 19)):
        ref_out, ref_lse = attention_reference(*(t[None, start:end] for t in packed), None, True, sinks=ref_sinks)
        torch.testing.assert_close(out[start:end], ref_out[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse[:, start:end], ref_lse[0], rtol=1e-12, atol=1e-12)
        total = total + (ref_out[0] * w_out[start:end]).sum() + (ref_lse[0] * w_lse[:, start:end]).sum()
    torch.testing.assert_close(got, torch.autograd.grad(total, ref_sinks)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_matches_the_reference(paged):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 4, 16, generator=g, dtype=torch.float64)
    k_cache = torch.randn(2, 32, 2, 16, generator=g, dtype=torch.float64)
    v_cache = torch.randn(2, 32, 2, 16, generator=g, dtype=torch.float64)
    block_table = None
    if paged:
        k_cache, v_cache = (t.reshape(4, 16, 2, 16) for t in (k_cache, v_cache))
        block_table = torch.tensor([[1, 0], [3, 2]], dtype=torch.int32)
    seqlens = torch.tensor([0, 20], dtype=torch.int32)  # an empty sequence: out 0, lse = sink
    sinks = torch.randn(4, generator=g)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=block_table,
                                             causal=True, return_lse=True, sinks=sinks)
    ref_out, ref_lse = kvcache_reference(q, k_cache, v_cache, seqlens, block_table, causal=True, sinks=sinks)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert torch.all(out[0] == 0) and torch.equal(lse[0], sinks.double()[:, None].expand(4, 3))


@pytest.mark.parametrize("sinks, message", [
    (torch.zeros(4, dtype=torch.float64), r"sinks has dtype float64; expected float32"),
    (torch.zeros(3), r"sinks has shape \[3\]; expected \[heads\] = \[4\]"),
    (torch.zeros(1, 4), r"sinks has shape \[1, 4\]; expected \[heads\] = \[4\]"),
])
def test_bad_sinks_are_clear_errors_in_op_and_fake(sinks, message):
    q, k, v, _ = _problem()
    q, k, v = (t.float() for t in (q, k, v))
    with pytest.raises(RuntimeError, match=message):
        fattn.flash_attn_func(q, k, v, sinks=sinks)
    check_fake_raises_like_op(FORWARD, (q, k, v, None, False, False, -1, -1, 0.0, None, None, None, sinks), message)
    k_cache = torch.zeros(2, 16, 2, 16)
    with pytest.raises(RuntimeError, match=message.replace("fattn.forward", "fattn.decode")):
        fattn.flash_attn_with_kvcache(q[:, :1], k_cache, k_cache.clone(), sinks=sinks)
