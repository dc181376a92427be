"""Decoding over a KV cache: flash_attn_with_kvcache and the fake of fattn::decode.
Inference only: fattn::decode has no autograd (fattn/_forward_only.py refuses a backward)."""

from __future__ import annotations


import torch

from ._checks import (
    check_alibi_slopes, check_attention_dtype, check_finite, check_head_dim, check_head_groups, check_index_tensor,
    check_last_dim_contiguous, check_rank, check_same_device, check_same_dtype, check_sinks, check_softcap,
    check_window, dtype_name, fail, lse_dtype, shape_of,
)
from . import _forward_only, _head_dim
from ._arguments import flag, integer, real, window_pair
from ._library import load_library
from .fp8 import FP8_DTYPES, check_descale

load_library()
_decode_op = torch.ops.fattn.decode.default

MAX_SPLITS = 256


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    return_lse: bool = False,
    sinks: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
):
    """Attention of new query tokens over a KV cache (flash decoding; chunked prefill for longer
    query chunks), with flash-attn 2.8's parameters in its positional order (fattn's extras are
    keyword-only, after them). Inference only: it runs on inputs that require grad, and a
    backward that reaches its outputs raises.

    Args:
        q: [batch, seqlen_q, heads, head_dim], float16 or bfloat16 on CUDA. Any seqlen_q >= 1:
           up to 16 tokens run the split-K decoding tile, longer chunks a prefill-sized tile
           over the same (paged) cache. head_dim 1..256: one that is not a multiple of 8 is
           padded (fattn/_head_dim.py), which copies the caches, and copies them back when k/v
           are appended: keep to multiples of 8 where speed matters.
        k_cache, v_cache: [batch_cache, capacity, kv_heads, head_dim] (batch_cache = batch unless
           cache_batch_idx picks the rows), or with block_table a paged cache [num_pages,
           page_size, kv_heads, head_dim] (page_size a multiple of 16). Updated in place when k/v
           are given.
        k, v: optional new tokens [batch, seqlen_new, kv_heads, head_dim], written into the
           cache at positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before
           attending. cache_seqlens itself is not advanced: that is the caller's job.
        rotary_cos, rotary_sin: [seqlen_ro, rotary_dim / 2] in q's dtype (seqlen_ro >= the cache's
           capacity, rotary_dim <= head_dim): the rotary embedding, applied inside the call to the
           first rotary_dim features of the new keys (new key i at position cache_seqlens[b] + i,
           before the append) and of q (query t at cache_seqlens[b] + t when causal or with a
           window, at cache_seqlens[b] for every t otherwise), computed in fp32 and rounded to
           q's dtype (the keys to the cache's). Needs k and v.
        cache_seqlens: int32 [batch] (or an int, numpy ints too, for every sequence): keys already in each
           sequence's cache. None means every sequence fills its cache.
        cache_batch_idx: int32 [batch]: sequence b uses row cache_batch_idx[b] of a contiguous
           cache (rows must be distinct when appending). Not with block_table.
        cache_leftpad: int32 [batch]: sequence b's keys start at cache_leftpad[b]; keys before
           it are ignored. Masks and ALiBi keep the cache's positions.
        block_table: int32 [batch, pages_per_seq]: key j of sequence b lives in page
           block_table[b, j // page_size] at slot j % page_size.
        softmax_scale: default 1/sqrt(head_dim).
        causal: query t sees key j iff j <= t + seqlen_k - seqlen_q (bottom-right), the
           same as window_size=(left, 0).
        window_size: (left, right) sliding window; -1 is unbounded on that side.
        softcap: if > 0, scores become softcap * tanh(scores / softcap).
        rotary_interleaved: rotate pairs (2i, 2i + 1) (GPT-J) if True, (i, i + rotary_dim / 2)
           (GPT-NeoX) if False; ignored without rotary_cos.
        alibi_slopes: float32 [heads] or [batch, heads]: key j of query t gets
           -slope * |t + seqlen_k - seqlen_q - j| after the softcap, as in flash_attn_func.
        num_splits: split-K chunks per sequence on CUDA; 0 picks them from the shapes and
           the SM count. The grid never depends on cache_seqlens' values, so a decode step
           can be captured in a CUDA graph and replayed with new lengths.
        return_softmax_lse: also return lse, float32 [batch, heads, seqlen_q].
        return_lse: (keyword) the same, fattn's name for it elsewhere.
        sinks: (keyword) float32 [heads]: one logit per head in every row's denominator, as
           in flash_attn_func (counted once, whatever num_splits is).
        k_descale, v_descale: (keyword) float32 [batch, kv_heads], only with an FP8 cache:
           k_cache and v_cache both torch.float8_e4m3fn or both torch.float8_e5m2 (q, k and v
           stay float16/bfloat16; CUDA needs sm_89 or sm_90). A cache value of sequence b, KV
           head h stands for x_fp8 * descale[b, h] (b is the sequence, not its cache row:
           FlashAttention-3's convention); None means 1. New k/v (after the rotary embedding)
           are stored as x / descale rounded to nearest even, saturated to the format's largest
           finite value (fattn.quantize_fp8 makes such a cache and its descales).

    Returns:
        out [batch, seqlen_q, heads, head_dim] in q's dtype, or (out, lse). Rows that see
        no key give out = 0 and lse = -inf.

    On CUDA the device's values are not checked (that would need a host sync): an append
    past a sequence's capacity is dropped, out-of-range block_table or cache_batch_idx entries
    and rotary positions past rotary_cos are not detected (rotary positions are clamped to the
    table). The CPU implementation raises for each; on CUDA, FATTN_DEBUG_CHECKS=1 checks them on
    the device first and stops the call with a message.
    """
    fn = "flash_attn_with_kvcache"
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):  # one length for every sequence
        cache_seqlens = torch.full((q.shape[0],), integer(fn, "cache_seqlens", cache_seqlens, minimum=0),
                                   dtype=torch.int32, device=q.device)
    softmax_scale, softcap = real(fn, "softmax_scale", softmax_scale, allow_none=True), real(fn, "softcap", softcap)
    causal, rotary_interleaved = flag(fn, "causal", causal), flag(fn, "rotary_interleaved", rotary_interleaved)
    left, right = window_pair(fn, window_size)
    num_splits = integer(fn, "num_splits", num_splits)
    if k is not None:
        check_caches_can_take_the_append(k_cache, v_cache)
    padding = _head_dim.Padding(q, k_cache, v_cache, k, v)  # a head dim that is not a multiple of 8
    caches = padding.inputs(k_cache, v_cache)
    new_q, new_k, new_v = padding.inputs(q, k, v)

    def decode():
        return _decode_op(new_q, *caches, new_k, new_v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                          cache_leftpad, block_table, padding.scale(softmax_scale), causal, left, right, softcap,
                          rotary_interleaved, alibi_slopes, num_splits, sinks, k_descale, v_descale)

    out, lse = _forward_only.call(_NO_BACKWARD, decode, (q, k, v, rotary_cos, rotary_sin, alibi_slopes, sinks))
    if padding and k is not None:  # the append went to the padded copies
        for cache, padded in zip((k_cache, v_cache), caches):
            cache.copy_(padding.output(padded))
    out = padding.output(out)
    return (out, lse) if return_lse or return_softmax_lse else out


