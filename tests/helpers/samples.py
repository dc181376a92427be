"""One sample_inputs generator per op: the calls that opcheck, the fake-vs-real comparison
and the forward's gradient checks run on every device (tests/test_op_samples.py).

A generator takes (device, dtype) and yields Sample(name, args), args being the op's
positional arguments in its schema's order, made of fresh random tensors. Shapes stay
small so that finite differences in float64 stay quick. Together the forward samples
cover GQA and MQA, seqlen_q above and below seqlen_k, causal rows that see no key,
strided views, an explicit softmax scale, empty sequences, sliding windows (rows outside
every window), softcaps and ALiBi slopes of both shapes, alone and composed; the backward samples the
same with and without dlse and with a strided dout; the decode samples every cache
layout, paging, the append, windows, softcap, split counts and sequences with no key, and FP8
caches with and without descales (where the device has FP8 kernels); the
merge samples partials and rows that saw no key, strided inputs and an empty batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fattn  # noqa: F401  (loads the library that defines torch.ops.fattn)

from .common import expected_lse_dtype, make_qkv
from .kvcache import KVCache, new_tokens, seqlens_tensor

FORWARD = torch.ops.fattn.forward.default
BACKWARD = torch.ops.fattn.backward.default
DECODE = torch.ops.fattn.decode.default
MERGE = torch.ops.fattn.merge_attention_states.default
VARLEN_FORWARD = torch.ops.fattn.varlen_forward.default
VARLEN_BACKWARD = torch.ops.fattn.varlen_backward.default


@dataclass
class Sample:
    name: str
    args: tuple


# name, (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim), layout, softmax_scale, causal[,
# variant: window (left, right), softcap, alibi "heads" ([heads] slopes) or "batch" ([batch, heads]),
# alibi_offset (ALiBi's distances shifted, as a ring attention piece has them), ...]
FORWARD_CASES = [
    ("gqa2", (2, 5, 7, 4, 2, 8), "contiguous", None, False),
    ("gqa2-causal", (2, 5, 7, 4, 2, 8), "contiguous", None, True),
    ("sq9-sk4", (1, 9, 4, 2, 2, 8), "contiguous", None, False),
    ("sq9-sk4-causal-rows-without-keys", (1, 9, 4, 2, 2, 8), "contiguous", None, True),
    ("mqa-d16", (1, 6, 6, 3, 1, 16), "contiguous", None, False),
    ("mqa-d16-causal", (1, 6, 6, 3, 1, 16), "contiguous", None, True),
    ("sq4-sk9", (2, 4, 9, 2, 2, 8), "contiguous", None, False),
    ("sq4-sk9-causal", (2, 4, 9, 2, 2, 8), "contiguous", None, True),
    ("scale0.25", (2, 9, 11, 4, 2, 16), "contiguous", 0.25, False),
    ("scale0.25-causal", (2, 9, 11, 4, 2, 16), "contiguous", 0.25, True),
    ("strided-scale0.7-causal", (1, 5, 7, 4, 2, 8), "strided", 0.7, True),
    ("strided-gqa2-d40-causal", (1, 7, 9, 6, 3, 40), "strided", None, True),
    # Head dims of the Hopper forward's split buckets (96: 64 + 32 columns, 192: 128 + 64).
    ("strided-d72-causal", (1, 7, 9, 4, 2, 72), "strided", None, True),
    ("d160-softcap", (1, 5, 9, 2, 1, 160), "contiguous", None, False, dict(softcap=2.0)),
    ("seqlen_q0", (2, 0, 5, 2, 2, 16), "contiguous", None, False),
    ("seqlen_k0-causal", (1, 3, 0, 2, 2, 16), "contiguous", None, True),
    ("window3-1", (2, 9, 11, 4, 2, 8), "contiguous", None, False, dict(window=(3, 1))),
    ("window0-0-rows-without-keys", (1, 12, 5, 2, 2, 8), "contiguous", None, False, dict(window=(0, 0))),
    ("window2-causal-softcap", (1, 7, 7, 2, 1, 16), "contiguous", None, True, dict(window=(2, 5), softcap=1.5)),
    ("softcap0.5-gqa2", (2, 5, 7, 4, 2, 8), "contiguous", 0.9, False, dict(softcap=0.5)),
    ("alibi-heads-sq4-sk9", (2, 4, 9, 4, 2, 8), "contiguous", None, False, dict(alibi="heads")),
    ("strided-alibi-batch-softcap-window-causal", (2, 9, 6, 2, 2, 16), "strided", 0.5, True,
     dict(window=(1, -1), softcap=2.0, alibi="batch")),
    ("alibi-offset-negative-window-causal", (2, 7, 9, 4, 2, 8), "contiguous", None, True,
     dict(window=(3, -1), alibi="batch", alibi_offset=-5)),
    ("alibi-offset-positive-softcap-sinks", (1, 6, 10, 2, 1, 16), "contiguous", None, False,
     dict(softcap=1.5, alibi="heads", sinks=True, alibi_offset=40)),
    ("segments-causal", (2, 11, 11, 4, 2, 8), "contiguous", None, True, dict(segments=True)),
    ("segments-sq7-sk10-window-softcap", (2, 7, 10, 2, 2, 16), "contiguous", None, False,
     dict(segments=True, window=(3, 2), softcap=1.0)),
    ("sinks-gqa2-causal", (2, 5, 7, 4, 2, 8), "contiguous", None, True, dict(sinks=True)),
    ("sinks-window0-0-softcap-alibi-rows-without-keys", (1, 12, 5, 2, 2, 8), "contiguous", None, False,
     dict(window=(0, 0), softcap=1.0, alibi="heads", sinks=True)),
    ("bias-full-gqa2-causal", (2, 5, 7, 4, 2, 8), "contiguous", None, True, dict(bias="full")),
    ("bias-heads-broadcast-masked-rows-softcap", (2, 9, 6, 2, 2, 16), "strided", 0.5, False,
     dict(bias="masked", softcap=2.0)),
    ("dropout0.3-gqa2", (2, 5, 7, 4, 2, 8), "contiguous", None, False, dict(dropout=0.3)),
    ("dropout0.5-bias-window-sinks-segments", (2, 11, 11, 4, 2, 8), "contiguous", None, True,
     dict(dropout=0.5, bias="masked", window=(4, -1), sinks=True, segments=True)),
    # Rows of 16 keys, 32 bytes: a bias that TMA can read, which the Hopper kernels load so
    # (SCORE_MOD bias_tma: the forward in the 96 bucket, its dK/dV there and its dQ in the 128 one).
    ("bias-tma-rows-d72-dropout-alibi", (2, 24, 16, 4, 2, 72), "contiguous", None, False,
     dict(bias="full", dropout=0.2, alibi="heads")),
]


def alibi_slopes(kind, batch, heads, device):
    """Random positive float32 slopes shaped as `kind` says ("heads", "batch") or None."""
    if kind is None:
        return None
    shape = (heads,) if kind == "heads" else (batch, heads)
    return torch.rand(shape, device=device) * 0.5 + 0.05


def segment_ids(batch, seqlen, device, generator_seed):
    """int32 [batch, seqlen] ids of 1-3 consecutive segments per row (documents packed in a row)."""
    gen = torch.Generator().manual_seed(generator_seed)
    cuts = torch.randint(0, max(seqlen, 1), (batch, 2), generator=gen)
    positions = torch.arange(seqlen)
    return ((positions[None, :, None] >= cuts[:, None, :]).sum(-1)).to(torch.int32).to(device)


def sinks_for(heads, device):
    """Random float32 sink logits, one per head, around the scores' scale."""
    return torch.randn(heads, device=device)


