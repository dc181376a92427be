"""Launches the attention kernels from Python, through their specs (triton_src/spec.py), with the
arguments csrc/attention/forward_cuda.cpp and backward_cuda.cpp pass: for Triton's interpreter
(tests/interpret_attention_kernels.py) and the JIT tile searches (tuning/tune*.py).

The score encoding (qk_scale, softcap_log2) is csrc/attention/attention_variant.cpp's
kernel_scores; the strides are csrc/attention/kernel_layout.h's row_strides and lse_strides.
Tile sizes and launch options are arguments, since choosing them is what the searches do.

Import this module after TRITON_INTERPRET is set (or not): Triton picks the interpreter when
the kernels are decorated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from triton_src.backward import ATTN_BWD_DKDV, ATTN_BWD_DQ, ATTN_BWD_PREPROCESS
from triton_src.forward import ATTN_FWD
from triton_src.segments import SEGMENT_SPANS
from triton_src.spec import MAPS_FLAG, map_layout, tensor_strides
from triton_src.variants import score_mod_value

LOG2E = math.log2(math.e)


@dataclass(frozen=True)
class Tiles:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 1


@dataclass(frozen=True)
class Variant:
    """The attention variant, with flash-attn's meanings. alibi: float32 (heads) or (batch, heads);
    alibi_offset: added to the query positions in ALiBi's distance (the attention kernels' argument);
    segments: (q_segment_ids, kv_segment_ids), int32 [batch, seqlen] (dense layout only);
    sinks: float32 [heads] (forward kernels only: the backward reads them through the lse);
    bias: [batch | 1, heads | 1, seqlen_q | 1, seqlen_k] in q's dtype, keys contiguous (dense layout
    only); dropout_p with dropout_seed, an int64 [1] tensor."""
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: torch.Tensor | None = None
    alibi_offset: int = 0
    segments: tuple[torch.Tensor, torch.Tensor] | None = None
    sinks: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    dropout_p: float = 0.0
    dropout_seed: torch.Tensor | None = None

    def span_args(self, tile: int, over_keys: bool, device) -> dict:
        """SegmentSpans for tiles of `tile` rows of the queries (or, over_keys, of the keys), as
        csrc/attention/segment_spans.cpp computes them; a placeholder without segment ids."""
        if self.segments is None:
            return dict(SegmentSpans=torch.zeros(1, dtype=torch.int32, device=device), stride_spanb=0)
        own, other = self.segments[::-1] if over_keys else self.segments
        batch, seqlen_own = own.shape
        tiles = triton.cdiv(seqlen_own, tile)
        spans = torch.full((batch, tiles, 4), -7, dtype=torch.int32, device=device)  # every element is written
        if tiles:
            SEGMENT_SPANS.launch((tiles, batch), num_warps=4, num_stages=1, BLOCK=1024, OwnIds=own, OtherIds=other,
                                 Spans=spans, stride_ownb=own.stride(0), stride_otherb=other.stride(0),
                                 stride_spanb=spans.stride(0), seqlen_own=seqlen_own,
                                 seqlen_other=other.shape[1], tile=tile)
        return dict(SegmentSpans=spans, stride_spanb=spans.stride(0))

    def sink_args(self, device) -> dict:
        sinks = self.sinks if self.sinks is not None else torch.zeros(1, device=device)
        return dict(Sinks=sinks, use_sinks=int(self.sinks is not None))

    def args(self, head_dim: int, device) -> tuple[dict, float]:
        """(the kernels' variant arguments by name, the softmax scale)."""
        scale = 1 / math.sqrt(head_dim)
        left, right = self.window
        alibi = self.alibi
        slopes = alibi if alibi is not None else torch.zeros(1, device=device)
        unused = torch.zeros(1, dtype=torch.int32, device=device)
        q_seg, kv_seg = self.segments if self.segments is not None else (unused, unused)
        return dict(
            QSegmentIds=q_seg, KvSegmentIds=kv_seg, stride_qsegb=q_seg.stride(0), stride_kvsegb=kv_seg.stride(0),
            use_segments=int(self.segments is not None),
            window_left=left, window_right=0 if self.causal else right,
            Alibi=slopes, stride_alibib=alibi.stride(0) if alibi is not None and alibi.dim() == 2 else 0,
            stride_alibih=slopes.stride(-1), use_alibi=int(alibi is not None), alibi_offset=self.alibi_offset,
            qk_scale=scale / self.softcap if self.softcap > 0 else scale * LOG2E,
            softcap_log2=self.softcap * LOG2E if self.softcap > 0 else 0.0,
            **self._bias_args(device), **self._dropout_args(device)), scale

    def _bias_args(self, device) -> dict:
        bias = self.bias if self.bias is not None else torch.zeros(1, 1, 1, 1, device=device)
        strides = {f"stride_bias{d}": bias.stride(i) if bias.shape[i] > 1 else 0 for i, d in enumerate("bhq")}
        return dict(Bias=bias, **strides, use_bias=int(self.bias is not None))

    def _dropout_args(self, device) -> dict:
        threshold = dropout_threshold(self.dropout_p)
        seed = self.dropout_seed if threshold else torch.zeros(1, dtype=torch.int64, device=device)
        return dict(DropoutSeed=seed, dropout_threshold=threshold, dropout_scale=65536 / (65536 - threshold))

    @property
    def score_mod(self) -> int:
        """The SCORE_MOD variant (triton_src/variants.py), as csrc/attention/attention_variant.h's
        score_mod() picks it."""
        if self.bias is not None or self.dropout_p > 0:
            return score_mod_value("bias_dropout")
        return score_mod_value("softcap_alibi" if self.softcap > 0 or self.alibi is not None else "plain")


def use_torch_scratch() -> None:
    """Triton's JIT launches of this process take their global scratch (where the Gluon kernels
    build their TMA descriptors) from torch's allocator, on the current device."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def dropout_threshold(p: float) -> int:
    """csrc/attention/dropout.cpp's rule: a key is dropped when its 16-bit draw is below
    round(p * 2**16), at most 2**16 - 1."""
    return min(round(p * 65536), 65535)


@dataclass(frozen=True)
class Packing:
    """Packed (varlen) sequences: rows [cu_q[b], cu_q[b + 1]) of q, likewise k; seqused_k optional."""
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    seqused_k: torch.Tensor | None = None


def rows(tag: str, t: torch.Tensor) -> dict:
    """Row strides: a packed [total, heads, dim] tensor has batch stride 0."""
    if t.dim() == 4:
        return tensor_strides(tag, t)
    return {f"stride_{tag}b": 0, f"stride_{tag}s": t.stride(0), f"stride_{tag}h": t.stride(1)}


def _problem(q, k, packing):
    """(batch, seqlen_q, seqlen_k, lse shape, layout arguments)."""
    if packing is None:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        unused = torch.zeros(1, dtype=torch.int32, device=q.device)
        lse_shape = (batch, q.shape[2], seqlen_q)
        layout = dict(stride_lseb=q.shape[2] * seqlen_q, stride_lseh=seqlen_q, CuSeqlensQ=unused,
                      CuSeqlensK=unused, SequsedK=unused, use_cu_seqlens=0, use_seqused_k=0)
        return batch, seqlen_q, seqlen_k, lse_shape, layout
    used = packing.seqused_k
    layout = dict(stride_lseb=0, stride_lseh=q.shape[0], CuSeqlensQ=packing.cu_seqlens_q,
                  CuSeqlensK=packing.cu_seqlens_k, SequsedK=used if used is not None else packing.cu_seqlens_k,
                  use_cu_seqlens=1, use_seqused_k=int(used is not None))
    return (packing.cu_seqlens_q.numel() - 1, packing.max_seqlen_q, packing.max_seqlen_k, (q.shape[1], q.shape[0]),
            layout)


def _shape(q, k, seqlen_q, seqlen_k):
    head_dim = q.shape[-1]
    block_d = triton.next_power_of_2(head_dim)
    return (dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, kv_group_size=q.shape[-2] // k.shape[-2], head_dim=head_dim),
            dict(BLOCK_D=block_d, PAD_D=block_d != head_dim))


def host_maps(spec, tensors: dict, constants: dict) -> dict:
    """The host-made TMA maps a HOST_MAPS variant of `spec` takes (its map-able tensors, from
    `tensors` by name: dense [batch, seqlen, heads, head_dim]), boxes as the spec gives them for
    `constants`: what csrc/runtime/tensor_maps.cpp encodes for the op."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    maps = {}
    for param in spec.maps:
        t = tensors[param.name]
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}[t.dtype]
        maps[param.name] = TensorDescriptor(t, list(t.shape), list(t.stride()), spec.map_box(param, constants),
                                            map_layout(dtype, constants["BLOCK_D"]))
    return maps


