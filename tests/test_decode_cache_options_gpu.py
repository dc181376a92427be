"""flash-attn's cache options on a GPU (skipped without one): the rotary embedding in the call,
cache_batch_idx, cache_leftpad, query chunks of any length over contiguous and paged caches,
CUDA-graph replay with new lengths for each query-length class, the sm_80 PTX path and the
FATTN_DEBUG_CHECKS switch. Accuracy is flash-attn's 2x rule against the float64 reference
(check_outputs); every call's cache is checked after the append (rotated keys within one
rounding step)."""

import math

import pytest
import torch

import fattn
from helpers import (
    CACHE_OPTION_CASES, KVCache, cache_option_case_id, check_outputs, new_tokens, references, requires_gpu,
    rotated_keys, run_cache_option_case, run_decode, seqlens_tensor, skip_without_ptx,
)

pytestmark = [requires_gpu, pytest.mark.gpu]

DEV = "cuda"


@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CACHE_OPTION_CASES, ids=cache_option_case_id)
def test_cache_options(case, dtype, num_splits):
    run_cache_option_case(case, dtype, DEV, num_splits)


def _tables(rows, rotary_dim, dtype):
    angles = 2 * math.pi * torch.rand(rows, rotary_dim // 2, dtype=torch.float64, device=DEV)
    return angles.cos().to(dtype), angles.sin().to(dtype)


# The matrix: every query-length class, contiguous and paged (16, 256), rotary in both
# layouts, left padding, cache rows and appends, over a batch of short and long sequences.
QUERY_LENGTHS = [1, 3, 16, 17, 128, 1000]
LAYOUTS = [None, 16, 256]


@pytest.mark.parametrize("page_size", LAYOUTS, ids=lambda p: f"page{p}" if p else "contiguous")
@pytest.mark.parametrize("seqlen_q", QUERY_LENGTHS)
def test_query_lengths_with_every_option(seqlen_q, page_size):
    dtype = torch.bfloat16
    lengths = [0, 300, 3000]
    new = seqlen_q if seqlen_q <= 128 else 200      # appends shorter than the query chunk too
    batch, heads, kv_heads, d = len(lengths), 16, 4, 128
    cache = KVCache(batch, max(lengths) + max(new, seqlen_q) + 7, kv_heads, d, dtype, DEV, page_size,
                    spare_rows=None if page_size else 2)
    q = torch.randn(batch, seqlen_q, heads, d, dtype=dtype, device=DEV)
    k, v = new_tokens(batch, new, kv_heads, d, dtype, DEV)
    cos, sin = _tables(cache.capacity + 1, 64, dtype)
    interleaved = seqlen_q % 2 == 1
    leftpad = seqlens_tensor([0, 100, 2500], DEV)
    cache.fill_padding(leftpad.tolist())  # NaN there must reach no output
    run_decode(q, cache, seqlens_tensor(lengths, DEV), k, v, what=f"sq={seqlen_q} page={page_size}", causal=True,
               rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved, cache_leftpad=leftpad)


@pytest.mark.parametrize("seqlen_q,window", [(20, (64, 0)), (700, (-1, -1)), (300, (100, 20))])
def test_long_query_chunks_noncausal_and_windowed(seqlen_q, window):
    lengths = [50, 1000, 4000]
    cache = KVCache(3, 4000 + seqlen_q + 5, 8, 64, torch.float16, DEV, 256)
    q = torch.randn(3, seqlen_q, 32, 64, dtype=torch.float16, device=DEV)
    run_decode(q, cache, seqlens_tensor(lengths, DEV), what=f"sq={seqlen_q} window={window}", causal=False,
               window_size=window, softcap=30.0)


def _replay_case(seqlen_q, page_size):
    """A captured call with rotary, left padding and an append, replayed with new lengths."""
    batch, heads, kv_heads, d, new, dtype = 3, 16, 4, 128, seqlen_q, torch.bfloat16
    cache = KVCache(batch, 4096, kv_heads, d, dtype, DEV, page_size)
    cap = cache.capacity
    q = torch.randn(batch, seqlen_q, heads, d, dtype=dtype, device=DEV)
    k, v = new_tokens(batch, new, kv_heads, d, dtype, DEV)
    cos, sin = _tables(cap, 64, dtype)
    cache_seqlens, leftpad = seqlens_tensor([5, 100, 7], DEV), seqlens_tensor([0, 0, 0], DEV)
    step = dict(k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens, cache_leftpad=leftpad,
                block_table=cache.block_table, causal=True, rotary_interleaved=False, return_lse=True)
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)  # load the modules before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **step)
    for lengths, pads in (([3, 17, 1], [0, 5, 1]), ([1000, 0, 3000], [999, 0, 10]),
                          ([cap - new, 2000, 1], [0, 1500, 0]), ([0, 0, 0], [0, 0, 0])):
        cache_seqlens.copy_(seqlens_tensor(lengths, DEV))
        leftpad.copy_(seqlens_tensor(pads, DEV))
        for dst in (q, k, v):
            dst.copy_(torch.randn_like(dst))
        kw = dict(causal=True, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False, cache_leftpad=leftpad)
        ref_out, ref_lse, low_out = references(q, cache.k_cache, cache.v_cache, cache_seqlens, cache.block_table,
                                               k, v, **kw)
        snap = cache.snapshot()
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        what = f"graph replay sq={seqlen_q} lengths={lengths} leftpad={pads}"
        check_outputs(out, lse, q, ref_out, ref_lse, low_out, what=what)
        stored = rotated_keys(k, cache_seqlens, cos, sin, False)
        cache.check_append(snap, stored, v, cache_seqlens, what=what,
                           atol=2 * torch.finfo(dtype).eps * stored.abs().max().item())