def bias_for(kind, batch, heads, seqlen_q, seqlen_k, dtype, device):
    """A bias of the op's dtype: "full" [batch, heads, seqlen_q, seqlen_k], or "masked" [batch, 1,
    seqlen_q, seqlen_k] (broadcast over heads) with -inf entries and its first row all -inf."""
    if kind is None:
        return None
    bias = torch.randn(batch, heads if kind == "full" else 1, seqlen_q, seqlen_k, device=device)
    if kind == "masked":
        bias = bias.masked_fill(torch.rand(bias.shape, device=device) < 0.25, float("-inf"))
        bias[:, :, :1] = float("-inf")
    return bias.to(dtype)


def dropout_seed_for(device):
    return torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)


def forward_variant_args(variant, batch, heads, device, seqlen_q=0, seqlen_k=0, packed=False, dtype=torch.float64):
    """(window_left, window_right, softcap, alibi_slopes[, q_segment_ids, kv_segment_ids][, sinks][, bias],
    [dropout_p, dropout_seed][, alibi_offset]): the op's variant arguments (packed: no segment ids,
    bias or alibi_offset), as short as the variant allows. Segment ids cut q and k at the same places (self-attention
    packing)."""
    window = variant.get("window", (-1, -1))
    args = (window[0], window[1], variant.get("softcap", 0.0), alibi_slopes(variant.get("alibi"), batch, heads, device))
    later = [("segments", 2), ("sinks", 1), ("bias", 1), ("dropout", 2), ("alibi_offset", 1)]
    last = max([i for i, (key, _) in enumerate(later) if variant.get(key)], default=-1)
    for i, (key, width) in enumerate(later[:last + 1]):
        if packed and key in ("segments", "bias", "alibi_offset"):
            continue
        if key == "segments" and variant.get("segments"):
            ids = segment_ids(batch, max(seqlen_q, seqlen_k), device, generator_seed=seqlen_q * 31 + seqlen_k)
            args += (ids[:, :seqlen_q].contiguous(), ids[:, max(seqlen_q, seqlen_k) - seqlen_k:].contiguous())
        elif key == "sinks" and variant.get("sinks"):
            args += (sinks_for(heads, device),)
        elif key == "bias" and variant.get("bias"):
            args += (bias_for(variant["bias"], batch, heads, seqlen_q, seqlen_k, dtype, device),)
        elif key == "dropout" and variant.get("dropout"):
            args += (variant["dropout"], dropout_seed_for(device))
        elif key == "alibi_offset":
            args += (variant["alibi_offset"],)
        else:
            args += (None,) * width if key != "dropout" else (0.0, None)
    return args


