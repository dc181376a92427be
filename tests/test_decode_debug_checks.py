"""fattn.flash_attn_with_kvcache's checks of the device values that a shape cannot show: a
sequence longer than block_table addresses, and a page that one sequence appends into while
another uses it. The CPU implementation always runs them; on CUDA FATTN_DEBUG_CHECKS=1 copies
the values to the host and runs the same checks (the GPU twins, skipped without a GPU). Every
refused call must leave the caches as they were: the checks come before any write."""

from __future__ import annotations

import pytest
import torch

import fattn
from helpers import KVCache, new_tokens, requires_gpu, run_decode, seqlens_tensor

DEVICES = [pytest.param("cpu", id="cpu"),
           pytest.param("cuda", marks=[requires_gpu, pytest.mark.gpu], id="cuda-debug-checks")]
DTYPE = {"cpu": torch.float64, "cuda": torch.bfloat16}


@pytest.fixture
def checked(monkeypatch, request):
    """The device of the test, with the value checks on: always on CPU (the switch must not be
    what turns them on there), through FATTN_DEBUG_CHECKS=1 on CUDA."""
    device = request.param
    if device == "cuda":
        monkeypatch.setenv("FATTN_DEBUG_CHECKS", "1")
    else:
        monkeypatch.delenv("FATTN_DEBUG_CHECKS", raising=False)
    return device


CHECKED = pytest.mark.parametrize("checked", DEVICES, indirect=True)


def _refused(cache, match, q, **call):
    """The call raises RuntimeError matching `match` and writes nothing to the caches; returns
    the message."""
    before = cache.snapshot()
    with pytest.raises(RuntimeError, match=match) as error:
        fattn.flash_attn_with_kvcache(q, cache.k_cache, cache.v_cache, block_table=cache.block_table, **call)
    for got, want in zip(cache.bases, before):
        assert torch.equal(got, want), f"the refused call wrote the cache: {error.value}"
    return str(error.value)


def _paged_cache(table, page_size, num_pages, device, kv_heads=2, head_dim=64):
    """A random paged cache of `num_pages` pages whose block_table is `table` (rows may share pages)."""
    table = torch.tensor(table, dtype=torch.int32, device=device)
    cache = KVCache(table.shape[0], table.shape[1] * page_size, kv_heads, head_dim, DTYPE[device], device,
                    page_size=page_size, spare_pages=num_pages - table.numel())
    cache.block_table = table
    return cache


def _query(batch, device, heads=4, head_dim=64):
    return torch.randn(batch, 1, heads, head_dim, dtype=DTYPE[device], device=device)


# ------------------------------------------------------ cache_seqlens past block_table's capacity


@CHECKED
def test_flash_attn_case_sequence_past_block_table(checked):
    # flash-attn's own case: one sequence, one page of 256 keys in its block_table row.
    device = checked
    cache = _paged_cache([[1]], 256, 3, device)
    q = _query(1, device)
    k, v = new_tokens(1, 1, 2, 64, DTYPE[device], device)
    message = _refused(cache, "block_table", q, cache_seqlens=seqlens_tensor([257], device))
    assert (r"fattn.decode: paged KV cache too small: cache_seqlens[0] = 257 exceeds the capacity addressable by "
            r"block_table (1 column x page_size 256 = 256 keys per sequence); allocate more columns in block_table "
            r"(at least 2 for this sequence)") == message
    assert "append" not in message and "new tokens" not in message  # nothing is appended
    message = _refused(cache, "block_table", q, k=k, v=v, cache_seqlens=seqlens_tensor([256], device))
    assert ("fattn.decode: paged KV cache too small for the append: cache_seqlens[0] = 256 plus 1 new tokens "
            "(= 257 keys) exceeds the capacity addressable by block_table (1 column x page_size 256 = 256 keys per "
            "sequence); allocate more columns in block_table (at least 2 for this sequence)") == message
    # Exactly the capacity, nothing appended: fine.
    run_decode(q, cache, seqlens_tensor([256], device), what="full page")


@CHECKED
def test_the_sequence_past_the_capacity_is_named(checked):
    # Three columns of 16 keys: sequence 1's 40 + 9 new tokens need a fourth.
    device = checked
    cache = _paged_cache([[0, 1, 2], [3, 4, 5]], 16, 8, device)
    q = _query(2, device)
    k, v = new_tokens(2, 9, 2, 64, DTYPE[device], device)
    message = _refused(cache, r"cache_seqlens\[1\] = 40 plus 9 new tokens \(= 49 keys\) exceeds the capacity "
                              r"addressable by block_table \(3 columns x page_size 16 = 48 keys per sequence\); "
                              r"allocate more columns in block_table \(at least 4 for this sequence\)",
                       q, k=k, v=v, cache_seqlens=seqlens_tensor([30, 40], device))
    assert "cache_seqlens[0]" not in message


