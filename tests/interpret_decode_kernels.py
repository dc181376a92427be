"""Runs triton_src/decode.py's kernels in Triton's interpreter (TRITON_INTERPRET=1, CPU, numpy)
and compares them with fattn's CPU decode op. Invoked by test_decode_kernels_interpreted.py in a
fresh process, because Triton reads TRITON_INTERPRET when the kernels are decorated.

The launches mirror csrc/ops/decode_cuda.cpp: kv_append when there are new tokens, then
attn_decode_split, then attn_decode_merge when there is more than one split. Prints one JSON
line per case: {"case": ..., "out_err": ..., "lse_err": ..., "lse_pattern": ..., "cache_ok": ...}.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

import fattn  # noqa: E402,F401  (loads the library: the CPU op is the reference)
from triton_src.decode import attn_decode_merge, attn_decode_split, kv_append  # noqa: E402

BLOCK_M, BLOCK_N, BLOCK_S = 16, 16, 4  # small tiles: several key tiles, row tiles and merge chunks


def launch(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, window, softcap, splits):
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    block_d = triton.next_power_of_2(head_dim)
    paged = block_table is not None
    page_size = k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    table = block_table if paged else cache_seqlens  # any int32 tensor: never read when not paged
    stride_tb = block_table.stride(0) if paged else 0
    seqlen_new = 0 if k_new is None else k_new.shape[1]
    pad_d = block_d != head_dim
    if seqlen_new:
        kv_append[(seqlen_new, kv_heads, batch)](
            k_new, v_new, k_cache, v_cache, cache_seqlens, table, *k_new.stride()[:3], *v_new.stride()[:3],
            *k_cache.stride()[:3], *v_cache.stride()[:3], stride_tb, page_size, capacity, head_dim,
            BLOCK_D=block_d, PAGED=paged, PAD_D=pad_d)
    row_tiles = math.ceil(seqlen_q * (heads // kv_heads) / BLOCK_M)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, seqlen_q), float("nan"))
    part_out = torch.full((splits, batch, seqlen_q, heads, head_dim), float("nan"))
    part_lse = torch.full((splits, batch, heads, seqlen_q), float("nan"))
    scale = 1 / math.sqrt(head_dim)
    qk_scale = scale / softcap if softcap > 0 else scale * math.log2(math.e)
    softcap_log2 = softcap * math.log2(math.e) if softcap > 0 else 0.0
    attn_decode_split[(splits, kv_heads * row_tiles, batch)](
        q, k_cache, v_cache, cache_seqlens, table, part_out, part_lse, out, lse,
        *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], stride_tb,
        seqlen_q, heads, heads // kv_heads, head_dim, seqlen_new, capacity, page_size, splits,
        window[0], 0 if causal else window[1], qk_scale, softcap_log2,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=block_d, PAGED=paged, PAD_D=pad_d)
    if splits > 1:
        attn_decode_merge[(seqlen_q, heads, batch)](
            part_out, part_lse, out, lse, batch * seqlen_q * heads, splits, seqlen_q, heads, head_dim,
            BLOCK_S=BLOCK_S, BLOCK_D=block_d, PAD_D=pad_d)
    return out, lse


CASES = [
    # name, seqlen_q, heads, kv_heads, head_dim, page_size (None: contiguous), new tokens, causal, window, softcap, splits
    ("contiguous-gqa4-1split", 1, 8, 2, 16, None, 2, False, (-1, -1), 0.0, 1),
    ("paged16-mha-3splits", 3, 4, 4, 24, 16, 0, False, (-1, -1), 0.0, 3),
    ("contiguous-mqa-causal-2rowtiles-9splits", 5, 6, 1, 32, None, 2, True, (-1, -1), 0.0, 9),
    ("paged16-window-both", 4, 8, 2, 16, 16, 2, False, (7, 1), 0.0, 1),
    ("contiguous-window-left-softcap", 1, 4, 4, 24, None, 0, False, (5, -1), 5.0, 3),
    ("paged32-window-right-9splits", 5, 6, 1, 32, 32, 2, False, (-1, 2), 0.0, 9),
    ("paged16-causal-softcap", 4, 8, 2, 40, 16, 1, True, (-1, -1), 3.0, 4),
]


def run_case(name, seqlen_q, heads, kv_heads, head_dim, page_size, seqlen_new, causal, window, softcap, splits):
    # An empty sequence, a short and a long one: with 9 splits the long one spreads its keys
    # over more splits than one merge chunk (BLOCK_S) holds. A right window only bites
    # when it is shorter than seqlen_q - 1 (the mask is aligned bottom-right).
    batch, capacity = 3, 256
    cache_seqlens = torch.tensor([0, 17, 250], dtype=torch.int32)
    q = torch.randn(batch, seqlen_q, heads, head_dim)
    if page_size:
        pages = batch * capacity // page_size
        k_cache = torch.randn(pages, page_size, kv_heads, head_dim)
        block_table = torch.randperm(pages, dtype=torch.int32).reshape(batch, capacity // page_size)
    else:
        k_cache = torch.randn(batch, capacity, kv_heads, head_dim)
        block_table = None
    v_cache = torch.randn_like(k_cache)
    k_new = torch.randn(batch, seqlen_new, kv_heads, head_dim) if seqlen_new else None
    v_new = torch.randn_like(k_new) if seqlen_new else None
    want_k, want_v = k_cache.double(), v_cache.double()
    want_out, want_lse = torch.ops.fattn.decode(
        q.double(), want_k, want_v, None if k_new is None else k_new.double(),
        None if v_new is None else v_new.double(), cache_seqlens, block_table, None, causal, window[0], window[1],
        softcap, 0)
    out, lse = launch(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, window, softcap, splits)
    finite = torch.isfinite(want_lse)
    return {
        "case": name,
        "out_err": (out.double() - want_out).abs().max().item(),  # NaN if any output was left unwritten
        "lse_err": (lse.double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0,
        "lse_pattern": bool(torch.equal(torch.isfinite(lse), finite)),
        "empty_rows": int((~finite).sum()),
        "cache_ok": bool(torch.equal(k_cache.double(), want_k) and torch.equal(v_cache.double(), want_v)),
    }


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in CASES:
        print(json.dumps(run_case(*case)), flush=True)