def backward_variant_args(forward_variant):
    """The backward's variant arguments from the forward's: all but the sinks (the backward reads
    them through lse), with bias_grad set when there is a bias."""
    args = tuple(forward_variant[:6])
    if len(forward_variant) > 7:
        bias = forward_variant[7]
        args += (None,) * (6 - len(args)) + (bias, bias is not None, *forward_variant[8:10])
    if len(forward_variant) > 10:  # alibi_offset, after the dropout arguments in both schemas
        args += (forward_variant[10],)
    return args


def reference_variant(forward_args):
    """fattn.reference.attention_reference's keywords for a forward sample's variant arguments."""
    window_left, window_right, softcap, alibi = forward_args[6:10]
    # segment ids, sinks, bias, dropout_p, dropout_seed, alibi_offset
    defaults = (None, None, None, None, 0.0, None, 0)
    rest = tuple(forward_args[10:]) + defaults[len(forward_args[10:]):]
    return dict(window_size=(window_left, window_right), softcap=softcap, alibi_slopes=alibi,
                q_segment_ids=rest[0], kv_segment_ids=rest[1], sinks=rest[2], bias=rest[3], dropout_p=rest[4],
                dropout_seed=rest[5], alibi_offset=rest[6])


def forward_samples(device, dtype, requires_grad=False):
    """fattn::forward(q, k, v, softmax_scale, causal, deterministic, window_left, window_right,
    softcap, alibi_slopes)."""
    for name, shape, layout, softmax_scale, causal, *variant in FORWARD_CASES:
        q, k, v = make_qkv(*shape, dtype, device, layout=layout)
        if requires_grad:
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        options = forward_variant_args(variant[0] if variant else {}, shape[0], shape[3], device, shape[1], shape[2],
                                       dtype=dtype)
        yield Sample(name, (q, k, v, softmax_scale, causal, False, *options))


