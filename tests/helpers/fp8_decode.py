"""Decode over FP8 KV caches: the cases, a random problem per case (cache, descales, new tokens
of which some must saturate), the call, and what the cache must hold after the append.

An FP8 cache value of sequence b, KV head h stands for x_fp8 * descale[b, h]; the append stores
new tokens (rotated first) as quantize_kv(x, descale) (fattn.reference), which the tests
compare bit for bit."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import fattn
from fattn.reference import kvcache_reference, quantize_kv, rotary_reference

from .kvcache import KVCache, cache_option_kwargs, new_tokens

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2

# name, cache dtype, cache_seqlens, seqlen_q, heads, kv_heads, head_dim, page_size (None:
# contiguous), layout, new tokens, causal, window, options: descales ("kv", "k", "v" or "": which
# are given), rotary (layout, rotary_dim), spare_rows (cache_batch_idx), leftpad, softcap, alibi.
FP8_CASES = [
    ("e4m3-contiguous-gqa4-append1", E4M3, [0, 17, 90], 1, 8, 2, 64, None, "contiguous", 1, True, (-1, -1),
     dict(descales="kv")),
    ("e5m2-paged16-gqa4-append3", E5M2, [3, 17, 90], 2, 8, 2, 64, 16, "contiguous", 3, True, (-1, -1),
     dict(descales="kv")),
    ("e4m3-paged16-fused-rotary-neox", E4M3, [3, 40, 70], 3, 8, 4, 64, 16, "fused", 2, True, (-1, -1),
     dict(descales="kv", rotary=("neox", 32))),
    ("e5m2-contiguous-rotary-gptj-k-descale-only", E5M2, [0, 17, 90], 1, 4, 1, 32, None, "contiguous", 2, True,
     (-1, -1), dict(descales="k", rotary=("gptj", 32))),
    ("e4m3-batch-idx-v-descale-only-leftpad", E4M3, [5, 40, 70], 2, 8, 2, 64, None, "contiguous", 2, True, (-1, -1),
     dict(descales="v", spare_rows=3, leftpad=[0, 7, 60])),
    ("e4m3-transposed-no-descale-window-softcap", E4M3, [9, 40, 70], 4, 4, 2, 64, None, "transposed", 1, False,
     (16, 2), dict(descales="", softcap=3.0)),
    ("e5m2-paged32-d80-alibi-no-append", E5M2, [9, 40, 70], 1, 8, 2, 80, 32, "contiguous", 0, True, (-1, -1),
     dict(descales="kv", alibi=True)),
    ("e4m3-paged16-d128-mha-20-queries", E4M3, [0, 40, 100], 20, 4, 4, 128, 16, "contiguous", 20, True, (-1, -1),
     dict(descales="kv")),
]


def fp8_case_id(case):
    return case[0]


@dataclass
class Fp8Problem:
    q: torch.Tensor
    cache: KVCache
    k: torch.Tensor | None
    v: torch.Tensor | None
    cache_seqlens: torch.Tensor
    kw: dict = field(default_factory=dict)  # flash_attn_with_kvcache's other arguments

    def to(self, device):
        """The same problem on another device (copies: the cache's memory too)."""
        cache = self.cache.clone()
        cache.bases = [b.to(device) for b in cache.bases]
        cache.k_cache, cache.v_cache = cache.views(cache.bases)
        if cache.block_table is not None:
            cache.block_table = cache.block_table.to(device)
        if cache.cache_batch_idx is not None:
            cache.cache_batch_idx = cache.cache_batch_idx.to(device)
        move = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
        return Fp8Problem(move(self.q), cache, move(self.k), move(self.v), move(self.cache_seqlens),
                          {n: move(t) for n, t in self.kw.items()})


def descales_for(batch, kv_heads, cache_dtype, device, strided=False):
    """float32 [batch, kv_heads]: what quantize_fp8 gives values of magnitude 2 to 6 (the format's
    largest value times the descale); `strided`: a transposed view."""
    d = (0.5 + torch.rand(kv_heads, batch, device=device)) * 4.0 / torch.finfo(cache_dtype).max
    return d.t() if strided else d.t().contiguous()


def saturating_tokens(x, descale, cache_dtype):
    """New tokens x (randn) at the scale the descale serves (x / descale about randn x max / 8),
    with two entries per row at +-1.25 x the largest value once divided: the append must saturate
    them. Without a descale, randn over a few binades."""
    if x is None:
        return None
    if descale is None:
        return (x.float() * torch.exp2(torch.randint(-3, 3, x.shape, device=x.device).float())).to(x.dtype)
    limit = torch.finfo(cache_dtype).max
    factor = descale.float()[:, None, :, None]
    spread = x.float() * (limit / 8) * factor
    edge = (1.25 * limit * factor)[..., 0]
    spread[..., 0] = edge
    spread[..., 1] = -edge
    return spread.to(x.dtype)


def fp8_problem(case, q_dtype, device):
    name, cache_dtype, lengths, seqlen_q, heads, kv_heads, head_dim, page_size, layout, new, causal, window, \
        options = case
    batch = len(lengths)
    capacity = max(lengths) + max(new, seqlen_q) + 3
    cache = KVCache(batch, capacity, kv_heads, head_dim, cache_dtype, device, page_size=page_size, layout=layout,
                    spare_rows=options.get("spare_rows"))
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=q_dtype, device=device)
    k, v = new_tokens(batch, new, kv_heads, head_dim, q_dtype, device)
    kw = dict(causal=causal, window_size=window, softcap=options.get("softcap", 0.0))
    given = options.get("descales", "kv")
    kw["k_descale"] = descales_for(batch, kv_heads, cache_dtype, device) if "k" in given else None
    kw["v_descale"] = descales_for(batch, kv_heads, cache_dtype, device, strided=True) if "v" in given else None
    k = saturating_tokens(k, kw["k_descale"], cache_dtype)
    v = saturating_tokens(v, kw["v_descale"], cache_dtype)
    kw.update(cache_option_kwargs(options, cache.capacity, batch, heads, q_dtype, device))
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return Fp8Problem(q, cache, k, v, cache_seqlens, kw)


