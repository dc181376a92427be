"""Packed variable-length attention on the CPU: fattn::varlen_forward/varlen_backward against
the dense reference run one sequence at a time (an independent definition), flash-attn's
varlen signatures, gradients, bad offsets, and torch.compile without recompiles."""

import pytest
import torch
from torch.autograd import gradcheck

import fattn
from fattn.reference import attention_reference
from helpers import (
    VARLEN_BACKWARD, VARLEN_CASES, VARLEN_FORWARD, check_fake_raises_like_op, recompiles_forbidden, reference_variant,
    varlen_forward_samples, varlen_inputs,
)


def per_sequence_reference(q, k, v, cu_q, cu_k, seqused_k, softmax_scale, causal, variant):
    """(out, lse) of each sequence through the dense reference, packed like the op's outputs."""
    out = torch.zeros_like(q, dtype=torch.float64)
    lse = torch.zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    for b in range(cu_q.numel() - 1):
        qs, qe, ks = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b])
        ke = ks + int(seqused_k[b]) if seqused_k is not None else int(cu_k[b + 1])
        alibi = variant["alibi_slopes"]
        options = dict(variant, alibi_slopes=None if alibi is None else alibi.expand(cu_q.numel() - 1, -1)[b:b + 1])
        o, l = attention_reference(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], softmax_scale, causal, **options)
        out[qs:qe], lse[:, qs:qe] = o[0], l[0]
    return out, lse


def test_every_sample_matches_the_dense_reference_per_sequence():
    for sample in varlen_forward_samples("cpu", torch.float64):
        q, k, v, cu_q, cu_k, _, _, used, scale, causal, _, *_ = sample.args
        out, lse = VARLEN_FORWARD(*sample.args)
        want_out, want_lse = per_sequence_reference(q, k, v, cu_q, cu_k, used, scale, causal,
                                                    reference_variant((None,) * 6 + tuple(sample.args[11:15]) + (None, None)
                                                                      + tuple(sample.args[15:16])))
        torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-12, msg=sample.name)
        torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12, msg=sample.name)


@pytest.mark.parametrize("case", VARLEN_CASES[:4], ids=[c[0] for c in VARLEN_CASES[:4]])
def test_gradcheck(case):
    sample = next(s for s in varlen_forward_samples("cpu", torch.float64, requires_grad=True) if s.name == case[0])
    q, k, v, *rest = sample.args

    def f(q, k, v):
        out, lse = VARLEN_FORWARD(q, k, v, *rest)
        return out, torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)

    assert gradcheck(f, (q, k, v), eps=1e-6, atol=1e-6)


def test_public_functions_take_flash_attn_s_order():
    q, k, v, cu_q, cu_k, max_q, max_k, _ = varlen_inputs(VARLEN_CASES[0], "cpu", torch.float64)
    slopes = torch.rand(4) * 0.3
    got = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, 0.4, True, (3, -1), 2.0, slopes,
                                       False, True)
    want = VARLEN_FORWARD(q, k, v, cu_q, cu_k, max_q, max_k, None, 0.4, True, False, 3, 0, 2.0, slopes)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    assert got[2] is None
    qkv = torch.stack([q, q, q], dim=1)
    torch.testing.assert_close(fattn.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, 0.0, None, True),
                               fattn.flash_attn_varlen_func(q, q, q, cu_q, cu_q, max_q, max_q, causal=True))
    kv = torch.stack([k, v], dim=1)
    torch.testing.assert_close(fattn.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k, causal=True),
                               fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True))


def test_gradients_match_the_reference_with_seqused_k():
    q, k, v, cu_q, cu_k, max_q, max_k, used = varlen_inputs(VARLEN_CASES[2], "cpu", torch.float64, requires_grad=True)
    out = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, seqused_k=used)
    w = torch.randn_like(out)
    got = torch.autograd.grad((out * w).sum(), (q, k, v))
    want_out, _ = per_sequence_reference(q, k, v, cu_q, cu_k, used, None, True,
                                         dict(window_size=(-1, -1), softcap=0.0, alibi_slopes=None))
    want = torch.autograd.grad((want_out * w).sum(), (q, k, v))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)
    # The spare rows past the last sequence, and keys past seqused_k, get no gradient.
    assert torch.equal(got[0][-2:], torch.zeros_like(got[0][-2:]))
    assert torch.equal(got[1][int(cu_k[0]) + int(used[0]):int(cu_k[1])], torch.zeros(2, 1, 8, dtype=torch.float64))