@pytest.mark.parametrize("seqlen_q", [3, 128], ids=["decode-tile", "wide-tile"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_cuda_graph_replay_with_new_lengths(seqlen_q, page_size):
    _replay_case(seqlen_q, page_size)


@pytest.mark.parametrize("arch", [80, 75])
@pytest.mark.parametrize("seqlen_q", [2, 40])
def test_older_arch_code_path_via_ptx(seqlen_q, arch, monkeypatch):
    # sm_75 has no wide tile (configs.json "exclude"): its 40-token chunk takes the decoding tile.
    skip_without_ptx(arch, "attn_decode_split", "attn_decode_merge", "kv_append", "rotate_queries")
    monkeypatch.setenv("FATTN_FORCE_PTX_ARCH", str(arch))
    run_cache_option_case(("ptx-" + str(seqlen_q), [3, 40, 300], seqlen_q, 8, 2, 96, 16, seqlen_q, True, (-1, -1),
                           dict(rotary=("gptj", 32), leftpad=[0, 20, 100])), torch.bfloat16, DEV)


def test_debug_checks_catch_a_bad_block_table(monkeypatch):
    cache = KVCache(2, 64, 2, 64, torch.bfloat16, DEV, 16)
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=DEV)
    k, v = new_tokens(2, 1, 2, 64, torch.bfloat16, DEV)
    table = cache.block_table.clone()
    table[1, 0] = 1000
    before = cache.snapshot()
    call = dict(k=k, v=v, cache_seqlens=seqlens_tensor([3, 5], DEV), block_table=table)
    monkeypatch.setenv("FATTN_DEBUG_CHECKS", "1")
    with pytest.raises(RuntimeError, match=r"block_table\[1, 0\] is 1000; expected a page index in \[0, 11\)"):
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, **call)
    assert all(torch.equal(a, b) for a, b in zip(cache.bases, before)), "the failed call wrote the cache"
    with pytest.raises(RuntimeError, match=r"cache_leftpad\[0\] is -2"):
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([3, 5], DEV),
                                      block_table=cache.block_table, cache_leftpad=seqlens_tensor([-2, 0], DEV))
    # Valid calls pass the checks; without the switch nothing is read back.
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([3, 5], DEV),
                                  block_table=cache.block_table)
    monkeypatch.delenv("FATTN_DEBUG_CHECKS")
    fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, cache_seqlens=seqlens_tensor([3, 5], DEV),
                                  block_table=cache.block_table)