def _use_maps(spec, arguments: dict, tensors: dict, dense: bool) -> None:
    """Turns `arguments` into those of `spec`'s HOST_MAPS variant: the flag set and each map-able
    tensor (from `tensors`) given as its host-made map, boxes from the arguments' constexprs."""
    if not dense or not spec.maps:
        raise ValueError(f"maps=True: {spec.name} takes maps of dense tensors"
                         + ("" if spec.maps else f", and {spec.name} takes none"))
    arguments[MAPS_FLAG] = True
    arguments.update(host_maps(spec, tensors, arguments))


def forward(q, k, v, tiles: Tiles, variant: Variant = Variant(), packing: Packing | None = None, spec=ATTN_FWD,
            programs: int | None = None, replace: dict | None = None, maps: bool = False):
    """(out, lse) of attn_fwd, or of another kernel with its arguments (`spec`: the Hopper
    forward). Dense outputs start as NaN (every element must be written); packed ones as zeros,
    as the op allocates them (rows outside every sequence are not written). `programs`: that
    many programs per (head, batch) instead of one per query tile, for a kernel whose spec
    loops over tiles (the op picks its own number: csrc/attention/query_tile_programs.cpp).
    `replace`: kernel arguments by name that take the place of the computed ones (a study's
    buffer in an argument its variant does not read). `maps`: the HOST_MAPS variant, Q, K, V and
    Out given as host-made maps (dense 16-bit calls; the Hopper kernel's)."""
    if programs is not None and not (spec.loops_over_tiles and programs >= 1):
        raise ValueError(f"programs={programs}: {spec.name} "
                         + ("takes one or more" if spec.loops_over_tiles else "runs one query tile per program"))
    batch, seqlen_q, seqlen_k, lse_shape, layout = _problem(q, k, packing)
    dense = packing is None
    lse = torch.full(lse_shape, float("nan") if dense else 0.0, device=q.device)
    out = torch.full_like(q, float("nan")) if dense else torch.zeros_like(q)
    shape, head = _shape(q, k, seqlen_q, seqlen_k)
    variant_args, _ = variant.args(q.shape[-1], q.device)
    tiles_m = triton.cdiv(seqlen_q, tiles.block_m)
    arguments = dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, SCORE_MOD=variant.score_mod,
                     TILE_LOOP=spec.loops_over_tiles, **head, Q=q, K=k, V=v, Out=out, Lse=lse, **rows("q", q),
                     **rows("k", k), **rows("v", v), **rows("o", out), **layout, **shape, **variant_args,
                     **variant.sink_args(q.device), **variant.span_args(tiles.block_m, False, q.device),
                     **_without_fp8(lse))
    if maps:
        _use_maps(spec, arguments, {"Q": q, "K": k, "V": v, "Out": out}, dense)
    arguments.update(replace or {})
    spec.launch((tiles_m if programs is None else min(programs, tiles_m), q.shape[-2], batch),
                num_warps=tiles.num_warps, num_stages=tiles.num_stages, **arguments)
    return out, lse