_NO_BACKWARD = ("fattn.flash_attn_with_kvcache has no backward (it is for inference): the gradient cannot reach "
                "its inputs; attend with flash_attn_func or flash_attn_varlen_func where gradients are needed")


# ---------------------------------------------------------------- fake

_OP = "fattn.decode"
_CACHE_LAYOUT = ("[batch, capacity, kv_heads, head_dim] (or [num_pages, page_size, kv_heads, head_dim] "
                 "with block_table)")


def _check_q(q):
    check_rank(_OP, "q", q, 4, "[batch, seqlen_q, heads, head_dim]")
    check_attention_dtype(_OP, "q", q)
    seqlen_q, head_dim = q.shape[1], q.shape[3]
    if seqlen_q < 1:
        fail(_OP, "q has seqlen ", seqlen_q, "; expected at least one query token per sequence")
    check_head_dim(_OP, head_dim)
    check_last_dim_contiguous(_OP, "q", q)


def _check_caches(q, k_cache, v_cache):
    fp8 = k_cache.dtype in FP8_DTYPES or v_cache.dtype in FP8_DTYPES
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(_OP, name, c, 4, _CACHE_LAYOUT)
        check_same_device(_OP, name, c, "q", q)
        if not fp8:
            check_same_dtype(_OP, name, c, "q", q)
        if c.shape[3] != q.shape[3]:
            fail(_OP, name, " has head_dim ", c.shape[3], " but q has ", q.shape[3])
        check_last_dim_contiguous(_OP, name, c)
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):
        fail(_OP, "v_cache has shape ", shape_of(v_cache), " but k_cache has ", shape_of(k_cache),
             "; they must have the same shape")
    check_head_groups(_OP, q.shape[2], k_cache.shape[2], "k_cache and v_cache")


