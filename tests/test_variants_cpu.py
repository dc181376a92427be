"""Sliding windows, softcap and ALiBi through flash-attn's public signatures, on the CPU: the
arguments arrive in flash-attn's positions and mean what they mean there, gradients flow, and
bad values raise naming the argument (the op's fake raising the same error).

The op-level checks (every sample against the Python reference, gradcheck, opcheck, fakes)
are in test_op_samples.py; the kernels' logic in test_attention_kernels_interpreted.py."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference
from helpers import FORWARD, check_fake_raises_like_op, grads_of, make_qkv


def _qkv(sq=13, sk=17, h=4, hk=2, d=16, dtype=torch.float64):
    return make_qkv(2, sq, sk, h, hk, d, dtype, "cpu")


def test_positional_order_is_flash_attn_s():
    q, k, v = _qkv()
    slopes = torch.rand(4) * 0.5
    # flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out, lse = fattn.flash_attn_func(q, k, v, 0.0, 0.3, False, (5, 2), 1.5, slopes, False, True)[:2]
    want_out, want_lse = attention_reference(q, k, v, 0.3, False, window_size=(5, 2), softcap=1.5,
                                             alibi_slopes=slopes)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"])
def test_packed_forms_pass_the_variant_on(fn):
    qkv = torch.randn(2, 11, 3, 4, 16, dtype=torch.float64)
    q, k, v = qkv.unbind(2)
    slopes = torch.rand(2, 4) * 0.5
    args = (qkv,) if fn == "flash_attn_qkvpacked_func" else (q, qkv[:, :, 1:])
    got = getattr(fattn, fn)(*args, 0.0, None, True, (3, -1), 2.0, slopes)
    want = fattn.flash_attn_func(q, k, v, 0.0, None, True, (3, -1), 2.0, slopes)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_causal_forces_the_right_window_to_zero():
    q, k, v = _qkv()
    got = fattn.flash_attn_func(q, k, v, causal=True, window_size=(4, 9))
    want = fattn.flash_attn_func(q, k, v, window_size=(4, 0))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_window_wider_than_the_sequences_hides_nothing():
    q, k, v = _qkv()
    torch.testing.assert_close(fattn.flash_attn_func(q, k, v, window_size=(1 << 40, 30)),
                               fattn.flash_attn_func(q, k, v), rtol=0, atol=0)


def test_window_changes_the_result_where_it_should():
    q, k, v = _qkv(sq=9, sk=9)
    out = fattn.flash_attn_func(q, k, v, window_size=(0, 0))
    # A (0, 0) window on a square problem: each query sees only its own key, so out is v.
    torch.testing.assert_close(out, v.repeat_interleave(2, dim=2), rtol=1e-12, atol=1e-12)


def test_rows_outside_every_window_give_zero_and_minus_inf():
    q, k, v = _qkv(sq=12, sk=5)
    out, lse = fattn.flash_attn_func(q, k, v, window_size=(0, 1), return_lse=True)
    # Row i sees keys i - 7 .. i - 6: rows 0..5 see none.
    assert torch.equal(out[:, :6], torch.zeros_like(out[:, :6]))
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()


def test_gradients_with_every_variant_match_the_reference():
    q, k, v = _qkv()
    slopes = torch.rand(2, 4) * 0.5
    w_out, w_lse = torch.randn(2, 13, 4, 16, dtype=torch.float64), torch.randn(2, 4, 13, dtype=torch.float64)
    options = dict(causal=True, window_size=(6, -1), softcap=3.0, alibi_slopes=slopes)
    got = grads_of(lambda q, k, v: fattn.flash_attn_func(q, k, v, return_lse=True, **options), q, k, v, w_out, w_lse)
    want = grads_of(lambda q, k, v: attention_reference(q, k, v, **options), q, k, v, w_out, w_lse)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_softcap_bounds_the_scores():
    q, k, v = _qkv(sq=1, sk=2, h=2, hk=2)
    q[..., :] = 100.0  # scores far beyond the cap
    _, lse = fattn.flash_attn_func(q, k, v, softcap=2.0, return_lse=True)
    assert (lse <= 2.0 + torch.log(torch.tensor(2.0)) + 1e-9).all()


@pytest.mark.parametrize("options, match", [
    (dict(window_left=-2), r"fattn.forward: window_left is -2; expected -1 \(unbounded\) or >= 0"),
    (dict(window_right=-5), r"fattn.forward: window_right is -5; expected -1 \(unbounded\) or >= 0"),
    (dict(softcap=-1.0), r"fattn.forward: softcap must be a finite number >= 0"),
    (dict(softcap=float("inf")), r"fattn.forward: softcap must be a finite number >= 0"),
    (dict(alibi_slopes=torch.ones(4, dtype=torch.float16)), r"alibi_slopes has dtype float16; expected float32"),
    (dict(alibi_slopes=torch.ones(3)), r"alibi_slopes has shape \[3\]; expected \[heads\] = \[4\]"),
    (dict(alibi_slopes=torch.ones(1, 4)), r"alibi_slopes has shape \[1, 4\]; expected \[heads\] = \[4\]"),
])
def test_bad_variant_arguments_raise_like_the_fake(options, match):
    q, k, v = _qkv(dtype=torch.float16)
    full = dict(window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None) | options
    args = (q, k, v, None, False, False, full["window_left"], full["window_right"], full["softcap"],
            full["alibi_slopes"])
    check_fake_raises_like_op(FORWARD, args, match)


def test_bad_window_size_in_the_public_call():
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match=r"window_size is \(-3, 0\); expected each side -1 \(unbounded\)"):
        fattn.flash_attn_func(q, k, v, window_size=(-3, 0))
    with pytest.raises(TypeError, match="window_size must be a \\(left, right\\) pair of ints"):
        fattn.flash_attn_func(q, k, v, window_size=4)


def test_segments_equal_attention_per_document():
    # Two rows of packed documents: causal attention with segment ids equals causal attention
    # over each document alone.
    q, k, v = _qkv(sq=12, sk=12)
    ids = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [7] * 12], dtype=torch.int32)
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, return_lse=True, q_segment_ids=ids, kv_segment_ids=ids)
    for b, bounds in ((0, [(0, 5), (5, 9), (9, 12)]), (1, [(0, 12)])):
        for s, e in bounds:
            want_out, want_lse = attention_reference(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], None, True)
            torch.testing.assert_close(out[b:b + 1, s:e], want_out, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(lse[b:b + 1, :, s:e], want_lse, rtol=1e-12, atol=1e-12)


def test_segment_gradients_match_the_reference():
    q, k, v = _qkv(sq=10, sk=10)
    ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [0] * 4 + [3] * 6], dtype=torch.int32)
    w_out, w_lse = torch.randn(2, 10, 4, 16, dtype=torch.float64), torch.randn(2, 4, 10, dtype=torch.float64)
    options = dict(causal=True, window_size=(3, -1), softcap=2.0, alibi_slopes=torch.rand(4) * 0.3)
    got = grads_of(lambda q, k, v: fattn.flash_attn_func(q, k, v, return_lse=True, q_segment_ids=ids,
                                                         kv_segment_ids=ids, **options), q, k, v, w_out, w_lse)
    want = grads_of(lambda q, k, v: attention_reference(q, k, v, q_segment_ids=ids, kv_segment_ids=ids, **options),
                    q, k, v, w_out, w_lse)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("q_ids, kv_ids, match", [
    (torch.zeros(2, 13, dtype=torch.int32), None, "q_segment_ids is given without kv_segment_ids"),
    (torch.zeros(2, 13), torch.zeros(2, 17), "q_segment_ids has dtype float32; expected int32"),
    (torch.zeros(2, 12, dtype=torch.int32), torch.zeros(2, 17, dtype=torch.int32),
     r"q_segment_ids has shape \[2, 12\]; expected \[batch, seqlen_q\] = \[2, 13\]"),
    (torch.zeros(2, 13, dtype=torch.int32), torch.zeros(17, 2, dtype=torch.int32).t(),
     "kv_segment_ids must have contiguous rows"),
])
def test_bad_segment_ids_raise_like_the_fake(q_ids, kv_ids, match):
    q, k, v = _qkv(dtype=torch.float16)
    check_fake_raises_like_op(FORWARD, (q, k, v, None, False, False, -1, -1, 0.0, None, q_ids, kv_ids), match)
