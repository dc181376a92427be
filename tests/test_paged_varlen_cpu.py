"""flash_attn_varlen_func with block_table (packed queries over a paged KV cache, forward only) on
CPU: every sequence against its own float64 attention, the bottom-right alignment per sequence,
rows outside every sequence, the forward-only rule and the checks of the offsets."""

from __future__ import annotations

import pytest
import torch

import fattn
from helpers import check_paged_varlen, paged_varlen_inputs

F64 = torch.float64


@pytest.mark.parametrize("causal,window,softcap", [(True, (-1, -1), 0.0), (False, (-1, -1), 0.0),
                                                   (False, (7, 2), 0.0), (True, (20, -1), 5.0)])
@pytest.mark.parametrize("lens_q,lens_k", [([3, 0, 17, 1], [40, 5, 30, 64]), ([1], [1]), ([50, 20], [50, 90])])
def test_paged_varlen_float64(lens_q, lens_k, causal, window, softcap):
    check_paged_varlen(lens_q, lens_k, 8, 2, 32, 16, F64, "cpu", causal=causal, window_size=window, softcap=softcap)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_varlen_low_precision(dtype):
    check_paged_varlen([5, 33, 2], [60, 33, 100], 8, 1, 64, 32, dtype, "cpu", causal=True)


def test_seqused_k_overrides_the_key_offsets():
    q, k_pool, v_pool, cu_q, cu_k, table = paged_varlen_inputs([4, 6], [30, 50], 4, 2, 16, 16, F64, "cpu")
    used = torch.tensor([30, 50], dtype=torch.int32)
    want = fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 6, 50, causal=True, block_table=table)
    wrong_offsets = torch.zeros_like(cu_k)  # ignored when seqused_k is given
    got = fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, wrong_offsets, 6, 50, causal=True,
                                       block_table=table, seqused_k=used)
    assert torch.equal(got, want)


def test_forward_only():
    """Inputs that require grad run the forward (as flash-attn's do); a backward that reaches the
    outputs raises instead of leaving every .grad at None; dropout is refused."""
    q, k_pool, v_pool, cu_q, cu_k, table = paged_varlen_inputs([4, 6], [30, 50], 4, 2, 16, 16, F64, "cpu")
    with torch.no_grad():
        want = fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 6, 50, block_table=table)
    for needs_grad in (q, k_pool, v_pool):
        inputs = [t.detach().requires_grad_(t is needs_grad) for t in (q, k_pool, v_pool)]
        out = fattn.flash_attn_varlen_func(*inputs, cu_q, cu_k, 6, 50, block_table=table)
        assert torch.equal(out.detach(), want) and out.requires_grad
        out.add_(1)  # an output of its own, not a view: the caller may write to it
        with pytest.raises(RuntimeError, match="block_table .* has no backward"):
            out.sum().backward()
    with pytest.raises(RuntimeError, match="dropout_p is 0.1; with block_table"):
        fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 6, 50, dropout_p=0.1, block_table=table)


def test_bad_offsets_raise():
    q, k_pool, v_pool, cu_q, cu_k, table = paged_varlen_inputs([4, 6], [30, 50], 4, 2, 16, 16, F64, "cpu")
    with pytest.raises(RuntimeError, match=r"cu_seqlens_q has shape \[2\]; expected \[3\]"):
        fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q[:2], cu_k, 6, 50, block_table=table)
    with pytest.raises(RuntimeError, match="sequence 1 has 6 queries, more than max_seqlen_q = 5"):
        fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 5, 50, block_table=table)
    with pytest.raises(RuntimeError, match=r"block_table\[1, 3\] is"):
        bad = table.clone()
        bad[1, 3] = 99
        fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 6, 50, block_table=bad)
    with pytest.raises(RuntimeError, match=r"sequence 1 has 170 keys but block_table holds 4 pages of 16"):
        fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, torch.tensor([0, 30, 200], dtype=torch.int32), 6, 200,
                                     block_table=table)