def _check_fp8_caches(q, k_cache, v_cache, k_descale, v_descale):
    """decode_shape.cpp's check_fp8_caches: both caches in one FP8 dtype, descales only with them
    (common/fp8.cpp's check_descale: float32 [batch, kv_heads] on q's device)."""
    if (k_cache.dtype in FP8_DTYPES or v_cache.dtype in FP8_DTYPES) and k_cache.dtype != v_cache.dtype:
        fail(_OP, "k_cache has dtype ", dtype_name(k_cache.dtype), " but v_cache has ", dtype_name(v_cache.dtype),
             "; an FP8 KV cache has both caches in the same FP8 dtype (float8_e4m3fn or float8_e5m2)")
    batch, kv_heads = q.shape[0], k_cache.shape[2]
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            continue
        if k_cache.dtype not in FP8_DTYPES:
            fail(_OP, name, " is given but the caches have dtype ", dtype_name(k_cache.dtype), "; descale factors go ",
                 "with an FP8 KV cache (float8_e4m3fn or float8_e5m2)")
        check_descale(_OP, name, t, batch, kv_heads, 0, q)


def _check_row_indices(q, cache_batch_idx, cache_leftpad, block_table):
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            check_index_tensor(_OP, name, t, 1, q)
            if t.shape[0] != q.shape[0]:
                fail(_OP, name, " has shape ", shape_of(t), "; expected [batch] = [", q.shape[0], "]")
    if cache_batch_idx is not None and block_table is not None:
        fail(_OP, "cache_batch_idx and block_table are both given; cache_batch_idx picks rows of a contiguous cache, ",
             "with a paged cache block_table already says where each sequence lives")


def _check_layout(q, k_cache, block_table, cache_batch_idx):
    """The cache's capacity: keys a sequence can hold."""
    batch = q.shape[0]
    if block_table is None:
        if cache_batch_idx is None and k_cache.shape[0] != batch:
            fail(_OP, "k_cache has batch size ", k_cache.shape[0], " but q has ", batch,
                 " (a paged cache needs block_table; a cache with other rows, cache_batch_idx)")
        if cache_batch_idx is not None and k_cache.shape[0] == 0 and batch > 0:
            fail(_OP, "k_cache has no rows for cache_batch_idx to pick")
        return k_cache.shape[1]
    check_index_tensor(_OP, "block_table", block_table, 2, q)
    if block_table.shape[0] != batch:
        fail(_OP, "block_table has shape ", shape_of(block_table), "; expected [batch, pages_per_seq] with batch ",
             batch)
    if block_table.stride(1) != 1:
        fail(_OP, "block_table must have a contiguous last dim (stride 1)")
    page_size = k_cache.shape[1]
    if page_size < 16 or page_size % 16 != 0:
        fail(_OP, "page_size (k_cache.size(1) with block_table) is ", page_size, "; expected a multiple of 16")
    return block_table.shape[1] * page_size


def _check_new_tokens(q, k_cache, k, v, cache_seqlens, capacity):
    if (k is None) != (v is None):
        fail(_OP, "k is given but v is not" if k is not None else "v is given but k is not",
             "; pass both new keys and new values, or neither")
    if k is not None:
        batch, kv_heads, head_dim = q.shape[0], k_cache.shape[2], q.shape[3]
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 4 or t.shape[0] != batch or t.shape[2] != kv_heads or t.shape[3] != head_dim:
                fail(_OP, name, " has shape ", shape_of(t), "; expected [batch, seqlen_new, kv_heads, head_dim] = [",
                     batch, ", seqlen_new, ", kv_heads, ", ", head_dim, "]")
            check_same_device(_OP, name, t, "q", q)
            check_same_dtype(_OP, name, t, "q", q)
            check_last_dim_contiguous(_OP, name, t)
        if v.shape[1] != k.shape[1]:
            fail(_OP, "v has ", v.shape[1], " new tokens but k has ", k.shape[1])
        if k.shape[1] > capacity:
            fail(_OP, "k has ", k.shape[1], " new tokens, more than the cache holds (capacity ", capacity, ")")
        if cache_seqlens is None:
            fail(_OP, "k and v are given but cache_seqlens is not: it says where the new tokens go")
    if cache_seqlens is not None:
        check_index_tensor(_OP, "cache_seqlens", cache_seqlens, 1, q)
        if cache_seqlens.shape[0] != q.shape[0]:
            fail(_OP, "cache_seqlens has shape ", shape_of(cache_seqlens), "; expected [batch] = [", q.shape[0], "]")