def _without_fp8(placeholder) -> dict:
    """attn_fwd's FP8 arguments for 16-bit inputs (FP8 0): never read."""
    return dict(FP8=0, QDescale=placeholder, KDescale=placeholder, VDescale=placeholder, stride_qdescaleb=0,
                stride_qdescaleh=0, stride_kdescaleb=0, stride_kdescaleh=0, stride_vdescaleb=0, stride_vdescaleh=0,
                q_descale_group=1, p_scale=1.0, stride_vd=0)


def backward_preprocess(out, dout, lse, dlse, tiles: Tiles, packing: Packing | None = None):
    """delta = rowsum(dout * out) - dlse, in the lse's layout (dlse may be None)."""
    batch, seqlen_q, _, _, layout = _problem(out, out, packing)
    head_dim = out.shape[-1]
    block_d = triton.next_power_of_2(head_dim)
    delta = torch.full_like(lse, float("nan"))
    ATTN_BWD_PREPROCESS.launch((triton.cdiv(seqlen_q, tiles.block_m), out.shape[-2], batch),
                               num_warps=tiles.num_warps, num_stages=tiles.num_stages, BLOCK_M=tiles.block_m,
                               BLOCK_D=block_d, PAD_D=block_d != head_dim, HAS_DLSE=dlse is not None, Out=out,
                               DO=dout, DLse=dlse if dlse is not None else lse, Delta=delta, **rows("o", out),
                               **rows("do", dout), stride_lseb=layout["stride_lseb"],
                               stride_lseh=layout["stride_lseh"], CuSeqlensQ=layout["CuSeqlensQ"],
                               use_cu_seqlens=layout["use_cu_seqlens"], seqlen_q=seqlen_q, head_dim=head_dim)
    return delta


