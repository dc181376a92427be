"""return_attn_probs=True with dropout returns flash-attn's S_dmask (python/fattn/_attn_probs.py):
[batch, heads, seqlen_q and seqlen_k rounded up to 128] in q's dtype, exp(s - row max) for a kept
key, negated for a dropped one, 0 where the query sees no key and in the rounding margin.

flash-attn's tests read it back as the keep mask (S >= 0) and the probabilities (|S| times
exp(row max - lse)), then rebuild out from them: the same reading here must give the mask the
kernels drew and the float64 probabilities, and out must be what they make."""

import pytest
import torch

import fattn
from fattn.reference import attention_scores, dropout_keep_mask
from helpers import device_dtype_params

DEVICES = device_dtype_params([torch.float64], [torch.float16, torch.bfloat16])


def _read_back(s_dmask, seqlen_q, seqlen_k, scores):
    """(keep, probabilities) as flash-attn's helpers read them, with one block per row."""
    s = s_dmask[:, :, :seqlen_q, :seqlen_k].double()
    lse = torch.logsumexp(scores, -1, keepdim=True)
    row_max = scores.amax(-1, keepdim=True)
    scale = torch.exp(row_max - lse).nan_to_num(0.0)  # rows that see no key: 0
    return s >= 0, s.abs() * scale


def _check(s_dmask, out, q, k, v, seed, p, variant, batch_index=0):
    """s_dmask [1, heads, ...] against one sequence q [1, seqlen_q, heads, dim]."""
    seqlen_q, heads, seqlen_k = q.shape[1], q.shape[2], k.shape[1]
    assert s_dmask.dtype == q.dtype and s_dmask.shape[2] % 128 == 0 and s_dmask.shape[3] % 128 == 0
    assert (s_dmask[:, :, seqlen_q:] == 0).all() and (s_dmask[..., seqlen_k:] == 0).all(), "margin not 0"
    scores = attention_scores(q, k, **variant)
    visible = scores > float("-inf")
    keep, probs = _read_back(s_dmask, seqlen_q, seqlen_k, scores)
    want_keep, keep_probability = dropout_keep_mask(seed, batch_index + 1, heads, seqlen_q, seqlen_k, p,
                                                    device=q.device)
    want_keep = want_keep[batch_index:]
    # Where a probability rounds to 0 its sign is lost (-0.0 >= 0): compare where it is not 0.
    nonzero = visible & (s_dmask[:, :, :seqlen_q, :seqlen_k] != 0)
    assert torch.equal(keep[nonzero], want_keep[nonzero]), "the keep mask differs from the drawn one"
    assert (s_dmask[:, :, :seqlen_q, :seqlen_k][~visible] == 0).all(), "masked keys must be 0"
    want_probs = torch.softmax(scores, -1).nan_to_num(0.0)
    tolerance = 1e-12 if q.dtype == torch.float64 else 1e-2
    torch.testing.assert_close(probs, want_probs, atol=tolerance, rtol=tolerance)
    # out is what the read-back mask and the float64 probabilities make
    group = heads // k.shape[2]
    dropped = want_probs * (keep & visible) / keep_probability
    want_out = torch.einsum("bhqk,bkhd->bqhd", dropped, v.double().repeat_interleave(group, dim=2))
    torch.testing.assert_close(out.double(), want_out, atol=20 * tolerance, rtol=20 * tolerance)


@pytest.mark.parametrize("variant", [dict(), dict(causal=True), dict(window_size=(7, 3)),
                                     dict(causal=True, alibi=True), dict(softcap=3.0)],
                         ids=["full", "causal", "window", "causal-alibi", "softcap"])
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_dense_s_dmask_reads_back_as_the_drawn_mask_and_the_probabilities(device, dtype, variant):
    torch.manual_seed(0)
    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim = 2, 70, 150, 4, 2, 40
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(batch, seqlen_k, kv_heads, head_dim, dtype=dtype, device=device) for _ in range(2))
    variant = dict(variant)
    if variant.pop("alibi", False):
        variant["alibi_slopes"] = torch.rand(batch, heads, device=device) * 0.3
    p = 0.17
    torch.manual_seed(5)
    out, lse, s_dmask = fattn.flash_attn_func(q, k, v, p, return_attn_probs=True, **variant)
    assert s_dmask.shape == (batch, heads, 128, 256)
    torch.manual_seed(5)  # the seed the call drew
    seed = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)
    for b in range(batch):
        seq_variant = dict(variant)
        if "alibi_slopes" in seq_variant:
            seq_variant["alibi_slopes"] = seq_variant["alibi_slopes"][b:b + 1]
        _check(s_dmask[b:b + 1], out[b:b + 1], q[b:b + 1], k[b:b + 1], v[b:b + 1], seed, p, seq_variant, b)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_packed_s_dmask_holds_each_sequence_from_its_own_start(device, dtype):
    torch.manual_seed(1)
    lengths_q, lengths_k = [5, 0, 33], [40, 7, 33]
    cu_q = torch.tensor([0, 5, 5, 38], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 40, 47, 80], dtype=torch.int32, device=device)
    q = torch.randn(38, 4, 24, dtype=dtype, device=device)
    k, v = (torch.randn(80, 2, 24, dtype=dtype, device=device) for _ in range(2))
    torch.manual_seed(9)
    out, lse, s_dmask = fattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 33, 40, 0.3, causal=True,
                                                     return_attn_probs=True)
    assert s_dmask.shape == (3, 4, 128, 128)
    torch.manual_seed(9)
    seed = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)
    for b in range(3):
        if lengths_q[b] == 0:
            assert (s_dmask[b] == 0).all()
            continue
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        _check(s_dmask[b:b + 1], out[rows][None], q[rows][None], k[keys][None], v[keys][None], seed, 0.3,
               dict(causal=True), b)


def test_without_dropout_s_dmask_is_none():
    q = torch.randn(1, 5, 2, 16, dtype=torch.float64)
    assert fattn.flash_attn_func(q, q, q, return_attn_probs=True)[2] is None
    cu = torch.tensor([0, 5], dtype=torch.int32)
    assert fattn.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, return_attn_probs=True)[2] is None