def backward_samples(device, dtype):
    """fattn::backward(dout, q, k, v, out, lse, dlse, softmax_scale, causal, deterministic,
    window_left, window_right, softcap, alibi_slopes) at the forward samples' points: dlse given
    or None, deterministic or not (every pairing), dout strided in every third."""
    for i, sample in enumerate(forward_samples(device, dtype)):
        q, k, v, softmax_scale, causal, _, *variant = sample.args
        out, lse = FORWARD(q, k, v, softmax_scale, causal, False, *variant)
        if i % 3 == 2:
            batch, seqlen_q, heads, head_dim = out.shape
            dout = torch.randn(batch, heads, seqlen_q, head_dim, dtype=dtype, device=device).transpose(1, 2)
        else:
            dout = torch.randn_like(out)
        dlse = torch.randn_like(lse) if i % 2 == 0 else None
        name = f"{sample.name}-{'dlse' if dlse is not None else 'no-dlse'}{'-strided-dout' if i % 3 == 2 else ''}"
        yield Sample(name, (dout, q, k, v, out, lse, dlse, softmax_scale, causal, i % 4 < 2,
                            *backward_variant_args(variant)))


# name, page_size (None: contiguous cache), storage layout, new tokens, cache_seqlens (None:
# whole cache), options; q is [2, 3, 4, 16] over a cache of capacity 40 with 2 kv heads.
DECODE_CASES = [
    ("contiguous", None, "contiguous", 0, [5, 33], {}),
    ("contiguous-append3", None, "contiguous", 3, [5, 33], {}),
    ("paged16", 16, "contiguous", 0, [5, 33], {}),
    ("paged16-append3", 16, "contiguous", 3, [5, 33], {}),
    ("fused-append3", None, "fused", 3, [5, 33], {}),
    ("fused-paged16-append3", 16, "fused", 3, [5, 33], {}),
    ("transposed-paged16-append1-splits3", 16, "transposed", 1, [0, 30], dict(num_splits=3)),
    ("fused-paged16-append3-window-softcap-scale", 16, "fused", 3, [5, 33],
     dict(softmax_scale=0.3, causal=False, window=(6, 2), softcap=1.5)),
    ("paged16-append2-alibi-softcap", 16, "contiguous", 2, [5, 33], dict(alibi="batch", softcap=2.0)),
    ("paged16-append2-sinks-splits3-empty-sequence", 16, "contiguous", 2, [0, 33], dict(sinks=True, num_splits=3)),
    ("whole-cache", 16, "contiguous", 0, None, {}),
    ("empty-sequence-right-window", None, "contiguous", 0, [0, 2], dict(causal=False, window=(-1, 0))),
    ("rotary-interleaved-append3", None, "contiguous", 3, [5, 33], dict(rotary="interleaved")),
    ("paged16-rotary-neox-append2-noncausal", 16, "contiguous", 2, [5, 33], dict(rotary="neox", causal=False)),
    ("batch-idx-leftpad-append3", None, "contiguous", 3, [5, 33], dict(batch_idx=True, leftpad=[2, 30])),
    ("paged16-leftpad-window", 16, "fused", 0, [5, 33], dict(leftpad=[0, 20], window=(8, 0))),
    ("chunked-prefill-20-queries-append20", 16, "contiguous", 20, [5, 13], dict(seqlen_q=20)),
]


def decode_samples(device, dtype):
    """fattn::decode(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
    cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
    rotary_interleaved, alibi_slopes, num_splits, sinks); the caches are the sample's own."""
    for name, page_size, layout, seqlen_new, lengths, options in DECODE_CASES:
        q = torch.randn(2, options.get("seqlen_q", 3), 4, 16, dtype=dtype, device=device)
        cache = KVCache(2, 40, 2, 16, dtype, device, page_size=page_size, layout=layout)
        k, v = new_tokens(2, seqlen_new, 2, 16, dtype, device)
        cache_seqlens = None if lengths is None else seqlens_tensor(lengths, device)
        window = options.get("window", (-1, -1))
        cos = sin = None
        if "rotary" in options:  # rotary_dim 8 of head_dim 16, positions for the whole capacity
            angles = 6.3 * torch.rand(cache.capacity, 4, dtype=torch.float64, device=device)
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        batch_idx = seqlens_tensor([1, 0], device) if options.get("batch_idx") else None
        leftpad = seqlens_tensor(options["leftpad"], device) if "leftpad" in options else None
        yield Sample(name, (q, cache.k_cache, cache.v_cache, k, v, cos, sin, cache_seqlens, batch_idx, leftpad,
                            cache.block_table, options.get("softmax_scale"), options.get("causal", True), window[0],
                            window[1], options.get("softcap", 0.0), options.get("rotary") == "interleaved",
                            alibi_slopes(options.get("alibi"), 2, 4, device), options.get("num_splits", 0),
                            sinks_for(4, device) if options.get("sinks") else None))


