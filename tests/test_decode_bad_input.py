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
    """fattn::decode's positional arguments (flash-attn's order)."""
    return (a["q"], a["k_cache"], a["v_cache"], a["k"], a["v"], a.get("rotary_cos"), a.get("rotary_sin"),
            a["cache_seqlens"], a.get("cache_batch_idx"), a.get("cache_leftpad"), a["block_table"],
            a["softmax_scale"], a["causal"], a["window_size"][0], a["window_size"][1], a["softcap"],
            a.get("rotary_interleaved", True), None, a["num_splits"], None, a.get("k_descale"), a.get("v_descale"))


def _call(via, a):
    if via == "api":
        return fattn.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], k=a["k"], v=a["v"],
                                             rotary_cos=a.get("rotary_cos"), rotary_sin=a.get("rotary_sin"),
                                             cache_batch_idx=a.get("cache_batch_idx"),
                                             cache_leftpad=a.get("cache_leftpad"),
                                             rotary_interleaved=a.get("rotary_interleaved", True),
                                             cache_seqlens=a["cache_seqlens"], block_table=a["block_table"],
                                             softmax_scale=a["softmax_scale"], causal=a["causal"],
                                             window_size=a["window_size"], softcap=a["softcap"],
                                             num_splits=a["num_splits"], k_descale=a.get("k_descale"),
                                             v_descale=a.get("v_descale"), return_lse=True)
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
def test_no_query_token(via):
    _expect(via, r"seqlen", q=lambda a: torch.randn(2, 0, 4, 32))


def _rotary(rows=48, half=8, dtype=torch.float32):
    angles = torch.rand(rows, half, dtype=torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@VIA
def test_rotary_tables(via):
    cos, sin = _rotary()
    _expect(via, r"rotary_sin is given but rotary_cos is not", rotary_sin=sin)
    _expect(via, r"rotary_cos is given but rotary_sin is not", rotary_cos=cos)
    _expect(via, r"\brotary_cos\b.*\[seqlen_ro, rotary_dim / 2\]", rotary_cos=cos[0], rotary_sin=sin[0])
    _expect(via, r"\brotary_sin\b.*dtype", rotary_cos=cos, rotary_sin=sin.double())
    _expect(via, r"rotary_sin has shape \[48, 4\] but rotary_cos has \[48, 8\]", rotary_cos=cos,
            rotary_sin=sin[:, :4])
    _expect(via, r"rotary_dim <= head_dim = 32", rotary_cos=_rotary(half=17)[0], rotary_sin=_rotary(half=17)[1])
    _expect(via, r"rotary_cos has 47 positions but the cache holds 48", rotary_cos=cos[:47], rotary_sin=sin[:47])
    _expect(via, r"rotary_cos/rotary_sin are given but k/v are not", rotary_cos=cos, rotary_sin=sin, k=None, v=None)
    _expect(via, r"rotary_cos.*contiguous", rotary_cos=_rotary(half=16)[0][:, ::2], rotary_sin=sin)


@VIA
def test_batch_idx_and_leftpad_shapes(via):
    two = seqlens_tensor([0, 1])
    _expect(via, r"cache_batch_idx has shape \[3\]; expected \[batch\] = \[2\]", cache_batch_idx=seqlens_tensor([0, 1, 2]))
    _expect(via, r"cache_leftpad must be a 1-D tensor, got shape \[2, 1\]", cache_leftpad=two[:, None])
    _expect(via, r"cache_batch_idx.*int32", cache_batch_idx=two.long())
    _expect(via, r"cache_batch_idx and block_table are both given", paged=True, cache_batch_idx=two)
    # Without cache_batch_idx the cache has one row per sequence.
    _expect(via, r"k_cache has batch size 3 but q has 2", k_cache=lambda a: torch.randn(3, 48, 2, 32),
            v_cache=lambda a: torch.randn(3, 48, 2, 32))


@VALUE_RULE_VIA
def test_batch_idx_values(via):
    bigger = dict(k_cache=lambda a: torch.randn(3, 48, 2, 32), v_cache=lambda a: torch.randn(3, 48, 2, 32))
    _expect(via, r"cache_batch_idx\[1\] is 3; expected a row of k_cache in \[0, 3\)",
            cache_batch_idx=seqlens_tensor([0, 3]), **bigger)
    _expect(via, r"cache_batch_idx\[1\] is 2, a row another sequence appends to as well",
            cache_batch_idx=seqlens_tensor([2, 2]), **bigger)


@VALUE_RULE_VIA
def test_leftpad_values(via):
    _expect(via, r"cache_leftpad\[0\] is -1", cache_leftpad=seqlens_tensor([-1, 0]))
    _expect(via, r"cache_leftpad\[1\] is 49; expected a key index in \[0, 48\]", cache_leftpad=seqlens_tensor([0, 49]))


@VALUE_RULE_VIA
def test_rotary_positions_past_the_tables(via):
    # Capacity 48 = the tables' rows; causal queries of sequence 1 sit at 45 + t, t < 3: 45..47 fit,
    # but with 3 queries over 2 new tokens at 46 the last query's position 48 does not.
    cos, sin = _rotary()
    _expect(via, r"sequence 1 needs the rotary position 48 but rotary_cos has 48 positions", rotary_cos=cos,
            rotary_sin=sin, cache_seqlens=seqlens_tensor([5, 46]))


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


@pytest.mark.parametrize("via,d", [("op", 12), ("op", 100), ("fake", 12), ("fake", 100),
                                   ("api", 264), ("op", 264), ("fake", 264)])
def test_unsupported_head_dim(via, d):
    """The op takes multiples of 8 up to 256; the public function pads the others (its test:
    tests/test_head_dims_cpu.py), so only a dim above 256 reaches it as an error."""
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


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8(dtype=E4M3, k_descale=True, v_descale=True):
    """Changes that make the valid call an FP8-cache call (with descales [2, 2] where asked)."""
    changes = dict(k_cache=lambda a: a["k_cache"].to(dtype), v_cache=lambda a: a["v_cache"].to(dtype))
    if k_descale:
        changes["k_descale"] = torch.full((2, 2), 0.5)
    if v_descale:
        changes["v_descale"] = torch.full((2, 2), 0.25)
    return changes


@VIA
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_valid_fp8_calls_succeed(via, paged, dtype):
    # The FP8 rules below each change one thing of these calls.
    a = _valid(paged)
    for name, change in _fp8(dtype).items():
        a[name] = change(a) if callable(change) else change
    out, lse = _call(via, a)
    assert out.shape == (2, 3, 4, 32) and out.dtype == torch.float32 and lse.shape == (2, 4, 3)


@VIA
@pytest.mark.parametrize("name", ["k_descale", "v_descale"])
def test_descale_with_a_16_bit_cache(via, name):
    _expect(via, rf"\b{name} is given but the caches have dtype float32", **{name: torch.ones(2, 2)})
    _expect(via, rf"\b{name} is given but the caches have dtype bfloat16", q=lambda a: a["q"].bfloat16(),
            k_cache=lambda a: a["k_cache"].bfloat16(), v_cache=lambda a: a["v_cache"].bfloat16(),
            k=lambda a: a["k"].bfloat16(), v=lambda a: a["v"].bfloat16(), **{name: torch.ones(2, 2)})


@VIA
@pytest.mark.parametrize("name", ["k_descale", "v_descale"])
def test_descale_shape_and_dtype(via, name):
    fp8 = _fp8()
    for bad in (torch.ones(2), torch.ones(2, 4), torch.ones(3, 2), torch.ones(2, 2, 1), torch.ones(1, 2)):
        _expect(via, rf"\b{name} has shape \[[\d, ]*\]; expected \[batch, kv_heads\] = \[2, 2\]",
                **dict(fp8, **{name: bad}))
    for bad in (torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2, dtype=torch.bfloat16),
                torch.ones(2, 2, dtype=torch.int32)):
        _expect(via, rf"\b{name} has dtype \w+; expected float32", **dict(fp8, **{name: bad}))


