"""Flash decoding: attention of a few query tokens over a long (paged) KV cache.

Decoding is bound by reading K and V once, not by arithmetic, so the work is cut
along the keys (split-K) until there are enough programs to keep every SM's
loads in flight:

- `kv_append` writes the new tokens' k/v into the cache at cache_seqlens[b] (the keys
  rotated first when a rotary embedding is given).
- `rotate_queries` applies a rotary embedding to q (only when one is given).
- `attn_decode_split`: one program per (split, kv head, row tile, batch). Its row
  tile holds every query head of the KV group for every query token (rows are
  token-major: row = token * group + head_in_group), so each K/V byte is read by
  one program, and the tile is wide enough for tensor cores. A program attends
  to its chunk of the sequence's keys and writes a partial (out, lse) in fp32;
  with a single split it writes the final output directly.
- `attn_decode_merge` combines the partials by their lse in fp32.

Sequence lengths are read on the device (cache_seqlens), so the grid depends on
shapes only: a decode step can be captured in a CUDA graph and replayed with new
lengths. Each program derives its chunk from the actual length, so splits stay
balanced however full the cache is.

The same split kernel serves chunked prefill (hundreds of query tokens over the
cache): the build gives it a narrow row tile for decoding (WIDE 0) and a wide one for
long query chunks (WIDE 1 without, 2 with the softcap/ALiBi code), whose key loop is
split into unmasked and masked tiles as in the forward kernel.

Scores live in the log2 domain (log2(e) folded into the scale, exp2 in the
softmax), as in the forward kernel. Masking (causal, sliding window) is applied
to every key tile: the kernel is bound by memory, the compares are free.
"""

import os

import triton
import triton.language as tl

from .arguments import CACHE_DESCALES, SCORES, SINKS, WINDOW
from .constants import LOG2E
from .fp8 import to_fp8
from .score_mods import softcap_tanh
from .softmax import initial_softmax_state, merge_finish, merge_rescale, softmax_finish, softmax_step
from .spec import KernelSpec, f32_tensor, i32, i64, index_tensor, slopes_tensor, strides, tensor, view


