"""fattn.flash_attn_with_kvcache (torch.ops.fattn.decode): every bad-input rule of the contract,
one test per rule, through the public function, the op and, for the rules that shapes, dtypes
and devices decide, the op's fake (the error torch.compile raises). No rule may write to the
cache before it raises.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn
from helpers import DECODE, call_with_fakes, check_fake_raises_like_op, seqlens_tensor


def _valid(paged=False, dtype=torch.float32, device="cpu"):
    """A valid call's arguments: q [2, 3, 4, 32], cache capacity 48, 2 new tokens."""
    def randn(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)

    if paged:
        k_cache, v_cache = randn(7, 16, 2, 32), randn(7, 16, 2, 32)
        block_table = torch.tensor([[3, 0, 5], [1, 6, 2]], dtype=torch.int32, device=device)
    else:
        k_cache, v_cache = randn(2, 48, 2, 32), randn(2, 48, 2, 32)
        block_table = None
    return dict(q=randn(2, 3, 4, 32), k_cache=k_cache, v_cache=v_cache, k=randn(2, 2, 2, 32), v=randn(2, 2, 2, 32),
                cache_seqlens=seqlens_tensor([5, 40], device), block_table=block_table, softmax_scale=None,
                causal=True, window_size=(-1, -1), softcap=0.0, num_splits=0)


def _op_args(a):
    return (a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"], a["cache_seqlens"], a["block_table"],
            a["softmax_scale"], a["causal"], a["window_size"][0], a["window_size"][1], a["softcap"], a["num_splits"])


def _call(via, a):
    if via == "api":
        return fattn.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], k=a["k"], v=a["v"],
                                             cache_seqlens=a["cache_seqlens"], block_table=a["block_table"],
                                             softmax_scale=a["softmax_scale"], causal=a["causal"],
                                             window_size=a["window_size"], softcap=a["softcap"],
                                             num_splits=a["num_splits"], return_lse=True)
    if via == "fake":
        return call_with_fakes(DECODE, _op_args(a))
    return DECODE(*_op_args(a))


def _expect(via, match, paged=False, **changes):
    a = _valid(paged)
    for name, change in changes.items():
        a[name] = change(a) if callable(change) else change
    caches = [a["k_cache"].clone(), a["v_cache"].clone()]
    match = r"(?s)fattn\.decode: .*" + match
    if via == "fake":  # the op and its fake raise the same error
        check_fake_raises_like_op(DECODE, _op_args(a), match)
    else:
        with pytest.raises(RuntimeError, match=match):
            _call(via, a)
    # Errors come before any write.
    assert torch.equal(a["k_cache"], caches[0]) and torch.equal(a["v_cache"], caches[1]), "cache modified"


VIA = pytest.mark.parametrize("via", ["api", "op", "fake"])
# Rules on the values of cache_seqlens and block_table: only the op can check them.
VALUE_RULE_VIA = pytest.mark.parametrize("via", ["api", "op"])


@VIA
def test_valid_baseline_calls_succeed(via):
    # The bad-input tests below each change one thing of these calls.
    for paged in (False, True):
        out, lse = _call(via, _valid(paged))
        assert out.shape == (2, 3, 4, 32) and lse.shape == (2, 4, 3)


@VIA
def test_bad_rank(via):
    _expect(via, r"\bq\b", q=lambda a: a["q"][:, 0])
    _expect(via, r"\bq\b", q=lambda a: a["q"][None])
    _expect(via, r"\bk_cache\b", k_cache=lambda a: a["k_cache"][0])
    _expect(via, r"\bv_cache\b", v_cache=lambda a: a["v_cache"][0])
    _expect(via, r"\bk\b", k=lambda a: a["k"][:, 0])
    _expect(via, r"\bv\b", v=lambda a: a["v"][:, 0])


@VIA
def test_bad_dtype(via):
    _expect(via, r"\bq\b", q=lambda a: a["q"].int(), k_cache=lambda a: a["k_cache"].int(),
            v_cache=lambda a: a["v_cache"].int(), k=lambda a: a["k"].int(), v=lambda a: a["v"].int())
    _expect(via, r"\bk_cache\b", k_cache=lambda a: a["k_cache"].double())
    _expect(via, r"\bv_cache\b", v_cache=lambda a: a["v_cache"].bfloat16())
    _expect(via, r"\bk\b", k=lambda a: a["k"].double())
    _expect(via, r"\bv\b", v=lambda a: a["v"].half())


@VIA
def test_seqlen_q_over_16(via):
    _expect(via, r"seqlen", q=lambda a: torch.randn(2, 17, 4, 32))


@VIA
def test_k_without_v_and_v_without_k(via):
    _expect(via, r"(\bk\b.*\bv\b|\bv\b.*\bk\b)", v=None)
    _expect(via, r"(\bk\b.*\bv\b|\bv\b.*\bk\b)", k=None)


@VIA
def test_new_token_shapes_that_do_not_match(via):
    _expect(via, r"\bk\b", k=torch.randn(2, 2, 1, 32), v=torch.randn(2, 2, 1, 32))  # kv_heads 1 vs the cache's 2
    _expect(via, r"\bk\b", k=torch.randn(3, 2, 2, 32), v=torch.randn(3, 2, 2, 32))  # batch 3 vs q's 2
    _expect(via, r"\bk\b", k=torch.randn(2, 2, 2, 40), v=torch.randn(2, 2, 2, 40))  # head_dim 40 vs 32
    _expect(via, r"\bv\b", v=torch.randn(2, 3, 2, 32))  # v's seqlen differs from k's