def _gradient_args(q, k, v, dout, lse, delta, variant, packing, tiles):
    batch, seqlen_q, seqlen_k, _, layout = _problem(q, k, packing)
    shape, head = _shape(q, k, seqlen_q, seqlen_k)
    variant_args, scale = variant.args(q.shape[-1], q.device)
    args = dict(Q=q, K=k, V=v, DO=dout, Lse=lse, Delta=delta, **rows("q", q), **rows("k", k), **rows("v", v),
                **rows("do", dout), **layout, **shape, **variant_args, softmax_scale=scale, BLOCK_M=tiles.block_m,
                BLOCK_N=tiles.block_n, SCORE_MOD=variant.score_mod, **head)
    return batch, seqlen_q, seqlen_k, args


def _new_gradient(t, packing):
    # Packed gradients start zeroed, as the op allocates them (rows past seqused_k are not written).
    return torch.zeros_like(t) if packing is not None else torch.full_like(t, float("nan"))


def backward_dkdv(q, k, v, dout, lse, delta, tiles: Tiles, variant: Variant = Variant(),
                  packing: Packing | None = None, want_dbias: bool = False, spec=ATTN_BWD_DKDV,
                  accumulate_dq: bool = False, maps: bool = False):
    """(dk, dv) of attn_bwd_dkdv (or of another kernel with its arguments, `spec`); (dk, dv,
    dbias) with want_dbias (dbias: dS, [batch, heads, seqlen_q, seqlen_k] float32, zero-filled as
    the op allocates it); dq appended with accumulate_dq (ACCUMULATE_DQ: the kernel adds dQ into
    a zeroed float32 accumulator, converted to q's dtype here as the op does). `maps`: the
    HOST_MAPS variant, Q, K, V and dO given as host-made maps (dense 16-bit calls; the Hopper
    kernel's)."""
    batch, seqlen_q, seqlen_k, args = _gradient_args(q, k, v, dout, lse, delta, variant, packing, tiles)
    if maps:
        _use_maps(spec, args, {"Q": q, "K": k, "V": v, "DO": dout}, packing is None)
    dk, dv = _new_gradient(k, packing), _new_gradient(v, packing)
    shape = (batch, q.shape[-2], seqlen_q, seqlen_k) if want_dbias else (1, 1, 1, 1)
    dbias = torch.zeros(shape, dtype=torch.float32, device=q.device)
    dq_accum = torch.zeros(q.shape if accumulate_dq else (1,) * q.dim(), dtype=torch.float32, device=q.device)
    spec.launch((triton.cdiv(seqlen_k, tiles.block_n), k.shape[-2], batch), num_warps=tiles.num_warps,
                num_stages=tiles.num_stages, **args, DK=dk, DV=dv, **rows("dk", dk), **rows("dv", dv),
                DBias=dbias, stride_dbiasb=dbias.stride(0), stride_dbiash=dbias.stride(1),
                stride_dbiasq=dbias.stride(2), write_dbias=int(want_dbias),
                DQAccum=dq_accum, **rows("dqa", dq_accum), ACCUMULATE_DQ=accumulate_dq,
                **variant.span_args(tiles.block_n, True, q.device))
    grads = (dk, dv, dbias) if want_dbias else (dk, dv)
    return (*grads, dq_accum.to(q.dtype)) if accumulate_dq else grads


