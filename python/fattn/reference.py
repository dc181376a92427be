"""Plain PyTorch attention in any precision: the yardstick for tests and benchmarks.

Same conventions as fattn (layout [batch, seqlen, heads, head_dim], GQA by head
groups, bottom-right causal, lse -inf and out 0 for rows that see no key).
"""

from __future__ import annotations

import math

import torch

from ._arguments import WIDEST_WINDOW
from ._checks import lse_dtype
from .fp8 import FP8_DTYPES


def attention_reference(q, k, v, softmax_scale=None, causal=False, dtype=torch.float64, *, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, sinks=None,
                        bias=None, dropout_p=0.0, dropout_seed=None, alibi_offset=0, fp8_probabilities=False):
    """(out, lse) computed in `dtype` (float64 by default) with a materialised score matrix.

    A row with a visible score that is NaN or +inf (a NaN or infinite input, bias, sink or
    ALiBi slope) gets NaN out and NaN lse.
    Query i sees key j iff (left < 0 or j >= i + d - left) and (right < 0 or j <= i + d + right),
    d = seqlen_k - seqlen_q, right forced to 0 by `causal`. Scores: scale * q.k, then
    softcap * tanh(s / softcap) when softcap > 0, then -slope * |i + d + alibi_offset - j| with
    alibi_slopes ([heads] or [batch, heads]; alibi_offset shifts ALiBi's distances alone). With
    segment ids ([batch, seqlen_q], [batch, seqlen_k]) query i sees key j only if their ids are
    equal. sinks ([heads]) add one logit per head to every row's denominator (a key with no
    value); differentiable through autograd. bias (broadcastable to [batch, heads, seqlen_q,
    seqlen_k]; a boolean one is True = attend) is added after ALiBi.
    dropout_p > 0 drops probabilities with dropout_keep_mask(dropout_seed, ...) and rescales the
    kept ones by 1 / keep probability (lse is unaffected).
    fp8_probabilities: the probabilities reach V as the FP8 forward gives them (its inputs already
    dequantized by the caller): exp(s - row max) times FP8_PROBABILITY_SCALE, rounded to e4m3, divided
    back, over the unrounded row sum.
    """
    out_dtype = q.dtype
    v = v.to(dtype)
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    v = v.repeat_interleave(heads // k.shape[2], dim=2)
    scores = attention_scores(q, k, softmax_scale, causal, dtype, window_size=window_size, softcap=softcap,
                              alibi_slopes=alibi_slopes, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                              bias=bias, alibi_offset=alibi_offset)
    # Rows that see no key get lse -inf and probabilities 0; they are computed on zeros so that
    # autograd never meets exp(-inf - -inf).
    empty = (scores == float("-inf")).all(-1, keepdim=True)
    safe = scores.masked_fill(empty, 0.0)
    if sinks is not None:
        sink_column = sinks.to(dtype)[None, :, None, None].expand(batch, heads, seqlen_q, 1)
        lse = torch.logsumexp(torch.cat([scores.masked_fill(empty, float("-inf")), sink_column], dim=-1), dim=-1)
        probs = torch.exp(scores - lse[..., None])
    else:
        lse = torch.logsumexp(safe, dim=-1).masked_fill(empty[..., 0], float("-inf"))
        probs = torch.exp(safe - torch.logsumexp(safe, dim=-1, keepdim=True)).masked_fill(empty, 0.0)
    lse = _undefined_where_infinite(lse)
    if fp8_probabilities:
        # exp(s - m) with m the row max (the sink's logit included), rounded, over the row sum.
        row_max = safe.amax(-1, keepdim=True)
        if sinks is not None:
            row_max = torch.maximum(row_max, sink_column)
        weights = torch.exp(safe - row_max).masked_fill(empty, 0.0)
        rounded = (weights * FP8_PROBABILITY_SCALE).to(torch.float8_e4m3fn).to(dtype) / FP8_PROBABILITY_SCALE
        probs = rounded * torch.exp(row_max - lse[..., None]).masked_fill(empty, 0.0)
    if dropout_p > 0:
        keep, keep_probability = dropout_keep_mask(dropout_seed, batch, heads, seqlen_q, seqlen_k, dropout_p,
                                                   device=probs.device)
        probs = probs * keep / keep_probability
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    # lse follows fattn's contract: float32, float64 for float64 inputs.
    return out.to(out_dtype), lse.to(lse_dtype(out_dtype))


def attention_scores(q, k, softmax_scale=None, causal=False, dtype=torch.float64, *, window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, q_segment_ids=None, kv_segment_ids=None, bias=None,
                     alibi_offset=0):
    """The scores [batch, heads, seqlen_q, seqlen_k] in `dtype` that attention_reference takes the
    softmax of: -inf where the query does not see the key (masks, windows, segments, a False or
    -inf bias); the rules are attention_reference's."""
    q, k = q.to(dtype), k.to(dtype)
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads, seqlen_k = k.shape[2], k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    slopes = None if alibi_slopes is None else alibi_slopes.to(dtype).expand(batch, heads)[:, :, None, None]
    scores = _modified_scores(torch.einsum("bqhd,bkhd->bhqk", q, k) * scale, softcap, slopes, alibi_offset)
    if bias is not None:
        if bias.dtype == torch.bool:
            scores = scores.masked_fill(~bias, float("-inf"))
        else:
            scores = scores + bias.to(dtype)
    # The masks come last: a key the query does not see is -inf whatever its score was (a NaN
    # or infinite bias entry there is never read).
    left, right = _window_sides(window_size)
    if causal:
        right = 0
    row = torch.arange(seqlen_q, device=q.device)[:, None]
    col = torch.arange(seqlen_k, device=q.device)[None, :]
    diag = seqlen_k - seqlen_q
    if right >= 0:
        scores = scores.masked_fill(col > row + diag + right, float("-inf"))
    if left >= 0:
        scores = scores.masked_fill(col < row + diag - left, float("-inf"))
    if q_segment_ids is not None:
        other = q_segment_ids[:, None, :, None] != kv_segment_ids[:, None, None, :]
        scores = scores.masked_fill(other, float("-inf"))
    return scores


def _modified_scores(scores, softcap, slopes, alibi_offset=0):
    """scores [..., seqlen_q, seqlen_k] after the softcap, then ALiBi: -slope * |i + diagonal +
    alibi_offset - j|, with the masks' bottom-right diagonal seqlen_k - seqlen_q; `slopes`
    broadcasts over the last two dims (None: no ALiBi)."""
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if slopes is not None:
        seqlen_q, seqlen_k = scores.shape[-2:]
        i = torch.arange(seqlen_q, device=scores.device)[:, None]
        j = torch.arange(seqlen_k, device=scores.device)[None, :]
        scores = scores - slopes * (i + (seqlen_k - seqlen_q) + alibi_offset - j).abs().to(scores.dtype)
    return scores


def _undefined_where_infinite(lse):
    """A visible score of +inf makes its row's softmax undefined (inf / inf): lse is NaN, as out
    is, rather than logsumexp's +inf. A NaN score already gives NaN."""
    return lse.masked_fill(lse == float("inf"), float("nan"))


def _window_sides(window_size):
    """(left, right) as ints; a side wider than any sequence (even past int64) bounds nothing."""
    return tuple(min(int(side), WIDEST_WINDOW) for side in window_size)


# The FP8 forward's probability scale: kFp8ProbabilityScale in csrc/common/fp8.h, which the kernel
# takes from the op (tests/test_fp8_forward_cpu.py checks the CPU op against this reference).
FP8_PROBABILITY_SCALE = 256.0


def rotary_reference(x, cos, sin, positions, interleaved, dtype=torch.float64):
    """x [..., seqlen, heads, head_dim] with its first rotary_dim = 2 * cos.shape[1] features
    rotated, in `dtype`: token s of x at row positions[..., s] of cos/sin [seqlen_ro, rotary_dim / 2].
    Interleaved (GPT-J) turns the pairs (2i, 2i + 1), otherwise (GPT-NeoX) the pairs (i, i + rotary_dim / 2),
    each by the angle of column i: (a, b) -> (a cos - b sin, a sin + b cos)."""
    rotary_dim = 2 * cos.shape[1]
    x = x.to(dtype)
    c = cos.to(dtype)[positions.long()][..., None, :]  # [..., seqlen, 1, rotary_dim / 2]
    s = sin.to(dtype)[positions.long()][..., None, :]
    head, tail = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        a, b = head[..., 0::2], head[..., 1::2]
        turned = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    else:
        a, b = head[..., :rotary_dim // 2], head[..., rotary_dim // 2:]
        turned = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    return torch.cat([turned, tail], dim=-1)


def quantize_kv(x, descale, dtype):
    """New tokens x [batch, seqlen, kv_heads, head_dim] as an FP8 cache of `dtype` stores them:
    x / descale[b, h] (float64; descale float32 [batch, kv_heads], None for 1) rounded to nearest
    even and saturated to the format's largest finite value.

    torch converts float64 to FP8 through float32, two roundings that can meet an FP8 tie the
    float64 value is not on; the float32 step is made round-to-odd here (an inexact value takes
    the odd one of its two float32 neighbours), which makes the pair one correct rounding."""
    y = x.double()
    if descale is not None:
        y = y / descale.double()[:, None, :, None]
    f = y.float()
    bits = f.view(torch.int32)
    beyond = y.abs() > f.double().abs()  # y lies past f, away from zero
    inexact = (f.double() != y) & (f != 0) & torch.isfinite(f)
    bits = torch.where(inexact & ((bits & 1) == 0), torch.where(beyond, bits + 1, bits - 1), bits)
    limit = torch.finfo(dtype).max
    return bits.view(torch.float32).clamp(-limit, limit).to(dtype)


def kvcache_reference(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
                      causal=False, window_size=(-1, -1), softcap=0.0, k=None, v=None,
                      dtype=torch.float64, alibi_slopes=None, sinks=None, rotary_cos=None, rotary_sin=None,
                      rotary_interleaved=True, cache_batch_idx=None, cache_leftpad=None, rotated_q_dtype=None,
                      k_descale=None, v_descale=None):
    """(out, lse) of decoding over a KV cache (fattn.flash_attn_with_kvcache), computed in `dtype`.

    Plain PyTorch, one sequence at a time (their lengths differ). The caches are never modified:
    new tokens `k`, `v` are placed at cache_seqlens[b] + i in a copy of sequence b's keys, which is
    what the op attends to after its in-place append. Paged caches ([num_pages, page_size, ...]
    with `block_table` [batch, pages_per_seq]) are gathered page by page. Query t of sequence b sees
    key j < seqlen_k iff (right < 0 or j <= t + diag + right) and (left < 0 or j >= t + diag - left),
    diag = seqlen_k - seqlen_q, right forced to 0 by `causal`; softcap > 0 maps a score s to
    softcap * tanh(s / softcap), then ALiBi subtracts slope * |t + diag - j| (alibi_slopes [heads] or
    [batch, heads]). sinks ([heads]) join every row's denominator as in attention_reference.
    Rows that see no key give out 0 and lse -inf (lse = sink with sinks). out is in q's dtype,
    lse float32 (float64 for float64 q) [batch, heads, seqlen_q].

    flash-attn's cache options: cache_batch_idx [batch] picks sequence b's row of a contiguous
    cache; cache_leftpad [batch] hides keys j < cache_leftpad[b] (the mask and ALiBi positions stay
    those of the cache); rotary_cos/rotary_sin [seqlen_ro, rotary_dim / 2] rotate the new keys at
    cache_seqlens[b] + i (stored in the cache's dtype, as the append stores them) and q at
    cache_seqlens[b] + t when the mask is causal or local (a window side below the capacity), at
    cache_seqlens[b] for every t otherwise (rotary_reference), rounded to q's dtype, or to
    rotated_q_dtype where given: the op rounds them to its q's dtype, so a float64 reference of a
    bf16 call passes q.double() and rotated_q_dtype=torch.bfloat16.

    An FP8 cache (float8_e4m3fn / float8_e5m2) holds values that stand for x * descale[b, h]
    (k_descale / v_descale float32 [batch, kv_heads], indexed by the sequence b; None for 1): its
    keys and values are dequantized in float64, and the new tokens (rotated in float64 first)
    enter it as quantize_kv stores them.
    """
    out_dtype = q.dtype
    batch, seqlen_q, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if heads % kv_heads:
        raise ValueError(f"kvcache_reference: {heads} heads is not a multiple of {kv_heads} kv heads")
    group = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    if block_table is None:
        capacity = k_cache.shape[1]
    else:
        capacity = block_table.shape[1] * k_cache.shape[1]
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("kvcache_reference: k/v need cache_seqlens")
        lengths = [capacity] * batch
    elif isinstance(cache_seqlens, int):
        lengths = [cache_seqlens] * batch
    else:
        lengths = [int(x) for x in cache_seqlens.tolist()]
    if (k is None) != (v is None):
        raise ValueError("kvcache_reference: give both k and v, or neither")
    seqlen_new = 0 if k is None else k.shape[1]
    left, right = _window_sides(window_size)
    per_token = causal or 0 <= left < capacity or 0 <= right < capacity
    if causal:
        right = 0
    rows = list(range(batch)) if cache_batch_idx is None else [int(x) for x in cache_batch_idx.tolist()]
    first_keys = [0] * batch if cache_leftpad is None else [int(x) for x in cache_leftpad.tolist()]
    if rotary_cos is not None:
        cached = torch.tensor(lengths, device=q.device)[:, None]
        if seqlen_new:
            # The append stores the rotated keys in the cache's dtype (an FP8 cache's: below).
            k = rotary_reference(k, rotary_cos, rotary_sin, cached + torch.arange(seqlen_new, device=q.device),
                                 rotary_interleaved)
            if k_cache.dtype not in FP8_DTYPES:
                k = k.to(k_cache.dtype)
        steps = torch.arange(seqlen_q, device=q.device) if per_token else torch.zeros(seqlen_q, dtype=torch.long,
                                                                                       device=q.device)
        # The rotated queries are operands in q's dtype, as the rotated keys are stored in the cache's.
        q = rotary_reference(q, rotary_cos, rotary_sin, cached + steps, rotary_interleaved, dtype).to(
            rotated_q_dtype or out_dtype)

    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8 and seqlen_new:
        k, v = quantize_kv(k, k_descale, k_cache.dtype), quantize_kv(v, v_descale, v_cache.dtype)

    def dequantized(x, descale, b):  # [keys, kv_heads, head_dim] of sequence b, in float64 for FP8
        if not fp8:
            return x
        return x.double() * (1.0 if descale is None else descale[b].double()[None, :, None])

    outs, lses = [], []
    for b in range(batch):
        seqlen_k = lengths[b] + seqlen_new
        if lengths[b] < 0 or seqlen_k > capacity:
            raise ValueError(f"kvcache_reference: sequence {b} needs {seqlen_k} keys, capacity {capacity}")
        if block_table is None:
            keys, values = k_cache[rows[b], :lengths[b]], v_cache[rows[b], :lengths[b]]
        else:
            pages = block_table[b].long()
            keys = k_cache[pages].flatten(0, 1)[:lengths[b]]  # a gathered copy
            values = v_cache[pages].flatten(0, 1)[:lengths[b]]
        if seqlen_new:  # the op's append, on copies
            keys = torch.cat([dequantized(keys, k_descale, b), dequantized(k[b], k_descale, b)], dim=0)
            values = torch.cat([dequantized(values, v_descale, b), dequantized(v[b], v_descale, b)], dim=0)
        else:
            keys, values = dequantized(keys, k_descale, b), dequantized(values, v_descale, b)
        keys = keys.to(dtype)
        values = values.to(dtype)
        if first_keys[b] > 0:  # hidden keys: whatever the padding holds (NaN included) reaches nothing
            hidden = (torch.arange(seqlen_k, device=q.device) < first_keys[b])[:, None, None]
            keys, values = keys.masked_fill(hidden, 0.0), values.masked_fill(hidden, 0.0)
        qb = q[b].to(dtype).reshape(seqlen_q, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,khd->hgqk", qb, keys) * scale  # [kv_heads, group, seqlen_q, seqlen_k]
        slopes = None if alibi_slopes is None else \
            alibi_slopes.to(dtype).expand(batch, heads)[b].reshape(kv_heads, group, 1, 1)
        scores = _modified_scores(scores, softcap, slopes)
        t = torch.arange(seqlen_q, device=q.device)[:, None]
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        diag = seqlen_k - seqlen_q
        visible = (j >= first_keys[b]).expand(seqlen_q, seqlen_k).clone()
        if right >= 0:
            visible &= j <= t + diag + right
        if left >= 0:
            visible &= j >= t + diag - left
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            sink_column = sinks.to(dtype).reshape(kv_heads, group, 1, 1).expand(kv_heads, group, seqlen_q, 1)
            lse = torch.logsumexp(torch.cat([scores, sink_column], dim=-1), dim=-1)
        else:
            lse = torch.logsumexp(scores, dim=-1)  # -inf for rows with no visible key (or no key)
        lse = _undefined_where_infinite(lse)
        probs = torch.exp(scores - lse[..., None]).masked_fill((lse == float("-inf"))[..., None], 0.0)
        out = torch.einsum("hgqk,khd->qhgd", probs, values).reshape(seqlen_q, heads, head_dim)
        outs.append(out.to(out_dtype))
        lses.append(lse.reshape(heads, seqlen_q).to(lse_dtype(out_dtype)))
    return torch.stack(outs), torch.stack(lses)


_PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_PHILOX_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
_LOW16, _LOW32 = 0xFFFF, 0xFFFFFFFF


def _mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * b for a 32-bit constant and int64 tensor b of 32-bit values,
    in 16-bit limbs so that no intermediate leaves int64's range."""
    a_high, a_low = a >> 16, a & _LOW16
    b_high, b_low = b >> 16, b & _LOW16
    middle = a_high * b_low + a_low * b_high
    low = a_low * b_low + ((middle & _LOW16) << 16)
    return a_high * b_high + (middle >> 16) + (low >> 32), low & _LOW32


def _philox4x32(counters, key):
    """Philox-4x32 with 10 rounds (Triton's tl.philox constants) over int64 tensors holding 32-bit
    values, keyed by two 32-bit ints."""
    c0, c1, c2, c3 = counters
    k0, k1 = key
    for _ in range(10):
        high0, low0 = _mulhilo32(_PHILOX_MULTIPLIERS[0], c0)
        high2, low2 = _mulhilo32(_PHILOX_MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = high2 ^ c1 ^ k0, low2, high0 ^ c3 ^ k1, low0
        k0 = (k0 + _PHILOX_KEY_STEPS[0]) & _LOW32
        k1 = (k1 + _PHILOX_KEY_STEPS[1]) & _LOW32
    return c0, c1, c2, c3


def dropout_threshold(dropout_p: float) -> tuple[int, float]:
    """(the 16-bit draw a kept key reaches at least, the resulting keep probability)."""
    threshold = min(round(dropout_p * 65536), 65535)
    return threshold, (65536 - threshold) / 65536


def dropout_keep_at(seed, b, h, i, j, dropout_p) -> torch.Tensor:
    """fattn's keep decision for sequence b, head h, query row i, key j: int64 tensors (or ints) that
    broadcast together, on the device the result is wanted on; a bool tensor of their broadcast
    shape. The definition is dropout_keep_mask's."""
    seed = int(seed.reshape(-1)[0]) if isinstance(seed, torch.Tensor) else int(seed)
    seed &= (1 << 64) - 1
    threshold, _ = dropout_threshold(dropout_p)
    device = next((x.device for x in (b, h, i, j) if isinstance(x, torch.Tensor)), None)
    b, h, i, j = torch.broadcast_tensors(*(torch.as_tensor(x, dtype=torch.int64, device=device) for x in (b, h, i, j)))
    key_group = (j // 16) * 4 + (j % 8) // 2
    row_group = (i // 16) * 8 + i % 8
    words = _philox4x32((key_group, row_group, h, b), (seed & _LOW32, seed >> 32))
    choice = 2 * ((i // 8) % 2) + (j // 8) % 2
    word = torch.where(choice == 0, words[0], torch.where(choice == 1, words[1],
                                                          torch.where(choice == 2, words[2], words[3])))
    draw = (word >> (16 * (j % 2))) & _LOW16
    return draw >= threshold


def dropout_keep_mask(seed, batch, heads, seqlen_q, seqlen_k, dropout_p, device=None):
    """(keep, keep_probability): fattn's dropout mask, bool [batch, heads, seqlen_q, seqlen_k] on
    `device` (default CPU), written from its definition (docs/DESIGN.md, rule 11) independently of
    the kernels and the CPU op.

    Key j of query row i, head h, sequence b is kept when its 16-bit draw is >= round(p * 2**16):
    word 2 * ((i // 8) % 2) + (j // 8) % 2 of Philox-4x32-10 keyed by the 64-bit seed (low word
    first) at counter ((j // 16) * 4 + (j % 8) // 2, (i // 16) * 8 + i % 8, h, b), its low half for
    even j, high half for odd j. `seed` is the int64 seed tensor (one element) or an int."""
    index = [torch.arange(n, device=device) for n in (batch, heads, seqlen_q, seqlen_k)]
    b, h, i, j = (x.reshape([-1 if d == axis else 1 for d in range(4)]) for axis, x in enumerate(index))
    return dropout_keep_at(seed, b, h, i, j, dropout_p), dropout_threshold(dropout_p)[1]
