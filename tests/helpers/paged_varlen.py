"""Packed query sequences over a paged KV cache (flash_attn_varlen_func with block_table): the
inputs and the check of each sequence against attention_reference over its own keys."""

from __future__ import annotations

import torch

import fattn
from fattn.reference import attention_reference

from .kvcache import check_outputs


def paged_varlen_inputs(lens_q, lens_k, heads, kv_heads, head_dim, page_size, dtype, device, spare_rows=2):
    """(q [total_q + spare_rows, heads, d], k_pool, v_pool, cu_seqlens_q, cu_seqlens_k, block_table)
    with shuffled pages; q's rows past the last sequence belong to none."""
    batch = len(lens_q)
    pages_per_seq = -(-max(lens_k + [1]) // page_size)
    num_pages = batch * pages_per_seq + 3
    k_pool = torch.randn(num_pages, page_size, kv_heads, head_dim, dtype=dtype, device=device)
    v_pool = torch.randn_like(k_pool)
    table = torch.randperm(num_pages, device=device)[:batch * pages_per_seq].view(batch, pages_per_seq).int()
    offsets = [0]
    for n in lens_q:
        offsets.append(offsets[-1] + n)
    key_offsets = [0]
    for n in lens_k:
        key_offsets.append(key_offsets[-1] + n)
    cu_q = torch.tensor(offsets, dtype=torch.int32, device=device)
    cu_k = torch.tensor(key_offsets, dtype=torch.int32, device=device)
    q = torch.randn(offsets[-1] + spare_rows, heads, head_dim, dtype=dtype, device=device)
    return q, k_pool, v_pool, cu_q, cu_k, table


def check_paged_varlen(lens_q, lens_k, heads, kv_heads, head_dim, page_size, dtype, device, **kw):
    """Runs flash_attn_varlen_func over the paged cache and checks every sequence against its own
    float64 attention (the 2x rule below float64); rows outside every sequence must be 0 / lse 0."""
    q, k_pool, v_pool, cu_q, cu_k, table = paged_varlen_inputs(lens_q, lens_k, heads, kv_heads, head_dim,
                                                               page_size, dtype, device)
    out, lse = fattn.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, max(lens_q), max(lens_k),
                                            block_table=table, return_lse=True, **kw)
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0]), f"shapes {out.shape} {lse.shape}"
    ref_kw = {name: kw[name] for name in ("causal", "window_size", "softcap", "softmax_scale") if name in kw}
    for b, (n, m) in enumerate(zip(lens_q, lens_k)):
        if n == 0:
            continue
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = k_pool[table[b].long()].flatten(0, 1)[:m][None]
        values = v_pool[table[b].long()].flatten(0, 1)[:m][None]
        qb = q[rows][None]
        ref_out, ref_lse = attention_reference(qb.double(), keys.double(), values.double(), **ref_kw)
        low_out, _ = attention_reference(qb, keys, values, dtype=dtype, **ref_kw)
        got = out[rows][None]
        got = got if head_dim % 8 == 0 else got.contiguous()  # a padded head dim returns a view
        check_outputs(got, lse[:, rows][None], qb, ref_out, ref_lse, low_out,
                      what=f"sequence {b} ({n} queries, {m} keys)")
    tail = slice(int(cu_q[-1]), q.shape[0])
    assert (out[tail] == 0).all() and (lse[:, tail] == 0).all(), "rows outside every sequence must be 0"