def backward_dq(q, k, v, dout, lse, delta, tiles: Tiles, variant: Variant = Variant(),
                packing: Packing | None = None, spec=ATTN_BWD_DQ, maps: bool = False):
    """dq of attn_bwd_dq, or of another kernel with its arguments (`spec`: the Hopper dQ).
    `maps`: the HOST_MAPS variant, Q, K, V, dO and dQ given as host-made maps (dense 16-bit
    calls; the Hopper kernel's)."""
    batch, seqlen_q, _, args = _gradient_args(q, k, v, dout, lse, delta, variant, packing, tiles)
    dq = _new_gradient(q, packing)
    args.update(DQ=dq, **rows("dq", dq))
    if maps:
        _use_maps(spec, args, {"Q": q, "K": k, "V": v, "DO": dout, "DQ": dq}, packing is None)
    spec.launch((triton.cdiv(seqlen_q, tiles.block_m), q.shape[-2], batch), num_warps=tiles.num_warps,
                num_stages=tiles.num_stages, **args, **variant.span_args(tiles.block_m, False, q.device))
    return dq


@dataclass(frozen=True)
class DecodeTiles:
    """attn_decode_split's row and key tiles and launch options; the merge's chunk of splits."""
    block_m: int
    block_n: int
    block_s: int
    num_warps: int = 4
    num_stages: int = 1


@dataclass(frozen=True)
class Rotary:
    """The rotary embedding of a decode step: tables [seqlen_ro, rotary_dim / 2], the layout, and
    whether each query token has its own position (causal or local masks)."""
    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool
    per_token: bool


def _kv_fp8(cache) -> int:
    """The decode kernels' KV_FP8 flag of a cache: fp8_flag's values (csrc/common/fp8.h)."""
    return {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}.get(cache.dtype, 0)


def _descale_args(tag, descale, placeholder):
    """KDescale/VDescale, their (batch, kv head) strides and use flag; a placeholder when None."""
    if descale is None:
        return {f"{tag.upper()}Descale": placeholder, f"stride_{tag.lower()}db": 0, f"stride_{tag.lower()}dh": 0,
                f"use_{tag.lower()}_descale": 0}
    return {f"{tag.upper()}Descale": descale, f"stride_{tag.lower()}db": descale.stride(0),
            f"stride_{tag.lower()}dh": descale.stride(1), f"use_{tag.lower()}_descale": 1}