@VIA
def test_cache_shapes_that_do_not_match(via):
    _expect(via, r"\bv_cache\b", v_cache=torch.randn(2, 40, 2, 32))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(2, 48, 2, 40), v_cache=torch.randn(2, 48, 2, 40))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(3, 48, 2, 32), v_cache=torch.randn(3, 48, 2, 32))
    _expect(via, r"\bk_cache\b", k_cache=torch.randn(2, 48, 32, 2).transpose(2, 3))  # last dim not contiguous


@VIA
def test_heads_not_a_multiple_of_kv_heads(via):
    _expect(via, r"heads", q=torch.randn(2, 3, 5, 32))


@VIA
@pytest.mark.parametrize("d", [12, 100, 264])
def test_unsupported_head_dim(via, d):
    _expect(via, r"head_dim", q=torch.randn(2, 3, 4, d), k_cache=torch.randn(2, 48, 2, d),
            v_cache=torch.randn(2, 48, 2, d), k=torch.randn(2, 2, 2, d), v=torch.randn(2, 2, 2, d))


@VIA
def test_cache_seqlens_not_int32_batch(via):
    _expect(via, r"cache_seqlens", cache_seqlens=torch.tensor([5, 40], dtype=torch.int64))
    _expect(via, r"cache_seqlens", cache_seqlens=torch.tensor([5.0, 40.0]))
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([5, 40, 7]))
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([[5, 40]]))


@VIA
def test_block_table_not_int32_2d_batch(via):
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"].long())
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"].flatten())
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"][:1])
    _expect(via, r"block_table", paged=True, block_table=lambda a: a["block_table"][None])


@VIA
@pytest.mark.parametrize("page_size", [8, 24])
def test_page_size_not_a_multiple_of_16(via, page_size):
    pages = -(-48 // page_size)
    _expect(via, r"page_size", paged=True, k_cache=torch.randn(2 * pages, page_size, 2, 32),
            v_cache=torch.randn(2 * pages, page_size, 2, 32),
            block_table=torch.arange(2 * pages, dtype=torch.int32).view(2, pages))


@VIA
def test_new_tokens_without_cache_seqlens(via):
    _expect(via, r"cache_seqlens", cache_seqlens=None)


@VIA
@pytest.mark.parametrize("num_splits", [-1, 257])
def test_num_splits_out_of_range(via, num_splits):
    _expect(via, r"num_splits", num_splits=num_splits)


@VIA
def test_negative_softcap(via):
    _expect(via, r"softcap", softcap=-1.0)


@VALUE_RULE_VIA
@pytest.mark.parametrize("paged", [False, True])
def test_cache_too_small_for_the_append(via, paged):
    # Capacity 48: sequence 0 fits, sequence 1 (47 + 2) does not; nothing may be written.
    _expect(via, r"(cache too small|capacity)", paged=paged, cache_seqlens=seqlens_tensor([5, 47]))
    # Without an append, cache_seqlens past the capacity is the same rule.
    _expect(via, r"(cache too small|capacity|cache_seqlens)", paged=paged, k=None, v=None,
            cache_seqlens=seqlens_tensor([5, 49]))


@VALUE_RULE_VIA
def test_negative_cache_seqlens(via):
    _expect(via, r"cache_seqlens", cache_seqlens=seqlens_tensor([5, -1]))
    _expect(via, r"cache_seqlens", k=None, v=None, cache_seqlens=seqlens_tensor([-3, 5]))


@VALUE_RULE_VIA
@pytest.mark.parametrize("entry", [-1, 7])
def test_block_table_entry_out_of_range(via, entry):
    def patch(a):
        table = a["block_table"].clone()
        table[1, 2] = entry  # 7 pages: valid entries are 0..6
        return table
    _expect(via, r"block_table", paged=True, block_table=patch)


def test_fake_applies_the_cuda_rules():
    # Fake CUDA tensors need no GPU. The op's own errors for these inputs are pinned by
    # test_decode_gpu.py's test_bad_input_cuda_rules.
    with FakeTensorMode():
        a = _valid(paged=True, dtype=torch.float16, device="cuda")
        out, lse = _call("op", a)
        assert out.device == a["q"].device and lse.dtype == torch.float32

        def expect(match, **changes):
            with pytest.raises(RuntimeError, match=r"(?s)fattn\.decode: .*" + match):
                _call("op", dict(a, **changes))

        on_cpu = _valid(paged=True, dtype=torch.float16)
        for name in ("k_cache", "v_cache", "k", "cache_seqlens", "block_table"):
            expect(rf"\b{name} is on cpu but q is on cuda:0", **{name: on_cpu[name]})
        float32 = _valid(paged=True, device="cuda")
        expect(r"q has dtype float32; expected float16 or bfloat16$",
               **{name: float32[name] for name in ("q", "k_cache", "v_cache", "k", "v")})
        expect(r"num_splits is 257", num_splits=257)
        expect(r"softcap must be a finite number >= 0", softcap=-0.5)