@VIA
def test_fp8_dtype_rules(via):
    # q and the new tokens stay 16-bit (or float32/float64 on CPU); only the caches may be FP8.
    _expect(via, r"\bq has dtype float8_e4m3fn", **dict(_fp8(), q=lambda a: a["q"].to(E4M3)))
    _expect(via, r"\bk has dtype float8_e4m3fn but q has float32", **dict(_fp8(), k=lambda a: a["k"].to(E4M3)))
    _expect(via, r"\bv has dtype float8_e5m2 but q has float32", **dict(_fp8(E5M2), v=lambda a: a["v"].to(E5M2)))
    # Both caches in one FP8 format.
    _expect(via, r"\bk_cache has dtype float8_e4m3fn but v_cache has float8_e5m2",
            **dict(_fp8(), v_cache=lambda a: a["v_cache"].to(E5M2)))
    _expect(via, r"\bk_cache has dtype float32 but v_cache has float8_e5m2",
            **dict(_fp8(k_descale=False, v_descale=False), k_cache=lambda a: a["k_cache"].float(),
                   v_cache=lambda a: a["v_cache"].to(E5M2)))


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
        fp8 = dict(k_cache=a["k_cache"].to(E4M3), v_cache=a["v_cache"].to(E4M3))
        expect(r"\bk_descale is on cpu but q is on cuda:0", **fp8, k_descale=torch.ones(2, 2))
        expect(r"\bv_descale is on cpu but q is on cuda:0", **fp8, v_descale=torch.ones(2, 2))
        expect(r"num_splits is 257", num_splits=257)
        expect(r"softcap must be a finite number >= 0", softcap=-0.5)