def _check_rotary(q, rotary_cos, rotary_sin, k, capacity):
    if (rotary_cos is None) != (rotary_sin is None):
        fail(_OP, "rotary_cos is given but rotary_sin is not" if rotary_cos is not None
             else "rotary_sin is given but rotary_cos is not", "; pass both, or neither")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        check_rank(_OP, name, t, 2, "[seqlen_ro, rotary_dim / 2]")
        check_same_device(_OP, name, t, "q", q)
        check_same_dtype(_OP, name, t, "q", q)
        check_last_dim_contiguous(_OP, name, t)
    if tuple(rotary_sin.shape) != tuple(rotary_cos.shape):
        fail(_OP, "rotary_sin has shape ", shape_of(rotary_sin), " but rotary_cos has ", shape_of(rotary_cos),
             "; they must have the same shape")
    rotary_dim, head_dim = 2 * rotary_cos.shape[1], q.shape[3]
    if rotary_dim < 2 or rotary_dim > head_dim:
        fail(_OP, "rotary_cos has shape ", shape_of(rotary_cos), "; expected [seqlen_ro, rotary_dim / 2] with 2 <= ",
             "rotary_dim <= head_dim = ", head_dim)
    if rotary_cos.shape[0] < capacity:
        fail(_OP, "rotary_cos has ", rotary_cos.shape[0], " positions but the cache holds ", capacity,
             " keys per sequence; expected at least as many positions as the cache's capacity")
    if k is None:
        fail(_OP, "rotary_cos/rotary_sin are given but k/v are not; the rotary embedding is applied to q and to ",
             "the new keys as they are appended, so pass the new k and v")


def _check_writable_caches(k_cache, v_cache):
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        for d in range(c.dim()):
            if c.shape[d] > 1 and c.stride(d) == 0:
                fail(_OP, name, " is an expanded view (stride 0 along dim ", d, "): its rows alias, so the new ",
                     "tokens cannot be appended in place; pass a cache with its own memory")


def check_caches_can_take_the_append(k_cache, v_cache):
    """What only Python sees of a cache written in place: autograd and inference mode would
    refuse the write after part of it was done, so refuse the call before any write."""
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.requires_grad:
            fail(_OP, name, " requires grad; the append writes it in place, which autograd cannot track: "
                 "pass a cache that does not require grad (e.g. allocated under torch.no_grad())")
        # (dynamo cannot trace is_inference(); compiled code does not meet inference tensors)
        if not torch.compiler.is_compiling() and c.is_inference() and not torch.is_inference_mode_enabled():
            fail(_OP, name, " was created under torch.inference_mode(); appending to it in place is only "
                 "allowed inside inference mode")


def _check_scalars(q, softmax_scale, window_left, window_right, softcap, num_splits, alibi_slopes, sinks):
    check_finite(_OP, "softmax_scale", softmax_scale)
    check_window(_OP, window_left, window_right)
    check_softcap(_OP, softcap)
    check_alibi_slopes(_OP, alibi_slopes, q, q.shape[0], q.shape[2])
    check_sinks(_OP, sinks, q, q.shape[2])
    if num_splits < 0 or num_splits > MAX_SPLITS:
        fail(_OP, "num_splits is ", num_splits, f"; expected 0 (automatic) or 1 to {MAX_SPLITS}")


@torch.library.register_fake("fattn::decode")
def _decode_fake(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                 cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                 window_left=-1, window_right=-1, softcap=0.0, rotary_interleaved=True, alibi_slopes=None,
                 num_splits=0, sinks=None, k_descale=None, v_descale=None):
    _check_q(q)
    _check_caches(q, k_cache, v_cache)
    _check_fp8_caches(q, k_cache, v_cache, k_descale, v_descale)
    _check_row_indices(q, cache_batch_idx, cache_leftpad, block_table)
    capacity = _check_layout(q, k_cache, block_table, cache_batch_idx)
    _check_new_tokens(q, k_cache, k, v, cache_seqlens, capacity)
    _check_rotary(q, rotary_cos, rotary_sin, k, capacity)
    if k is not None:
        _check_writable_caches(k_cache, v_cache)
    _check_scalars(q, softmax_scale, window_left, window_right, softcap, num_splits, alibi_slopes, sinks)
    # The append mutates the caches in place (declared in the schema); the outputs are
    # fresh and contiguous.
    batch, seqlen_q, heads, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, heads, head_dim))
    return out, q.new_empty((batch, heads, seqlen_q), dtype=lse_dtype(q.dtype))