def decode(q, k_cache, v_cache, cache_seqlens, block_table, splits: int, tiles: DecodeTiles,
           variant: Variant = Variant(), k_new=None, v_new=None, rotary: Rotary | None = None,
           cache_batch_idx=None, cache_leftpad=None, wide: int = 0, k_descale=None, v_descale=None):
    """(out, lse) of one decode step as csrc/decode/decode_cuda.cpp runs it: kv_append when there
    are new tokens (written into the cache in place), attn_decode_split, then attn_decode_merge
    when there is more than one split. Outputs and partials start as NaN. `wide`: the split
    kernel's WIDE flag (0 decoding tile; 1, 2 the chunked-prefill pass without / with the
    softcap and ALiBi code). An FP8 cache (float8_e4m3fn / float8_e5m2) runs the KV_FP8 variants
    with k_descale / v_descale (float32 [batch, kv_heads], None: 1)."""
    from triton_src.decode import ATTN_DECODE_MERGE, ATTN_DECODE_SPLIT, KV_APPEND, ROTATE_QUERIES

    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    paged = block_table is not None
    page_size = k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    seqlen_new = 0 if k_new is None else k_new.shape[1]
    launch = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    cache = dict(KCache=k_cache, VCache=v_cache, CacheSeqlens=cache_seqlens,
                 BlockTable=block_table if paged else cache_seqlens,  # any int32 tensor: never read when not paged
                 stride_tb=block_table.stride(0) if paged else 0, page_size=page_size, capacity=capacity,
                 **tensor_strides("k", k_cache), **tensor_strides("v", v_cache),
                 CacheBatchIdx=cache_seqlens if cache_batch_idx is None else cache_batch_idx,
                 use_batch_idx=int(cache_batch_idx is not None))
    kv_fp8 = _kv_fp8(k_cache)
    one = torch.ones(1, device=q.device)  # the placeholder of a descale not given (never read)
    descales = dict(**_descale_args("k", k_descale, one), **_descale_args("v", v_descale, one))
    rotary_args = dict(RotaryCos=q, RotarySin=q, stride_ro=0, seqlen_ro=0, rotary_dim=0, rotary_interleaved=0)
    if rotary is not None:
        rotary_args = dict(RotaryCos=rotary.cos, RotarySin=rotary.sin, stride_ro=rotary.cos.stride(0),
                           seqlen_ro=rotary.cos.shape[0], rotary_dim=2 * rotary.cos.shape[1],
                           rotary_interleaved=int(rotary.interleaved))
    _, head = _shape(q, k_cache, seqlen_q, capacity)
    if seqlen_new:
        KV_APPEND.launch((seqlen_new, kv_heads, batch), **launch, **cache, **head, **rotary_args, PAGED=paged,
                         KV_FP8=kv_fp8, **descales, KNew=k_new, VNew=v_new, head_dim=head_dim,
                         **tensor_strides("nk", k_new), **tensor_strides("nv", v_new))
    if rotary is not None:  # q rotated into a contiguous copy, as the op does
        q_rot = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
        ROTATE_QUERIES.launch((seqlen_q, heads, batch), num_warps=1, num_stages=1, **head, **rotary_args, Q=q,
                              QRot=q_rot, CacheSeqlens=cache_seqlens, **tensor_strides("q", q), seqlen_q=seqlen_q,
                              num_heads=heads, head_dim=head_dim, rotary_per_token=int(rotary.per_token))
        q = q_rot
    row_tiles = triton.cdiv(seqlen_q * (heads // kv_heads), tiles.block_m)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, heads, seqlen_q), float("nan"), device=q.device)
    part_out = torch.full((splits, batch, seqlen_q, heads, head_dim), float("nan"), device=q.device)
    part_lse = torch.full((splits, batch, heads, seqlen_q), float("nan"), device=q.device)
    variant_args, _ = variant.args(head_dim, q.device)
    scores = {name: variant_args[name] for name in ("window_left", "window_right", "Alibi", "stride_alibib",
                                                     "stride_alibih", "use_alibi", "qk_scale", "softcap_log2")}
    ATTN_DECODE_SPLIT.launch(
        (splits, kv_heads * row_tiles, batch), **launch, **cache, **head, PAGED=paged, WIDE=wide, KV_FP8=kv_fp8,
        # decode_cuda.cpp's choice (page_tiles_fit): one page lookup per key tile where pages hold
        # whole tiles and a page's keys lie within 32-bit offsets
        PAGE_TILES=paged and not kv_fp8 and page_size % tiles.block_n == 0
        and page_size * max(k_cache.stride(1), v_cache.stride(1), kv_heads * head_dim) + head_dim <= 2**31 - 1,
        **descales,
        CacheLeftpad=cache_seqlens if cache_leftpad is None else cache_leftpad,
        use_leftpad=int(cache_leftpad is not None),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, Q=q, PartOut=part_out, PartLse=part_lse, Out=out, Lse=lse, **tensor_strides("q", q),
        seqlen_q=seqlen_q, num_heads=heads, kv_group_size=heads // kv_heads, head_dim=head_dim,
        seqlen_new=seqlen_new, num_splits=splits, **scores, **variant.sink_args(q.device))
    if splits > 1:
        ATTN_DECODE_MERGE.launch(
            (seqlen_q, heads, batch), num_warps=4, num_stages=1, **head, BLOCK_S=tiles.block_s, PartOut=part_out,
            PartLse=part_lse, Out=out, Lse=lse, num_rows=batch * seqlen_q * heads, num_splits=splits,
            seqlen_q=seqlen_q, num_heads=heads, head_dim=head_dim)
    return out, lse