# FP8 KV caches: name, cache dtype, page_size, storage layout, new tokens, descales given ("kv",
# "k" or ""), options (as DECODE_CASES'); q [2, 3, 4, 16] in the sample's dtype.
FP8_DECODE_CASES = [
    ("fp8-e4m3-fused-paged16-append3-descales", torch.float8_e4m3fn, 16, "fused", 3, "kv", {}),
    ("fp8-e5m2-contiguous-append2-rotary-k-descale", torch.float8_e5m2, None, "contiguous", 2, "k",
     dict(rotary="interleaved")),
    ("fp8-e4m3-transposed-no-append-no-descale-splits3", torch.float8_e4m3fn, None, "transposed", 0, "",
     dict(num_splits=3, softcap=2.0)),
]


def fp8_kernels_on(device):
    """The CPU op takes FP8 caches everywhere; CUDA on sm_89 and sm_90 (aot_build/configs.json)."""
    return device == "cpu" or torch.cuda.get_device_capability(device) in ((8, 9), (9, 0))


def fp8_decode_samples(device, dtype):
    """fattn::decode with FP8 caches: decode's arguments and k_descale, v_descale."""
    for name, cache_dtype, page_size, layout, seqlen_new, descales, options in FP8_DECODE_CASES:
        q = torch.randn(2, 3, 4, 16, dtype=dtype, device=device)
        cache = KVCache(2, 40, 2, 16, cache_dtype, device, page_size=page_size, layout=layout)
        k, v = new_tokens(2, seqlen_new, 2, 16, dtype, device)
        cos = sin = None
        if "rotary" in options:
            angles = 6.3 * torch.rand(cache.capacity, 4, dtype=torch.float64, device=device)
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        k_descale = 0.05 + torch.rand(2, 2, device=device) if "k" in descales else None
        # a strided view: descales may have any strides
        v_descale = (0.05 + torch.rand(2, 2, device=device)).t().contiguous().t() if "v" in descales else None
        yield Sample(name, (q, cache.k_cache, cache.v_cache, k, v, cos, sin, seqlens_tensor([5, 33], device), None,
                            None, cache.block_table, None, True, -1, -1, options.get("softcap", 0.0),
                            options.get("rotary") == "interleaved", None, options.get("num_splits", 0), None,
                            k_descale, v_descale))


def all_decode_samples(device, dtype):
    yield from decode_samples(device, dtype)
    if fp8_kernels_on(device):
        yield from fp8_decode_samples(device, dtype)


def merge_samples(device, dtype):
    """fattn::merge_attention_states(outs, lses) with partials of `dtype`."""
    def partials(splits, batch, seqlen_q, heads, head_dim):
        outs = torch.randn(splits, batch, seqlen_q, heads, head_dim, device=device).to(dtype)
        lses = (3 * torch.randn(splits, batch, heads, seqlen_q, device=device)).to(expected_lse_dtype(dtype))
        return outs, lses

    outs, lses = partials(3, 2, 5, 4, 16)
    lses[1, 0, 2, 3] = float("-inf")
    yield Sample("3splits-one-partial-saw-no-key", (outs, lses))
    yield Sample("1split", partials(1, 1, 3, 2, 8))
    outs, lses = partials(4, 2, 7, 3, 32)
    lses[:, 1, 2, 4] = float("-inf")  # a row no partial saw
    outs[:, 1, 4, 2] = float("nan")   # what a partial that saw no key may hold
    yield Sample("a-row-no-partial-saw", (outs, lses))
    outs, lses = partials(2, 1, 6, 2, 24)
    yield Sample("strided", (outs[..., :16], lses.transpose(2, 3).contiguous().transpose(2, 3)))
    yield Sample("seqlen_q0", partials(2, 1, 0, 2, 8))