def _args(**changes):
    q, k, v, cu_q, cu_k, max_q, max_k, used = varlen_inputs(VARLEN_CASES[0], "cpu", torch.float16)
    args = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k, used=used) | changes
    return (args["q"], args["k"], args["v"], args["cu_q"], args["cu_k"], args["max_q"], args["max_k"], args["used"],
            None, False, False, -1, -1, 0.0, None)


VALUE_CHECKS = ("decreases", "past the", "more than", "expected 0 to")  # need the offsets' values


@pytest.mark.parametrize("changes, match", [
    (dict(cu_q=torch.tensor([0, 4, 11, 13])), r"cu_seqlens_q has dtype int64; expected int32"),
    (dict(cu_k=torch.tensor([0, 4, 11], dtype=torch.int32)), r"cu_seqlens_k has shape \[3\]; expected \[4\]"),
    (dict(cu_q=torch.zeros(2, 2, dtype=torch.int32)), r"cu_seqlens_q has shape \[2, 2\]; expected \[batch \+ 1\]"),
    (dict(cu_q=torch.tensor([0, 4, 3, 13], dtype=torch.int32)), r"cu_seqlens_q decreases at 1: 4 then 3"),
    (dict(cu_q=torch.tensor([0, 4, 11, 14], dtype=torch.int32)), r"cu_seqlens_q\[3\] is 14, past the 13 packed rows"),
    (dict(max_q=6), r"sequence 1 has 7 rows in cu_seqlens_q, more than max_seqlen_q = 6"),
    (dict(max_k=-1), r"max_seqlen_k is -1; expected >= 0"),
    (dict(used=torch.tensor([4, 8, 2], dtype=torch.int32)), r"seqused_k\[1\] is 8; expected 0 to 7"),
    (dict(used=torch.tensor([4, 7], dtype=torch.int32)), r"seqused_k has shape \[2\]; expected \[3\]"),
    (dict(q=torch.randn(1, 13, 4, 8, dtype=torch.float16)), r"q must be a 3-D tensor \[total_tokens, heads, head_dim\]"),
])
def test_bad_input_raises_like_the_fake(changes, match):
    args = _args(**changes)
    if any(what in match for what in VALUE_CHECKS):
        # Value checks read the offsets: the op (CPU) raises, the fake cannot (and CUDA does not).
        with pytest.raises(RuntimeError, match=match):
            VARLEN_FORWARD(*args)
        return
    check_fake_raises_like_op(VARLEN_FORWARD, args, match)


def test_backward_op_checks_packed_lse():
    sample = next(varlen_forward_samples("cpu", torch.float64))
    q, k, v, cu_q, cu_k, max_q, max_k, used, *options = sample.args
    out, lse = VARLEN_FORWARD(*sample.args)
    args = (out, q, k, v, out, lse[:, :-1], None, cu_q, cu_k, max_q, max_k, used, *options)
    check_fake_raises_like_op(VARLEN_BACKWARD, args, r"lse has shape \[4, 12\] but must be \[heads, total_q\]")


def test_compiled_training_step_does_not_recompile_for_new_lengths():
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, dynamic=True, backend="aot_eager")
    def step(q, k, v, cu, max_seqlen):
        out, lse = fattn.flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True,
                                                return_lse=True)
        return out.square().sum() + lse.sum()

    for i, lengths in enumerate(([5, 9, 3], [7, 2, 11], [4, 4, 13])):  # new totals, new max_seqlen
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        q, k, v = (torch.randn(sum(lengths), 4, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
        with recompiles_forbidden(i):
            step(q, k, v, cu, max(lengths)).backward()
        got = [t.grad for t in (q, k, v)]
        q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        want_out, want_lse = per_sequence_reference(q2, k2, v2, cu, cu, None, None, True,
                                                    dict(window_size=(-1, -1), softcap=0.0, alibi_slopes=None))
        (want_out.square().sum() + want_lse.sum()).backward()
        for g, w in zip(got, (q2.grad, k2.grad, v2.grad)):
            torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)