@triton.jit
def _key_slots(BlockTable, table_row, cols, page_size, PAGED: tl.constexpr):
    """(page, slot) of key rows `cols` of one sequence: through the block table for a
    paged cache; a contiguous cache is one page per sequence, `table_row` its batch index."""
    if PAGED:
        page = tl.load(BlockTable + table_row + cols // page_size).to(tl.int64)
        slot = (cols % page_size).to(tl.int64)
    else:
        page = table_row + 0 * cols.to(tl.int64)
        slot = cols.to(tl.int64)
    return page, slot


@triton.jit
def _tile_page(BlockTable, table_row, first, last, page_size):
    """(table column, page) of the key tile starting at `first`, for pages that hold whole key tiles
    (PAGE_TILES): one lookup per tile where the keys' own lookups cost the paged cache 10-20 % of its
    read rate (docs/notes/decode.md D16). A tile past the chunk's `last` key takes the last key's page
    (in bounds; its keys are never used)."""
    col = tl.minimum(first, last) // page_size
    return col, tl.load(BlockTable + table_row + col).to(tl.int64)


@triton.jit
def _split_keys(lo, hi, split, num_splits, BLOCK_N: tl.constexpr, PAGE_TILES: tl.constexpr):
    """[start, stop): split `split`'s share of the keys [lo, hi), whole key tiles each. With
    PAGE_TILES the tiles start on multiples of BLOCK_N, so none straddles a page; the keys this adds
    before lo are masked and read lo's slot. An empty [lo, hi) stays empty: its aligned start may
    lie in the left padding, whose slots may hold NaN, and no key of it is visible to read instead."""
    if PAGE_TILES:
        aligned = lo - lo % BLOCK_N
        hi = tl.where(hi > lo, hi, aligned)
        lo = aligned
    chunk = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    return start, tl.minimum(start + chunk, hi)


@triton.jit
def _cache_row(CacheBatchIdx, batch, use_batch_idx):
    """The contiguous cache's row of sequence `batch`: cache_batch_idx[batch] when given."""
    if use_batch_idx != 0:
        return tl.load(CacheBatchIdx + batch).to(tl.int64)
    return batch


# Triton's interpreter (tests/interpret_decode_kernels.py) runs these kernels on the CPU.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def _fp8_to_f16x4(fmt: str) -> str:
    """PTX converting the four FP8 values (`fmt`: e4m3 or e5m2) of register $2 to float16 in $0
    (the first two) and $1."""
    return ("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; "
            f"cvt.rn.f16x2.{fmt}x2 $0, lo; cvt.rn.f16x2.{fmt}x2 $1, hi; }}")


E4M3_TO_F16X4 = tl.constexpr(_fp8_to_f16x4("e4m3"))
E5M2_TO_F16X4 = tl.constexpr(_fp8_to_f16x4("e5m2"))

# The FP8 caches' largest finite values (e4m3fn, e5m2): the append saturates to them.
FP8_E4M3_MAX = tl.constexpr(448.0)
FP8_E5M2_MAX = tl.constexpr(57344.0)


@triton.jit
def _fp8_cache(Cache, KV_FP8: tl.constexpr):
    """The cache pointer as the kernels read it: declared in q's dtype ("*T": the variant's
    element type), reinterpreted as the FP8 type KV_FP8 names (1: e4m3fn, 2: e5m2; the values of
    fp8_flag in csrc/common/fp8.h), whose element strides the op passes in bytes."""
    if KV_FP8 == 1:
        return Cache.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    elif KV_FP8 == 2:
        return Cache.to(tl.pointer_type(tl.float8e5), bitcast=True)
    else:
        return Cache


@triton.jit
def _wide_fp8_stride(stride):
    """An FP8 cache's stride as a visible multiple of 16 bytes, for the exact-dim code (PAD_D 0:
    head_dim is the power-of-two bucket, so a contiguous cache's strides are such multiples; the
    op copies or refuses a cache that breaks it, decode_cuda.cpp): the K rows then load 16 bytes at
    a time, where the spec's promise of 8 elements alone gives 8-byte loads of FP8 values. (V's
    stay 8: Triton lays its tile out for the conversion to q's dtype; docs/notes/decode.md D11.)"""
    return (stride // 16) * 16


@triton.jit
def _fp8_products_query(q):
    """q for an FP8 cache's products, which run in float16 (every e4m3 and e5m2 value is a float16
    value, and one cvt.rn.f16x2 converts two, where bfloat16 takes a second conversion per value):
    each row multiplied by a power of two that puts its largest |q| in [2^14, 2^15) (exact, and in
    float16's range whatever q's magnitude), returned with the factor each row's scores are
    multiplied by to undo it. A bfloat16 q loses nothing (float16 keeps more bits), and the
    products are exact in fp32. A float32 q (Triton's interpreter alone: the builds' q is 16-bit)
    keeps float32 products."""
    if q.dtype == tl.float32:
        return q, tl.full([q.shape[0]], 1.0, tl.float32)
    largest = tl.max(tl.abs(q.to(tl.float32)), 1)
    exponent = (largest.to(tl.int32, bitcast=True) >> 23) & 0xFF  # biased: 127 is 2^0
    # Biased exponents of 2^(14 - e) and of its inverse (they sum to 254), both normal floats.
    up = tl.minimum(tl.maximum(127 + 14 - (exponent - 127), 1), 253)
    down = 254 - up
    up = (up << 23).to(tl.float32, bitcast=True)
    down = (down << 23).to(tl.float32, bitcast=True)
    return (q.to(tl.float32) * up[:, None]).to(tl.float16), down


@triton.jit
def _fp8_values_operand(v, dtype: tl.constexpr, KV_FP8: tl.constexpr):
    """An FP8 V tile as the second product's operand (float16; float32 in the interpreter),
    converted where it was loaded, four values per asm: not pure, so that Triton keeps the
    conversion before the tile's trip through shared memory. (It moves a plain cast after that
    trip, and an FP8 tile read back into mma.sync's layout for this product, which runs along the
    keys, is read a byte at a time; a float16 tile is read by ldmatrix.) Triton's interpreter runs
    no PTX: there the plain cast, the same exact conversion."""
    if INTERPRETED:
        return v.to(dtype)
    return tl.inline_asm_elementwise(E4M3_TO_F16X4 if KV_FP8 == 1 else E5M2_TO_F16X4, "=r,=r,r",
                                     [v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _descale(Descale, batch, kv_head, stride_b, stride_h, use_descale):
    """descale[batch, kv_head] of an FP8 cache (float32), 1 when none is given."""
    return tl.load(Descale + batch * stride_b + kv_head * stride_h, mask=use_descale != 0, other=1.0)


@triton.jit
def _quantize(x, descale, KV_FP8: tl.constexpr):
    """x (fp32) stored into an FP8 cache whose values stand for x_fp8 * descale: x / descale
    rounded once, to nearest even, as the CPU op rounds the exact quotient (round_to_fp8 in
    csrc/common/fp8.cpp), clamped to the format's largest finite value before the cast (so that
    saturation does not depend on what the conversion does out of range).

    Rounding the quotient to fp32 first and then to FP8 could land on an FP8 tie the exact quotient
    is not on (about once in 2^21 values); so the fp32 quotient is rounded to odd instead (an
    inexact one takes the odd one of its two neighbours, found from the exact remainder by fma),
    and round-to-odd at 24 bits followed by round-to-nearest-even at 4 or 3 is one correct
    rounding."""
    d = tl.zeros_like(x) + descale
    y = tl.div_rn(x, d)
    remainder = tl.fma(-y, d, x)  # exact: x - y * d
    bits = y.to(tl.int32, bitcast=True)
    beyond = (remainder > 0) == (y > 0)  # the exact quotient lies past y, away from zero
    odd = tl.where(beyond, bits + 1, bits - 1).to(tl.float32, bitcast=True)
    inexact = (remainder != 0) & (y != 0) & (tl.abs(y) <= 3.4028234663852886e38)
    y = tl.where(inexact & ((bits & 1) == 0), odd, y)
    # NaN stays NaN through the clamp, as in the CPU op (round_to_fp8).
    if KV_FP8 == 1:
        y = tl.minimum(tl.maximum(y, -FP8_E4M3_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_E4M3_MAX,
                       propagate_nan=tl.PropagateNan.ALL)
    else:
        y = tl.minimum(tl.maximum(y, -FP8_E5M2_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_E5M2_MAX,
                       propagate_nan=tl.PropagateNan.ALL)
    return to_fp8(y, KV_FP8, False)  # one rounding on every arch (Triton's cast rounds twice on sm_89)


@triton.jit
def _rotate(x, X, row_offsets, row_ok, offs_d, positions, RotaryCos, RotarySin, stride_ro, seqlen_ro, rotary_dim,
            rotary_interleaved):
    """Rows x [R, BLOCK_D] (loaded from X + row_offsets[:, None] + offs_d[None, :]) with their
    first rotary_dim features rotated at `positions` [R], in fp32 (flash-attn's apply_rotary_emb):
    pairs (2i, 2i + 1) when interleaved, (i, i + rotary_dim / 2) otherwise, each turned by the
    angle of column i of the cos/sin tables. A position past the tables is clamped onto their last
    row (unchecked on the device; the CPU op raises)."""
    half = rotary_dim // 2
    rotated = offs_d < rotary_dim
    interleaved = rotary_interleaved != 0
    partner = tl.where(interleaved, offs_d ^ 1, tl.where(offs_d < half, offs_d + half, offs_d - half))
    column = tl.where(interleaved, offs_d // 2, tl.where(offs_d < half, offs_d, offs_d - half))
    first = tl.where(interleaved, offs_d % 2 == 0, offs_d < half)  # x[a] of the pair (a, b)
    mask = row_ok[:, None] & rotated[None, :]
    x_partner = tl.load(X + row_offsets[:, None] + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    table = tl.minimum(positions, seqlen_ro - 1).to(tl.int64)[:, None] * stride_ro + column[None, :]
    cos = tl.load(RotaryCos + table, mask=mask, other=1.0).to(tl.float32)
    sin = tl.load(RotarySin + table, mask=mask, other=0.0).to(tl.float32)
    # a' = a cos - b sin, b' = a sin + b cos
    return x.to(tl.float32) * cos + tl.where(first[None, :], -x_partner, x_partner) * sin


@triton.jit
def kv_append(
    KNew, VNew, KCache, VCache, CacheSeqlens, BlockTable, CacheBatchIdx, RotaryCos, RotarySin,
    stride_nkb, stride_nks, stride_nkh,
    stride_nvb, stride_nvs, stride_nvh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_tb, page_size, capacity, head_dim, use_batch_idx,
    stride_ro, seqlen_ro, rotary_dim, rotary_interleaved,
    KDescale, stride_kdb, stride_kdh, use_k_descale, VDescale, stride_vdb, stride_vdh, use_v_descale,
    BLOCK_D: tl.constexpr, PAGED: tl.constexpr, PAD_D: tl.constexpr, KV_FP8: tl.constexpr,
):
    """Grid (seqlen_new, kv_heads, batch): copies new token i of (batch, kv head) to
    cache position cache_seqlens[batch] + i, its key rotated at that position when
    rotary_dim > 0. Positions past the capacity are dropped (checking them on the host
    would need the device's lengths). An FP8 cache (KV_FP8 1 or 2) stores the token
    quantized with its sequence's descale (k_descale[batch, kv_head], 1 with use_k_descale 0;
    v likewise), after the rotation (_quantize)."""
    i = tl.program_id(0)
    kv_head = tl.program_id(1).to(tl.int64)
    batch = tl.program_id(2).to(tl.int64)
    pos = tl.load(CacheSeqlens + batch) + i
    if (pos >= 0) & (pos < capacity):
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < head_dim if PAD_D else offs_d < BLOCK_D
        table_row = batch * stride_tb if PAGED else _cache_row(CacheBatchIdx, batch, use_batch_idx)
        page, slot = _key_slots(BlockTable, table_row, pos, page_size, PAGED)
        k_off = page * stride_kb + slot * stride_ks + kv_head * stride_kh
        v_off = page * stride_vb + slot * stride_vs + kv_head * stride_vh
        k_row = batch * stride_nkb + i * stride_nks + kv_head * stride_nkh
        # fp32 until the one rounding to the cache's type below (exact for an unrotated 16-bit key)
        k = tl.load(KNew + k_row + offs_d, mask=d_ok).to(tl.float32)
        v = tl.load(VNew + batch * stride_nvb + i * stride_nvs + kv_head * stride_nvh + offs_d, mask=d_ok)
        if rotary_dim > 0:
            one = tl.full([1], 1, tl.int1)
            k = _rotate(k[None, :], KNew, tl.full([1], 0, tl.int64) + k_row, one, offs_d, tl.full([1], 0, tl.int32) + pos,
                        RotaryCos, RotarySin, stride_ro, seqlen_ro, rotary_dim, rotary_interleaved)
            k = tl.reshape(k, [BLOCK_D])
        if KV_FP8 != 0:
            k = _quantize(k, _descale(KDescale, batch, kv_head, stride_kdb, stride_kdh, use_k_descale),
                          KV_FP8)
            v = _quantize(v.to(tl.float32), _descale(VDescale, batch, kv_head, stride_vdb, stride_vdh, use_v_descale),
                          KV_FP8)
        else:
            k = k.to(KCache.dtype.element_ty)
        tl.store(_fp8_cache(KCache, KV_FP8) + k_off + offs_d, k, mask=d_ok)
        tl.store(_fp8_cache(VCache, KV_FP8) + v_off + offs_d, v, mask=d_ok)


@triton.jit
def rotate_queries(
    Q, QRot, CacheSeqlens, RotaryCos, RotarySin,
    stride_qb, stride_qs, stride_qh,
    seqlen_q, num_heads, head_dim, stride_ro, seqlen_ro, rotary_dim, rotary_interleaved, rotary_per_token,
    BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
):
    """Grid (seqlen_q, heads, batch): query token t of (batch, head) rotated at cache_seqlens[batch]
    (+ t with rotary_per_token != 0) into QRot, contiguous [batch, seqlen_q, heads, head_dim].
    A launch of its own, so that the split kernel carries no rotation code."""
    t = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim if PAD_D else offs_d < BLOCK_D
    row = batch * stride_qb + t.to(tl.int64) * stride_qs + head.to(tl.int64) * stride_qh
    q = tl.load(Q + row + offs_d, mask=d_ok)
    position = tl.load(CacheSeqlens + batch) + tl.where(rotary_per_token != 0, t, 0)
    one = tl.full([1], 1, tl.int1)
    rotated = _rotate(q[None, :], Q, tl.full([1], 0, tl.int64) + row, one, offs_d,
                      tl.full([1], 0, tl.int32) + position, RotaryCos, RotarySin, stride_ro, seqlen_ro, rotary_dim,
                      rotary_interleaved)
    out_row = ((batch * seqlen_q + t) * num_heads + head) * head_dim
    tl.store(QRot + out_row + offs_d, tl.reshape(rotated, [BLOCK_D]).to(QRot.dtype.element_ty), mask=d_ok)


@triton.jit
def _page_tile_slots(keys, first_visible, last, col, page_size):
    """The in-page slots (int32) of keys `keys` of a page tile in page column `col`: keys before
    first_visible (the first a row may see; the slots before it may be padding) read its slot, keys
    past `last` (the split's or chunk's last key) the last one's. BLOCK_N divides page_size, so both
    lie in the tile's page; their scores are masked, and never padding's NaN times p = 0."""
    return tl.minimum(tl.maximum(keys, first_visible), last) - col * page_size


@triton.jit
def _wide_tile_slots(BlockTable, table_row, start, stop, tile, page_size, offs_n, key_lo, BLOCK_N: tl.constexpr,
                     PAGED: tl.constexpr, PAGE_TILES: tl.constexpr):
    """(page, slot) of the keys of the chunk's key tile `tile`, clamped onto the chunk's last key
    (in bounds, on a mapped page: this also serves the lookahead past the last tile). With
    PAGE_TILES (the chunk's tiles start on multiples of BLOCK_N, which divides page_size) the tile
    lies in one page, looked up once (_tile_page), its slots as _page_tile_slots says."""
    first = start + tile * BLOCK_N
    if PAGE_TILES:
        last = tl.maximum(stop - 1, 0)
        col, page = _tile_page(BlockTable, table_row, first, last, page_size)
        slot = _page_tile_slots(first + offs_n, key_lo, last, col, page_size).to(tl.int64)
    else:
        page, slot = _key_slots(BlockTable, table_row, tl.maximum(tl.minimum(first + offs_n, stop - 1), 0),
                                page_size, PAGED)
    return page, slot


@triton.jit
def _wide_key_tiles(
    acc, l_i, m_i, q, KCache, VCache, BlockTable, table_row, kv_head,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    start, stop, key_lo, first_tile, num_tiles, skip_at, skip, page_size, offs_n, offs_d, d_ok,
    token, diagonal, row_lo, row_hi, qk_scale, softcap_log2, use_alibi, alibi_log2,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAD_D: tl.constexpr, MASKED: tl.constexpr,
    MODS: tl.constexpr, PAGE_TILES: tl.constexpr,
):
    """Folds num_tiles key tiles of the chunk [start, stop) into the softmax state: the i-th is
    tile first_tile + i, or + skip once i >= skip_at (the masked loop jumps over the fully
    visible middle). MASKED applies the rows' window and the chunk's end; MODS compiles the
    softcap and ALiBi in (WIDE 2; WIDE 1 leaves their code out, which costs the pipeline even
    unused). Where a tile's keys live is looked up one tile ahead (loop-carried), so the K/V
    loads do not wait on the block table and Triton pipelines them (docs/notes/decode.md D2)."""
    tile = first_tile + tl.where(0 >= skip_at, skip, 0)
    page, slot = _wide_tile_slots(BlockTable, table_row, start, stop, tile, page_size, offs_n, key_lo, BLOCK_N,
                                  PAGED, PAGE_TILES)
    for i in range(0, num_tiles):
        cols = start + tile * BLOCK_N + offs_n
        k_rows = page * stride_kb + slot * stride_ks + kv_head * stride_kh
        v_rows = page * stride_vb + slot * stride_vs + kv_head * stride_vh
        tile = first_tile + i + 1 + tl.where(i + 1 >= skip_at, skip, 0)
        page, slot = _wide_tile_slots(BlockTable, table_row, start, stop, tile, page_size, offs_n, key_lo,
                                      BLOCK_N, PAGED, PAGE_TILES)
        if PAD_D:
            k = tl.load(KCache + k_rows[None, :] + offs_d[:, None], mask=d_ok[:, None], other=0.0)
        else:
            k = tl.load(KCache + k_rows[None, :] + offs_d[:, None])
        qk = tl.dot(q, k) * qk_scale
        if MODS:
            if softcap_log2 > 0:
                qk = softcap_log2 * softcap_tanh(qk)
            if use_alibi != 0:
                qk -= alibi_log2[:, None] * tl.abs(token[:, None] + diagonal - cols[None, :]).to(tl.float32)
        if MASKED:
            visible = (cols[None, :] < stop) & (cols[None, :] >= row_lo[:, None]) & (cols[None, :] <= row_hi[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        p, m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, MASKED)
        if PAD_D:
            v = tl.load(VCache + v_rows[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        else:
            v = tl.load(VCache + v_rows[:, None] + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _wide_chunk(
    acc, l_i, m_i, q, KCache, VCache, BlockTable, table_row, kv_head,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    lo, hi, split, num_splits, first_key, first_token, last_token, seqlen_k, page_size, offs_n, offs_d, d_ok,
    token, diagonal, window_left, window_right, row_lo, row_hi, qk_scale, softcap_log2, use_alibi, alibi_log2,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAD_D: tl.constexpr, MODS: tl.constexpr,
    PAGE_TILES: tl.constexpr,
):
    """The wide row tile's pass over its split of [lo, hi), as the forward kernel does it: the
    key tiles every row of the tile sees run without a mask, the edges of the window and of the
    keys with it. Two loops only: each pipelined loop holds shared memory of its own. With
    PAGE_TILES the tiles start on multiples of BLOCK_N, as the decoding tile's do (the keys
    before `lo` this adds fall in the masked edge loop)."""
    start, stop = _split_keys(lo, hi, split, num_splits, BLOCK_N, PAGE_TILES)
    # Keys every row of the tile sees: [full_lo, full_hi).
    full_lo = first_key
    if window_left >= 0:
        full_lo = tl.maximum(last_token + diagonal - window_left, first_key)
    full_hi = tl.minimum(stop, seqlen_k)
    if window_right >= 0:
        full_hi = tl.minimum(full_hi, first_token + diagonal + window_right + 1)
    num_tiles = tl.cdiv(tl.maximum(stop - start, 0), BLOCK_N)
    full_first = tl.minimum(tl.cdiv(tl.maximum(full_lo - start, 0), BLOCK_N), num_tiles)
    full_end = tl.maximum(tl.minimum(tl.maximum(full_hi - start, 0) // BLOCK_N, num_tiles), full_first)
    num_full = full_end - full_first
    acc, l_i, m_i = _wide_key_tiles(
        acc, l_i, m_i, q, KCache, VCache, BlockTable, table_row, kv_head, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, start, stop, lo, full_first, num_full, num_full, 0, page_size, offs_n,
        offs_d, d_ok, token, diagonal, row_lo, row_hi, qk_scale, softcap_log2, use_alibi, alibi_log2,
        BLOCK_N, PAGED, PAD_D, False, MODS, PAGE_TILES)
    # The edges: tiles [0, full_first) and [full_end, num_tiles).
    return _wide_key_tiles(
        acc, l_i, m_i, q, KCache, VCache, BlockTable, table_row, kv_head, stride_kb, stride_ks, stride_kh,
        stride_vb, stride_vs, stride_vh, start, stop, lo, 0, full_first + num_tiles - full_end, full_first,
        num_full, page_size, offs_n, offs_d, d_ok, token, diagonal, row_lo, row_hi, qk_scale, softcap_log2,
        use_alibi, alibi_log2, BLOCK_N, PAGED, PAD_D, True, MODS, PAGE_TILES)


@triton.jit
def attn_decode_split(
    Q, KCache, VCache, CacheSeqlens, BlockTable, CacheBatchIdx, CacheLeftpad,
    PartOut, PartLse, Out, Lse,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_tb,
    seqlen_q, num_heads, kv_group_size, head_dim, seqlen_new, capacity, page_size, num_splits,
    window_left, window_right,
    Alibi, stride_alibib, stride_alibih, use_alibi,
    qk_scale, softcap_log2, Sinks, use_sinks,
    use_batch_idx, use_leftpad,
    KDescale, stride_kdb, stride_kdh, use_k_descale, VDescale, stride_vdb, stride_vdh, use_v_descale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr, PAD_D: tl.constexpr, WIDE: tl.constexpr, KV_FP8: tl.constexpr,
    PAGE_TILES: tl.constexpr,
):
    """Grid (num_splits, kv_heads * row_tiles, batch).

    window_left/right < 0 mean unbounded (causal is window_right = 0). With
    softcap_log2 > 0 the score is softcap * tanh(s) with s = q.k * qk_scale, and
    softcap_log2 = softcap * log2(e); otherwise the score is q.k * qk_scale, which
    then already holds log2(e). With use_alibi != 0, ALiBi subtracts slope * |t + diagonal - j|
    (the slope of the row's head, at Alibi + batch * stride_alibib + head * stride_alibih) after
    the softcap. With use_sinks != 0, split 0 starts each row from its head's sink
    (initial_softmax_state), so the merge counts the sink once. A contiguous cache's row is
    cache_batch_idx[batch] with use_batch_idx != 0; with use_leftpad != 0 the keys before
    cache_leftpad[batch] are not attended to (the masks keep their positions). A rotary
    embedding reaches q through rotate_queries, before this kernel.
    An FP8 cache (KV_FP8 1: e4m3fn, 2: e5m2; decoding tile only) stands for x_fp8 * descale, one
    float32 descale per (batch, kv head) (use_k/v_descale 0: 1): the dots run in float16 (exact for
    every e4m3/e5m2 value; q scaled per row into float16's range, _fp8_products_query), k_descale
    folded into qk_scale, and the (partial) output multiplied by v_descale before it is written, so
    the merge is unchanged.
    WIDE 1 and 2 (chunked prefill: the build gives them a tall row tile) take the forward
    kernel's two-loop pass (_wide_chunk): no mask on the key tiles every row sees; WIDE 2 has
    the softcap and ALiBi code, WIDE 1 runs neither (softcap_log2 = 0, use_alibi = 0).
    PAGE_TILES (a paged cache whose page_size is a multiple of BLOCK_N, and page_size times the
    slot strides, plus head_dim, at most 2^31 - 1): the key tiles start on multiples of BLOCK_N
    (the keys before `lo` that this adds are masked, and share lo's page), so each lies in one
    page, looked up once per tile; the decoding tile addresses a page's keys in 32 bits.
    Out [batch, seqlen_q, heads, head_dim] and Lse
    [batch, heads, seqlen_q] are contiguous, as are PartOut [splits, batch, seqlen_q,
    heads, head_dim] (fp32) and PartLse [splits, batch, heads, seqlen_q].
    """
    tl.static_assert(KV_FP8 == 0 or WIDE == 0, "an FP8 cache runs the decoding tile (WIDE 0)")
    tl.static_assert(not PAGE_TILES or PAGED, "PAGE_TILES: a paged cache")
    split = tl.program_id(0)
    rows_total = seqlen_q * kv_group_size
    row_tiles = tl.cdiv(rows_total, BLOCK_M)
    kv_head = (tl.program_id(1) // row_tiles).to(tl.int64)
    row_tile = tl.program_id(1) % row_tiles
    batch = tl.program_id(2).to(tl.int64)

    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < rows_total
    token = rows // kv_group_size
    head = kv_head * kv_group_size + rows % kv_group_size
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim

    q_rows = batch * stride_qb + token.to(tl.int64) * stride_qs + head * stride_qh
    q = tl.load(Q + q_rows[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    cached = tl.load(CacheSeqlens + batch)

    # The sequence's keys after the append, never past the cache; left padding hides the first.
    seqlen_k = tl.minimum(cached + seqlen_new, capacity)
    first_key = seqlen_k * 0
    if use_leftpad != 0:
        first_key = tl.load(CacheLeftpad + batch)
    diagonal = seqlen_k - seqlen_q
    # Keys any row of the tile may see: [lo, hi).
    first_token = (row_tile * BLOCK_M) // kv_group_size
    last_token = tl.minimum((row_tile * BLOCK_M + BLOCK_M - 1) // kv_group_size, seqlen_q - 1)
    lo = first_key
    if window_left >= 0:
        lo = tl.maximum(first_token + diagonal - window_left, first_key)
    hi = seqlen_k
    if window_right >= 0:
        hi = tl.minimum(last_token + diagonal + window_right + 1, seqlen_k)

    # Per-row window bounds; an unbounded side admits every key in [lo, hi).
    row_lo = tl.maximum(tl.where(window_left >= 0, token + diagonal - window_left, 0), first_key)
    row_hi = tl.where(window_right >= 0, token + diagonal + window_right, seqlen_k)
    table_row = batch * stride_tb if PAGED else _cache_row(CacheBatchIdx, batch, use_batch_idx)
    alibi_log2 = tl.load(Alibi + batch * stride_alibib + head * stride_alibih,
                         mask=row_ok & (use_alibi != 0), other=0.0) * LOG2E

    if KV_FP8 != 0:
        # The scores are (q . k_fp8) * k_descale * scale: one factor per program.
        qk_scale = qk_scale * _descale(KDescale, batch, kv_head, stride_kdb, stride_kdh, use_k_descale)
        KCache = _fp8_cache(KCache, KV_FP8)
        VCache = _fp8_cache(VCache, KV_FP8)
        if not PAD_D:
            stride_kb = _wide_fp8_stride(stride_kb)
            stride_ks = _wide_fp8_stride(stride_ks)
            stride_kh = _wide_fp8_stride(stride_kh)
            stride_vb = _wide_fp8_stride(stride_vb)
            stride_vs = _wide_fp8_stride(stride_vs)
            stride_vh = _wide_fp8_stride(stride_vh)

    m_i, l_i = initial_softmax_state(Sinks, head, (use_sinks != 0) & (split == 0), BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # An FP8 cache's products run in float16, q scaled per row into its range (_fp8_products_query).
    row_scale = tl.zeros([BLOCK_M], dtype=tl.float32) + qk_scale
    if KV_FP8 != 0:
        q, unscale = _fp8_products_query(q)
        row_scale = row_scale * unscale
    if WIDE != 0:
        acc, l_i, m_i = _wide_chunk(
            acc, l_i, m_i, q, KCache, VCache, BlockTable, table_row, kv_head, stride_kb, stride_ks, stride_kh,
            stride_vb, stride_vs, stride_vh, lo, hi, split, num_splits, first_key, first_token, last_token, seqlen_k,
            page_size, offs_n, offs_d, d_ok, token, diagonal, window_left, window_right, row_lo, row_hi, qk_scale,
            softcap_log2, use_alibi, alibi_log2, BLOCK_N, PAGED, PAD_D, WIDE == 2, PAGE_TILES)
    else:
        # Rows past `stop` are clamped onto the last key (key 0 for an empty chunk): their
        # loads stay in bounds and on a mapped page, and their scores are masked. The page
        # numbers of a tile are loaded one tile ahead, so the K/V loads do not wait on the
        # block table (that lets Triton pipeline them).
        start, stop = _split_keys(lo, hi, split, num_splits, BLOCK_N, PAGE_TILES)
        if PAGE_TILES:
            last = tl.maximum(stop - 1, 0)
            last_col = last // page_size
            col, page = _tile_page(BlockTable, table_row, start, last, page_size)
        else:
            page, slot = _key_slots(BlockTable, table_row, tl.maximum(tl.minimum(start + offs_n, stop - 1), 0),
                                    page_size, PAGED)
        for start_n in range(start, stop, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < stop
            if PAGE_TILES:
                # The tile's page goes into the pointers, the keys' slots into 32-bit offsets
                # (decode_cuda.cpp keeps page_size * the slot strides below 2^31): per key, one
                # 32-bit product where page and slot cost 64-bit arithmetic (docs/notes/decode.md
                # D18); which slot each key reads, _page_tile_slots says.
                slot = _page_tile_slots(cols, lo, last, col, page_size)
                k_tile = KCache + (page * stride_kb + kv_head * stride_kh)
                v_tile = VCache + (page * stride_vb + kv_head * stride_vh)
                k_rows = slot * stride_ks.to(tl.int32)
                v_rows = slot * stride_vs.to(tl.int32)
                # The next tile's column without a division: this one's until a tile ends the page.
                col = tl.minimum(tl.where(start_n + BLOCK_N >= (col + 1) * page_size, col + 1, col), last_col)
                page = tl.load(BlockTable + table_row + col).to(tl.int64)
            else:
                k_tile = KCache
                v_tile = VCache
                k_rows = page * stride_kb + slot * stride_ks + kv_head * stride_kh
                v_rows = page * stride_vb + slot * stride_vs + kv_head * stride_vh
                page, slot = _key_slots(BlockTable, table_row, tl.minimum(cols + BLOCK_N, stop - 1), page_size,
                                        PAGED)
            if PAD_D:
                k = tl.load(k_tile + k_rows[None, :] + offs_d[:, None], mask=d_ok[:, None], other=0.0)
            else:
                k = tl.load(k_tile + k_rows[None, :] + offs_d[:, None])
            if KV_FP8 != 0:
                qk = tl.dot(q, k.to(q.dtype)) * row_scale[:, None]
            else:
                qk = tl.dot(q, k) * qk_scale
            if softcap_log2 > 0:
                qk = softcap_log2 * softcap_tanh(qk)
            if use_alibi != 0:
                qk -= alibi_log2[:, None] * tl.abs(token[:, None] + diagonal - cols[None, :]).to(tl.float32)
            visible = col_ok[None, :] & (cols[None, :] >= row_lo[:, None]) & (cols[None, :] <= row_hi[:, None])
            qk = tl.where(visible, qk, float("-inf"))
            p, m_i, l_i, acc = softmax_step(m_i, l_i, acc, qk, True)
            if PAD_D:
                v = tl.load(v_tile + v_rows[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
            else:
                v = tl.load(v_tile + v_rows[:, None] + offs_d[None, :])
            if KV_FP8 != 0:
                v = _fp8_values_operand(v, q.dtype, KV_FP8)
            acc = tl.dot(p.to(q.dtype), v, acc)

    out, lse = softmax_finish(acc, l_i, m_i)
    if KV_FP8 != 0:
        out = out * _descale(VDescale, batch, kv_head, stride_vdb, stride_vdh, use_v_descale)

    # Out and PartOut share the [batch, seqlen_q, heads, head_dim] row order.
    out_rows = (batch * seqlen_q + token) * num_heads + head
    lse_rows = (batch * num_heads + head) * seqlen_q + token
    o_mask = row_ok[:, None] & d_ok[None, :]
    if num_splits == 1:
        tl.store(Out + out_rows[:, None] * head_dim + offs_d[None, :], out.to(Out.dtype.element_ty), mask=o_mask)
        tl.store(Lse + lse_rows, lse, mask=row_ok)
    else:
        num_rows = tl.num_programs(2).to(tl.int64) * seqlen_q * num_heads
        part = PartOut + (split * num_rows + out_rows)[:, None] * head_dim + offs_d[None, :]
        tl.store(part, out, mask=o_mask)
        tl.store(PartLse + split * num_rows + lse_rows, lse, mask=row_ok)


@triton.jit
def attn_decode_merge(
    PartOut, PartLse, Out, Lse,
    num_rows, num_splits, seqlen_q, num_heads, head_dim,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr,
):
    """Grid (seqlen_q, heads, batch): one output row from num_splits fp32 partials.

    Partials of splits that saw no key have lse = -inf and weight 0. num_rows =
    batch * seqlen_q * heads (the stride of a split).
    """
    token = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    out_row = (batch * seqlen_q + token) * num_heads + head
    lse_row = (batch * num_heads + head) * seqlen_q + token
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim if PAD_D else offs_d < BLOCK_D

    # One pass (the online merge of triton_src/softmax.py): the lse and the partials of a
    # chunk of splits are loaded together, so the common case (num_splits <= BLOCK_S) is a
    # single round trip to memory.
    m = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), 0)
    total = tl.sum(tl.zeros([BLOCK_S], tl.float32), 0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        lse = tl.load(PartLse + s * num_rows + lse_row, mask=s_ok, other=float("-inf"))
        part = tl.load(PartOut + (s * num_rows + out_row)[:, None] * head_dim + offs_d[None, :],
                       mask=s_ok[:, None] & d_ok[None, :], other=0.0)
        m, shift, rescale = merge_rescale(m, tl.max(lse, 0))
        weight = tl.exp(lse - shift)  # exactly 0 for a split that saw no key
        # where(), not a product: a -inf split's partial is never trusted.
        acc = acc * rescale + tl.sum(tl.where(weight[:, None] > 0, weight[:, None] * part, 0.0), 0)
        total = total * rescale + tl.sum(weight, 0)
    denominator, lse = merge_finish(total, m)
    out = acc / denominator
    tl.store(Out + out_row * head_dim + offs_d, out.to(Out.dtype.element_ty), mask=offs_d < head_dim)
    tl.store(Lse + lse_row, lse)


# An FP8 cache's descale factors (float32 [batch, kv_heads] views, any strides), each with its
# use_ flag (0: none given, the factor is 1, the pointer a placeholder never read).
KV_APPEND = KernelSpec(kv_append, [
    tensor("KNew"), tensor("VNew"), tensor("KCache"), tensor("VCache"),
    index_tensor("CacheSeqlens"), index_tensor("BlockTable"), index_tensor("CacheBatchIdx"),
    view("RotaryCos"), view("RotarySin"),
    *strides("nk"), *strides("nv"), *strides("k"), *strides("v"), *strides("t", "b", aligned=False),
    i32("page_size"), i32("capacity"), i32("head_dim", multiple_of=8), i32("use_batch_idx"),
    i64("stride_ro"), i32("seqlen_ro"), i32("rotary_dim"), i32("rotary_interleaved"),
    CACHE_DESCALES,
])
ROTATE_QUERIES = KernelSpec(rotate_queries, [
    tensor("Q"), tensor("QRot"), index_tensor("CacheSeqlens"), view("RotaryCos"), view("RotarySin"),
    *strides("q"), i32("seqlen_q"), i32("num_heads"), i32("head_dim", multiple_of=8), i64("stride_ro"),
    i32("seqlen_ro"), i32("rotary_dim"), i32("rotary_interleaved"), i32("rotary_per_token"),
])
ATTN_DECODE_SPLIT = KernelSpec(attn_decode_split, [
    tensor("Q"), tensor("KCache"), tensor("VCache"), index_tensor("CacheSeqlens"), index_tensor("BlockTable"),
    index_tensor("CacheBatchIdx"), index_tensor("CacheLeftpad"),
    f32_tensor("PartOut"), f32_tensor("PartLse"), tensor("Out"), f32_tensor("Lse"),
    *strides("q"), *strides("k"), *strides("v"), *strides("t", "b", aligned=False),
    i32("seqlen_q"), i32("num_heads"), i32("kv_group_size"), i32("head_dim", multiple_of=8), i32("seqlen_new"),
    i32("capacity"), i32("page_size"), i32("num_splits"), WINDOW,
    # ALiBi's slopes without the attention kernels' alibi_offset: decode takes none.
    slopes_tensor("Alibi"), *strides("alibi", "bh", aligned=False), i32("use_alibi"),
    SCORES, SINKS, i32("use_batch_idx"), i32("use_leftpad"), CACHE_DESCALES,
])
ATTN_DECODE_MERGE = KernelSpec(attn_decode_merge, [
    f32_tensor("PartOut"), f32_tensor("PartLse"), tensor("Out"), f32_tensor("Lse"),
    i64("num_rows"), i32("num_splits"), i32("seqlen_q"), i32("num_heads"), i32("head_dim", multiple_of=8),
])