# name, q lengths, k lengths (None: the q lengths), heads, kv_heads, head_dim, spare rows past the
# last sequence, causal, seqused_k (fractions of the k lengths, or None), variant
VARLEN_CASES = [
    ("3seqs-gqa2", [4, 7, 2], None, 4, 2, 8, 0, False, None, {}),
    ("causal-q-and-k-differ-empty-seq", [5, 0, 3], [2, 4, 6], 2, 2, 16, 0, True, None, {}),
    ("spare-rows-seqused-k-causal", [3, 6], [5, 6], 2, 1, 8, 2, True, [0.6, 1.0], {}),
    ("window-softcap-alibi", [6, 9], None, 2, 2, 16, 0, False, None, dict(window=(2, 1), softcap=1.5, alibi="batch")),
    ("one-sequence", [5], [8], 2, 2, 8, 0, False, None, {}),
    ("sinks-causal-spare-rows", [4, 6], None, 4, 2, 8, 2, True, None, dict(sinks=True)),
    ("no-sequence", [], None, 2, 2, 8, 0, False, None, {}),
]


def varlen_inputs(case, device, dtype, requires_grad=False):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k) of a VARLEN_CASES entry."""
    _, lq, lk, heads, kv_heads, head_dim, spare, _, used, _ = case
    lk = lq if lk is None else lk
    offsets = lambda lengths: torch.tensor([0] + list(torch.tensor(lengths, dtype=torch.long).cumsum(0).tolist()),
                                           dtype=torch.int32, device=device)
    cu_q, cu_k = offsets(lq), offsets(lk)
    q = torch.randn(sum(lq) + spare, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(sum(lk) + spare, kv_heads, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    if requires_grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    seqused = None
    if used is not None:
        seqused = torch.tensor([int(f * n) for f, n in zip(used, lk)], dtype=torch.int32, device=device)
    return q, k, v, cu_q, cu_k, max(lq, default=0), max(lk, default=0), seqused


def varlen_forward_samples(device, dtype, requires_grad=False):
    """fattn::varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
    softmax_scale, causal, deterministic, window_left, window_right, softcap, alibi_slopes)."""
    for case in VARLEN_CASES:
        inputs = varlen_inputs(case, device, dtype, requires_grad)
        batch = inputs[3].shape[0] - 1
        options = forward_variant_args(case[9], batch, case[3], device, packed=True)
        yield Sample(case[0], (*inputs, None, case[7], False, *options))


def varlen_backward_samples(device, dtype):
    """fattn::varlen_backward at the forward samples' points, dlse given in every other one."""
    for i, sample in enumerate(varlen_forward_samples(device, dtype)):
        q, k, v, cu_q, cu_k, max_q, max_k, used, scale, causal, deterministic, *variant = sample.args
        out, lse = VARLEN_FORWARD(*sample.args)
        dlse = torch.randn_like(lse) if i % 2 == 0 else None
        yield Sample(sample.name, (torch.randn_like(out), q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, used,
                                   scale, causal, deterministic, *variant[:4], *variant[5:7]))


SAMPLE_INPUTS = {"forward": forward_samples, "backward": backward_samples, "decode": all_decode_samples,
                 "merge": merge_samples, "varlen_forward": varlen_forward_samples,
                 "varlen_backward": varlen_backward_samples}
OPS = {"forward": FORWARD, "backward": BACKWARD, "decode": DECODE, "merge": MERGE, "varlen_forward": VARLEN_FORWARD,
       "varlen_backward": VARLEN_BACKWARD}


def call_with_fakes(op, args):
    """`op` on fake copies of `args`: what its fake returns (or raises) under torch.compile."""
    with FakeTensorMode() as mode:
        return op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


def check_fake_raises_like_op(op, args, match=None):
    """The op raises for `args` (matching `match`), and its fake raises the same error. Only the
    first clause of the message must agree: the hint after '; ' is the op's to word."""
    with pytest.raises(RuntimeError, match=match) as real:
        op(*args)
    with pytest.raises(RuntimeError) as fake:
        call_with_fakes(op, args)
    want, got = str(real.value).split("; ")[0], str(fake.value).split("; ")[0]
    assert got == want, f"the fake raised {str(fake.value)!r}, the op {str(real.value)!r}"
