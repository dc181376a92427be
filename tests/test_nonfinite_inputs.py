"""Non-finite values reach the outputs: a visible score that is NaN or +inf (from a NaN or infinite
q, k, bias, sink or ALiBi slope) makes its row's out and lse NaN, in every entry point and on every
device, and leaves every other row as it was. A NaN must never pass for a row that sees no key
(out 0, lse -inf), which is what a NaN-skipping row max gives.

The CPU implementations, the kernels and fattn.reference agree on this (the reference is the
statement); each case names the rows it poisons and checks the rest against the float64 reference."""

import pytest
import torch

import fattn
from fattn.reference import attention_reference, kvcache_reference
from helpers import device_dtype_params

NAN, INF = float("nan"), float("inf")
DEVICES = device_dtype_params([torch.float64], [torch.float16, torch.bfloat16])


def _inputs(device, dtype, batch=2, seqlen_q=5, seqlen_k=9, heads=4, kv_heads=2, head_dim=32):
    g = torch.Generator().manual_seed(0)
    shape_q, shape_k = (batch, seqlen_q, heads, head_dim), (batch, seqlen_k, kv_heads, head_dim)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype) for s in (shape_q, shape_k, shape_k)]


def _check(out, lse, want_out, want_lse, poisoned):
    """`poisoned`: bool [batch, heads, seqlen_q], the rows that must be NaN in out and lse; the
    other rows must be finite where the reference is and close to it."""
    lse = lse.double()
    out_rows = out.double().isnan().any(-1).transpose(1, 2)  # [batch, heads, seqlen_q]
    assert torch.equal(lse.isnan().cpu(), poisoned), "NaN lse rows differ from the poisoned rows"
    assert torch.equal(out_rows.cpu(), poisoned), "NaN out rows differ from the poisoned rows"
    keep = ~poisoned.to(lse.device)
    torch.testing.assert_close(lse[keep], want_lse.double()[keep], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.double().transpose(1, 2)[keep], want_out.double().transpose(1, 2)[keep],
                               atol=2e-2, rtol=2e-2)


def _rows(batch=2, heads=4, seqlen_q=5):
    return torch.zeros(batch, heads, seqlen_q, dtype=torch.bool)


@pytest.mark.parametrize("slope", [NAN, INF, -INF])
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_non_finite_alibi_slope_poisons_its_head(device, dtype, slope):
    q, k, v = _inputs(device, dtype)
    slopes = torch.tensor([[0.3, slope, 0.1, 0.2], [0.3, 0.5, 0.1, slope]], device=device)
    out, lse = fattn.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_lse=True)
    poisoned = _rows()
    poisoned[0, 1], poisoned[1, 3] = True, True
    finite = slopes.nan_to_num(0.0, 0.0, 0.0)  # the reference's other heads
    want_out, want_lse = attention_reference(q, k, v, causal=True, alibi_slopes=finite)
    _check(out, lse, want_out, want_lse, poisoned)
    # The reference states the rule too.
    ref_out, ref_lse = attention_reference(q, k, v, causal=True, alibi_slopes=slopes)
    assert torch.equal(ref_lse.isnan().cpu(), poisoned)


@pytest.mark.parametrize("value", [NAN, INF])
@pytest.mark.parametrize("where", ["q", "bias"])
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_non_finite_score_poisons_its_row_alone(device, dtype, where, value):
    q, k, v = _inputs(device, dtype)
    bias = torch.zeros(2, 4, 5, 9, dtype=dtype, device=device)
    if where == "q":
        q[1, 2, 0, 7] = value  # head 0 (and, by its kv head, nothing else) of row 2 in sequence 1
    else:
        bias[1, 0, 2, 4] = value
    out, lse = fattn.flash_attn_func(q, k, v, bias=bias, return_lse=True)
    poisoned = _rows()
    poisoned[1, 0, 2] = True
    clean_q, clean_bias = q.nan_to_num(0.0, 0.0, 0.0), bias.nan_to_num(0.0, 0.0, 0.0)
    want_out, want_lse = attention_reference(clean_q, k, v, bias=clean_bias)
    _check(out, lse, want_out, want_lse, poisoned)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_a_nan_sink_poisons_its_head(device, dtype):
    q, k, v = _inputs(device, dtype)
    sinks = torch.tensor([0.5, NAN, -1.0, 0.0], device=device)
    out, lse = fattn.flash_attn_func(q, k, v, sinks=sinks, return_lse=True)
    poisoned = _rows()
    poisoned[:, 1] = True
    want_out, want_lse = attention_reference(q, k, v, sinks=sinks.nan_to_num(0.0))
    _check(out, lse, want_out, want_lse, poisoned)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_varlen_and_decode_follow_the_same_rule(device, dtype):
    q, k, v = _inputs(device, dtype, batch=1, seqlen_q=5, seqlen_k=5)
    slopes = torch.tensor([0.3, NAN, 0.1, 0.2], device=device)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    out, lse = fattn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 3, 3, causal=True, alibi_slopes=slopes,
                                            return_lse=True)
    assert torch.equal(lse.isnan().cpu(), torch.tensor([False, True, False, False])[:, None].expand(4, 5))
    assert torch.equal(out.isnan().any(-1).cpu(), torch.tensor([False, True, False, False]).expand(5, 4))

    q, k_cache, v_cache = _inputs(device, dtype, seqlen_q=1, seqlen_k=16)
    lengths = torch.tensor([9, 16], dtype=torch.int32, device=device)
    out, lse = fattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, alibi_slopes=slopes,
                                             return_softmax_lse=True)
    poisoned = _rows(seqlen_q=1)
    poisoned[:, 1] = True
    want_out, want_lse = kvcache_reference(q, k_cache, v_cache, lengths, alibi_slopes=slopes.nan_to_num(0.0))
    _check(out, lse, want_out, want_lse, poisoned)


@pytest.mark.parametrize("device,dtype", device_dtype_params([torch.float64], [torch.float32, torch.bfloat16]))
def test_merge_keeps_a_nan_partial(device, dtype):
    """A partial whose lse is NaN poisons the merged row, even when it is the only partial: a NaN
    lse is not a partial that saw no key."""
    outs = torch.randn(2, 1, 3, 2, 8, dtype=dtype, device=device)
    lses = torch.randn(2, 1, 2, 3, dtype=torch.float64 if dtype == torch.float64 else torch.float32, device=device)
    lses[0, 0, 1, 2] = NAN
    lses[:, 0, 0, 0] = NAN
    out, lse = fattn.merge_attention_states(outs, lses)
    want = torch.zeros(1, 2, 3, dtype=torch.bool)
    want[0, 1, 2], want[0, 0, 0] = True, True
    assert torch.equal(lse.isnan().cpu(), want)
    assert torch.equal(out.isnan().any(-1).transpose(1, 2).cpu(), want)