def call(p: Fp8Problem, num_splits=0):
    """(out, lse) of the public function on the problem (its cache appended to in place)."""
    return fattn.flash_attn_with_kvcache(p.q, p.cache.k_cache, p.cache.v_cache, k=p.k, v=p.v,
                                         cache_seqlens=p.cache_seqlens, block_table=p.cache.block_table,
                                         cache_batch_idx=p.cache.cache_batch_idx, num_splits=num_splits,
                                         return_lse=True, **p.kw)


def stored_tokens(p: Fp8Problem):
    """(k, v) as the append must store them: rotated in float64 (with rotary), then quantize_kv."""
    if p.k is None:
        return None, None
    k = p.k
    if p.kw.get("rotary_cos") is not None:
        positions = p.cache_seqlens.long()[:, None] + torch.arange(k.shape[1], device=k.device)
        k = rotary_reference(k, p.kw["rotary_cos"], p.kw["rotary_sin"], positions, p.kw.get("rotary_interleaved", True))
    dtype = p.cache.k_cache.dtype
    return quantize_kv(k, p.kw.get("k_descale"), dtype), quantize_kv(p.v, p.kw.get("v_descale"), dtype)


def references(p: Fp8Problem, snapshot):
    """(float64 out, lse, out computed in q's dtype) on the cache as it was before the call."""
    k0, v0 = p.cache.views(snapshot)
    kw = dict(p.kw, window_size=p.kw["window_size"], cache_batch_idx=p.cache.cache_batch_idx)
    ref_out, ref_lse = kvcache_reference(p.q.double(), k0, v0, p.cache_seqlens, p.cache.block_table, k=p.k, v=p.v,
                                         rotated_q_dtype=p.q.dtype, **kw)
    low_out, _ = kvcache_reference(p.q, k0, v0, p.cache_seqlens, p.cache.block_table, k=p.k, v=p.v,
                                   dtype=p.q.dtype, **kw)
    return ref_out, ref_lse, low_out


def fp8_step(a, b):
    """How many representable values apart FP8 tensors a and b are, elementwise (their codes are
    sign-magnitude: the magnitudes' codes count the steps, within one sign)."""
    ua, ub = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    same_sign = (ua & 0x80) == (ub & 0x80)
    return torch.where(same_sign, ((ua & 0x7F) - (ub & 0x7F)).abs(), (ua & 0x7F) + (ub & 0x7F))