@CHECKED
def test_contiguous_cache_names_k_cache_capacity(checked):
    device = checked
    cache = KVCache(2, 48, 2, 64, DTYPE[device], device)
    q = _query(2, device)
    k, v = new_tokens(2, 2, 2, 64, DTYPE[device], device)
    message = _refused(cache, r"fattn\.decode: cache too small: cache_seqlens\[1\] = 49 exceeds k_cache's capacity "
                              r"of 48 keys per sequence \(k_cache\.size\(1\)\)",
                       q, cache_seqlens=seqlens_tensor([5, 49], device))
    assert "block_table" not in message and "append" not in message
    message = _refused(cache, r"fattn\.decode: cache too small for the append: cache_seqlens\[1\] = 47 plus 2 new "
                              r"tokens \(= 49 keys\) exceeds k_cache's capacity of 48 keys per sequence "
                              r"\(k_cache\.size\(1\)\); allocate a longer cache",
                       q, k=k, v=v, cache_seqlens=seqlens_tensor([5, 47], device))
    assert "block_table" not in message


# ------------------------------------------------------------------ pages shared by an append


@CHECKED
def test_two_sequences_appending_into_one_page(checked):
    # Both rows hold page 2 in column 1, and both sequences (20 keys each) append at key 20, in it.
    device = checked
    cache = _paged_cache([[0, 2], [1, 2]], 16, 5, device)
    q = _query(2, device)
    k, v = new_tokens(2, 1, 2, 64, DTYPE[device], device)
    _refused(cache, r"fattn\.decode: sequences 0 and 1 both append into page 2 \(block_table\[0, 1\] and "
                    r"block_table\[1, 1\]\); sequences that append need pages of their own",
             q, k=k, v=v, cache_seqlens=seqlens_tensor([20, 20], device))
    # The same page in different columns: sequence 0 appends at key 20 (column 1), sequence 1
    # fills the page from key 0 (column 0).
    cache = _paged_cache([[0, 2], [2, 3]], 16, 5, device)
    _refused(cache, r"sequences 0 and 1 both append into page 2 \(block_table\[0, 1\] and block_table\[1, 0\]\)",
             q, k=k, v=v, cache_seqlens=seqlens_tensor([20, 0], device))


@CHECKED
@pytest.mark.parametrize("reader", [0, 1])
def test_appending_into_a_page_another_sequence_reads(checked, reader):
    # The writer's 20 keys end in page 2 (column 1), where its new token goes; the reader's
    # prefix is page 2 (column 0), and the reader appends into a page of its own.
    device = checked
    writer = 1 - reader
    rows = {writer: [0, 2, 4], reader: [2, 3, 5]}
    cache = _paged_cache([rows[0], rows[1]], 16, 8, device)
    q = _query(2, device)
    k, v = new_tokens(2, 1, 2, 64, DTYPE[device], device)
    lengths = {writer: 20, reader: 40}
    _refused(cache, rf"fattn\.decode: sequence {writer} appends into page 2 \(block_table\[{writer}, 1\]\), which "
                    rf"sequence {reader} also reads \(block_table\[{reader}, 0\]\); sequences that append need "
                    r"pages of their own \(pages shared for reading, a common prefix, must not be appended into\)",
             q, k=k, v=v, cache_seqlens=seqlens_tensor([lengths[0], lengths[1]], device))


@CHECKED
def test_shared_prefix_pages_are_read_not_written(checked):
    # Page 2 holds a prefix both sequences read; each appends into its own page. Sequence 1 starts
    # its append exactly at the page boundary (key 16), so the shared page is not written.
    device = checked
    cache = _paged_cache([[2, 0, 4], [2, 1, 5]], 16, 8, device)
    q = _query(2, device)
    k, v = new_tokens(2, 3, 2, 64, DTYPE[device], device)
    run_decode(q, cache, seqlens_tensor([20, 16], device), k, v, what="shared prefix", causal=True)
    # Without an append every page may be shared, even the whole row.
    cache = _paged_cache([[6, 7, 3], [6, 7, 3]], 16, 8, device)
    run_decode(q, cache, seqlens_tensor([40, 35], device), what="shared rows, no append")


@CHECKED
def test_padding_columns_may_hold_an_appended_page(checked):
    # Sequence 0 (5 + 1 keys) reads column 0 only: its padding columns name page 3, which
    # sequence 1 appends into (key 40, column 2). Only the pages a sequence uses count.
    device = checked
    cache = _paged_cache([[0, 3, 3], [1, 2, 3]], 16, 6, device)
    q = _query(2, device)
    k, v = new_tokens(2, 1, 2, 64, DTYPE[device], device)
    run_decode(q, cache, seqlens_tensor([5, 40], device), k, v, what="padding columns")
