"""Runs triton_src/decode.py's kernels in Triton's interpreter (TRITON_INTERPRET=1, CPU, numpy)
and compares them with fattn's CPU decode op. Invoked by test_decode_kernels_interpreted.py in a
fresh process, because Triton reads TRITON_INTERPRET when the kernels are decorated.

The launches are tuning/launch.py's decode, which mirrors csrc/ops/decode_cuda.cpp
through the kernels' specs. Prints one JSON line per case:
{"case": ..., "out_err": ..., "lse_err": ..., "lse_pattern": ..., "cache_ok": ..., "cache_err": ...}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fattn  # noqa: E402,F401  (loads the library: the CPU op is the reference)

from tuning.launch import DecodeTiles, Rotary, Variant, decode  # noqa: E402

# Small tiles: several key tiles, row tiles and merge chunks. The interpreter runs each
# program as one thread: warps and stages cannot change a result.
TILES = DecodeTiles(block_m=16, block_n=16, block_s=4, num_warps=4, num_stages=1)
# The wide (chunked prefill) tile: the same kernel with more rows per program.
WIDE_TILES = DecodeTiles(block_m=64, block_n=16, block_s=4, num_warps=4, num_stages=1)
WIDE_LONG_KEY_TILES = DecodeTiles(block_m=64, block_n=32, block_s=4, num_warps=4, num_stages=1)
# Key tiles longer than a page of 16: the paged cache's keys are looked up one by one (PAGE_TILES
# off), where with TILES every page holds whole key tiles, looked up once per tile.
LONG_KEY_TILES = DecodeTiles(block_m=16, block_n=32, block_s=4, num_warps=4, num_stages=1)


def launch(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, window, softcap, splits,
           alibi=None, sinks=None, rotary=None, cache_batch_idx=None, cache_leftpad=None, wide=0, k_descale=None,
           v_descale=None, tiles=TILES):
    variant = Variant(causal=causal, window=window, softcap=softcap, alibi=alibi, sinks=sinks)
    if wide:
        tiles = WIDE_LONG_KEY_TILES if tiles is LONG_KEY_TILES else WIDE_TILES
    return decode(q, k_cache, v_cache, cache_seqlens, block_table, splits, tiles, variant,
                  k_new, v_new, rotary=rotary, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                  wide=wide, k_descale=k_descale, v_descale=v_descale)


CASES = [
    # name, seqlen_q, heads, kv_heads, head_dim, page_size (None: contiguous), new tokens, causal, window, softcap, splits
    ("contiguous-gqa4-1split", 1, 8, 2, 16, None, 2, False, (-1, -1), 0.0, 1),
    ("paged16-mha-3splits", 3, 4, 4, 24, 16, 0, False, (-1, -1), 0.0, 3),
    ("paged16-keytiles32-mha-3splits", 3, 4, 4, 24, 16, 0, False, (-1, -1), 0.0, 3),
    ("paged16-keytiles32-window-leftpad-gqa4-2splits", 2, 8, 2, 16, 16, 1, False, (9, 0), 0.0, 2),
    ("paged32-window-leftpad-gqa4-3splits", 2, 8, 2, 16, 32, 1, False, (9, 0), 0.0, 3),
    ("contiguous-mqa-causal-2rowtiles-9splits", 5, 6, 1, 32, None, 2, True, (-1, -1), 0.0, 9),
    ("paged16-window-both", 4, 8, 2, 16, 16, 2, False, (7, 1), 0.0, 1),
    ("contiguous-window-left-softcap", 1, 4, 4, 24, None, 0, False, (5, -1), 5.0, 3),
    ("paged32-window-right-9splits", 5, 6, 1, 32, 32, 2, False, (-1, 2), 0.0, 9),
    ("paged16-causal-softcap", 4, 8, 2, 40, 16, 1, True, (-1, -1), 3.0, 4),
    ("paged16-causal-softcap-alibi-gqa4", 3, 8, 2, 16, 16, 2, True, (-1, -1), 3.0, 4),
    ("paged16-causal-sinks-gqa4-9splits", 3, 8, 2, 16, 16, 2, True, (-1, -1), 0.0, 9),
    ("contiguous-window-sinks-1split", 2, 4, 4, 16, None, 0, False, (4, 0), 0.0, 1),
    ("contiguous-rotary-gptj-batchidx-leftpad-3splits", 3, 8, 2, 32, None, 2, True, (-1, -1), 0.0, 3),
    ("paged16-rotary-neox-noncausal-leftpad", 2, 4, 4, 24, 16, 2, False, (-1, -1), 0.0, 1),
    ("paged16-wide-40q-causal-rotary-neox-2splits", 40, 4, 2, 16, 16, 40, True, (-1, -1), 0.0, 2),
    ("contiguous-wide-33q-window-batchidx-leftpad", 33, 8, 1, 32, None, 5, False, (20, 0), 0.0, 1),
    ("paged16-wide-mods-24q-causal-softcap-alibi-3splits", 24, 8, 2, 16, 16, 3, True, (-1, -1), 4.0, 3),
    ("paged32-wide-20q-window-leftpad-2splits", 20, 8, 2, 16, 32, 2, False, (30, 3), 0.0, 2),
    ("paged16-wide-keytiles32-20q-causal-leftpad-2splits", 20, 4, 2, 16, 16, 2, True, (-1, -1), 0.0, 2),
    # More queries than visible keys: the first row tile's keys [lo, hi) are empty, lo inside a
    # page tile whose aligned start lies in the padding (NaN there)
    ("paged16-causal-leftpad-gqa4-16q-1split", 16, 8, 2, 16, 16, 0, True, (-1, -1), 0.0, 1),
    ("paged16-wide-48q-causal-leftpad-1split", 48, 4, 2, 16, 16, 2, True, (-1, -1), 0.0, 1),
    # FP8 caches (KV_FP8 1: e4m3, 2: e5m2), with descales unless named *kdescale* (k's only)
    ("fp8-e4m3-contiguous-gqa4-3splits", 2, 8, 2, 32, None, 2, True, (-1, -1), 0.0, 3),
    ("fp8-e5m2-paged16-window-softcap-1split", 3, 4, 4, 16, 16, 1, False, (7, 1), 3.0, 1),
    ("fp8-e4m3-contiguous-batchidx-leftpad-kdescale-2splits", 3, 8, 2, 32, None, 2, True, (-1, -1), 0.0, 2),
    # bf16 q (float16 products, each row scaled by a power of two): rows beyond float16's range
    # and rows of float16 subnormals in one KV group, k_descale shrunk to keep the scores ordinary
    ("fp8-e4m3-paged16-bf16q-magnitudes-2splits", 2, 8, 2, 32, 16, 0, True, (-1, -1), 0.0, 2),
]

# The bf16q case's query heads, times these (cycled), and its k_descale, times the first's inverse.
BF16Q_FACTORS = [2.0 ** 16, 2.0 ** -20, 1.0, 2.0 ** 6]


def fp8_tokens(x, descale, fp8):
    """New tokens whose quotients by the descale (a power of two) are FP8 values, or beyond the
    format's range (two per row, which the append saturates): the append's rounding is then exact.
    Triton 3.6's interpreter rounds fp32 to FP8 wrongly where rounding up carries into the next
    binade (7.9 to e4m3 gives 4, not 8), which the GPU does not; the rounding itself is checked
    on the GPU (test_decode_fp8_gpu.py) and against torch for every float16 value on the CPU
    (test_decode_fp8_cpu.py)."""
    factor = 1.0 if descale is None else descale[:, None, :, None]
    limit = torch.finfo(fp8).max
    x = (4 * x).clamp(-limit, limit).to(fp8).float()
    x[..., 0], x[..., 1] = 2 * limit, -2 * limit
    return x * factor


def fp8_dtype(name):
    return torch.float8_e4m3fn if "e4m3" in name else torch.float8_e5m2 if "e5m2" in name else None


def fp8_steps(a, b):
    """The largest distance, in representable values, between FP8 tensors a and b (same signs)."""
    ua, ub = a.view(torch.uint8).int(), b.view(torch.uint8).int()
    same = (ua & 0x80) == (ub & 0x80)
    return int(torch.where(same, ((ua & 0x7F) - (ub & 0x7F)).abs(), (ua & 0x7F) + (ub & 0x7F)).max())


def run_case(name, seqlen_q, heads, kv_heads, head_dim, page_size, seqlen_new, causal, window, softcap, splits):
    """Cases named *alibi* add [batch, heads] ALiBi slopes, *sinks* sinks, *rotary-gptj* /
    *rotary-neox* a rotary embedding over 16 features, *batchidx* a cache with two spare rows,
    *leftpad* left padding, *wide* the wide row tile (*wide-mods* its softcap/ALiBi build),
    *keytiles32* key tiles of 32 (LONG_KEY_TILES)."""
    # An empty sequence, a short and a long one: with 9 splits the long one spreads its keys
    # over more splits than one merge chunk (BLOCK_S) holds. A right window only bites
    # when it is shorter than seqlen_q - 1 (the mask is aligned bottom-right).
    batch, capacity = 3, 256
    longest = capacity - max(seqlen_new, seqlen_q)  # the long sequence still fits its queries' positions
    cache_seqlens = torch.tensor([0, 17, min(250, longest)], dtype=torch.int32)
    q = torch.randn(batch, seqlen_q, heads, head_dim)
    if page_size:
        pages = batch * capacity // page_size
        k_cache = torch.randn(pages, page_size, kv_heads, head_dim)
        block_table = torch.randperm(pages, dtype=torch.int32).reshape(batch, capacity // page_size)
    else:
        k_cache = torch.randn(batch + 2 if "batchidx" in name else batch, capacity, kv_heads, head_dim)
        block_table = None
    v_cache = torch.randn_like(k_cache)
    fp8 = fp8_dtype(name)
    k_descale = v_descale = None
    if fp8 is not None:  # each sequence and head with its descale (a power of two: see fp8_tokens)
        k_cache, v_cache = (4 * k_cache).clamp(-400, 400).to(fp8), (4 * v_cache).clamp(-400, 400).to(fp8)
        k_descale = torch.exp2(torch.randint(-3, 1, (batch, kv_heads)).float())
        v_descale = None if "kdescale" in name else torch.exp2(torch.randint(-3, 1, (batch, kv_heads)).float())
    if "bf16q" in name:
        factors = torch.tensor(BF16Q_FACTORS).repeat(heads // len(BF16Q_FACTORS))
        q = (q.double() * factors[:, None]).to(torch.bfloat16)
        k_descale = k_descale / BF16Q_FACTORS[0]
    batch_idx = torch.randperm(batch + 2, dtype=torch.int32)[:batch] if "batchidx" in name else None
    leftpad = torch.tensor([0, 5, 100], dtype=torch.int32) if "leftpad" in name else None
    if leftpad is not None and fp8 is None:
        # The padding is ignored, whatever it holds: NaN there must reach no output (a masked
        # score's zero probability times a NaN value would).
        for b, pad in enumerate(leftpad.tolist()):
            for pos in range(pad):
                if page_size:
                    where = (int(block_table[b, pos // page_size]), pos % page_size)
                else:
                    where = (int(batch_idx[b]) if batch_idx is not None else b, pos)
                k_cache[where] = float("nan")
                v_cache[where] = float("nan")
    rotary = None
    if "rotary" in name:
        angles = 6.3 * torch.rand(capacity, 8)
        per_token = causal or window != (-1, -1)
        rotary = Rotary(angles.cos(), angles.sin(), interleaved="gptj" in name, per_token=per_token)
    k_new = torch.randn(batch, seqlen_new, kv_heads, head_dim) if seqlen_new else None
    v_new = torch.randn_like(k_new) if seqlen_new else None
    if fp8 is not None and seqlen_new:
        k_new, v_new = fp8_tokens(k_new, k_descale, fp8), fp8_tokens(v_new, v_descale, fp8)
    want_k, want_v = (k_cache.clone(), v_cache.clone()) if fp8 is not None else (k_cache.double(), v_cache.double())
    alibi = torch.rand(batch, heads) * 0.2 if "alibi" in name else None
    sinks = torch.randn(heads) if "sinks" in name else None
    want_out, want_lse = torch.ops.fattn.decode(
        q.double(), want_k, want_v, None if k_new is None else k_new.double(),
        None if v_new is None else v_new.double(), cache_seqlens=cache_seqlens, block_table=block_table,
        causal=causal, window_left=window[0], window_right=window[1], softcap=softcap, alibi_slopes=alibi,
        sinks=sinks, rotary_cos=None if rotary is None else rotary.cos.double(),
        rotary_sin=None if rotary is None else rotary.sin.double(),
        rotary_interleaved=rotary is not None and rotary.interleaved, cache_batch_idx=batch_idx, cache_leftpad=leftpad,
        k_descale=k_descale, v_descale=v_descale)
    out, lse = launch(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, causal, window, softcap, splits,
                      alibi, sinks, rotary, batch_idx, leftpad, wide=(2 if "mods" in name else 1) if "wide" in name else 0,
                      k_descale=k_descale, v_descale=v_descale, tiles=LONG_KEY_TILES if "keytiles32" in name else TILES)
    finite = torch.isfinite(want_lse)
    if fp8 is not None:  # the appended FP8 values, compared as bit patterns
        steps = max(fp8_steps(k_cache, want_k), fp8_steps(v_cache, want_v))
        return {
            "case": name,
            "out_err": (out.double() - want_out).abs().max().item(),
            "lse_err": (lse.double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0,
            "lse_pattern": bool(torch.equal(torch.isfinite(lse), finite)),
            "empty_rows": int((~finite).sum()),
            "cache_ok": steps == 0,
            "cache_err": steps,  # FP8 steps apart: a key rotated in fp32 may round one step from float64's
            "saturated": int((k_cache.float().abs() == torch.finfo(fp8).max).sum()),
            "appended": seqlen_new > 0,
            # the saturated tokens' values reach the format's largest (57344 x descale for e5m2)
            "out_scale": want_out.abs().max().item(),
            # the largest |value| the outputs average (a float16 P's rounding weighs them)
            "v_scale": (v_cache.double() * (1.0 if v_descale is None else v_descale.double().max())).abs().max().item(),
            "lse_scale": want_lse[finite].abs().max().item() if finite.any() else 0.0,
        }
    return {
        "case": name,
        "out_err": (out.double() - want_out).abs().max().item(),  # NaN if any output was left unwritten
        "lse_err": (lse.double()[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0,
        "lse_pattern": bool(torch.equal(torch.isfinite(lse), finite)),
        "empty_rows": int((~finite).sum()),
        # (NaN where the padding holds it, in both)
        "cache_ok": all(torch.allclose(a.double(), b, rtol=0, atol=0, equal_nan=True)
                        for a, b in ((k_cache, want_k), (v_cache, want_v))),
        # Rotated keys are computed in fp32 by the kernel and in float64 by the op.
        "cache_err": max((a.double() - b).abs().nan_to_num(0.0).max().item()
                         for a, b in ((k_cache, want_k), (v_cache, want_v))),
    }


if __name__ == "__main__":
    torch.manual_seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for case in CASES:
        print(json.dumps(run_case(*case)), flush=True)
