"""The dropout keep-mask of the Triton kernels, a function of the (batch, head, row, key)
coordinates alone, so that the backward and the CPU implementation regenerate it exactly
(triton_src/dropout_sm90.py lays the same draws out for the Hopper kernels).
"""

import triton
import triton.language as tl

from .variants import BIAS_DROPOUT


@triton.jit
def _call_grid_to_tile_view(w, KEYS_FIRST: tl.constexpr):
    """dropout_keep's call grid [KG, 4, RG, 8] (KEYS_FIRST) or [RG, 8, KG, 4] with size-1 dims
    where the 7-d tile view has a, b and s."""
    if KEYS_FIRST:
        return w[:, None, :, None, :, None, :]
    else:
        return w[:, None, :, :, None, :, None]


@triton.jit
def dropout_keep(seed, batch, head, row0, key0, threshold,
                 BLOCK_ROWS: tl.constexpr, BLOCK_KEYS: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """The dropout keep-mask of query rows row0 + arange(BLOCK_ROWS) and keys key0 +
    arange(BLOCK_KEYS) (row0, key0 and both sizes multiples of 16, rows and keys counted from
    the sequence's start): bool [BLOCK_ROWS, BLOCK_KEYS], or [BLOCK_KEYS, BLOCK_ROWS] when
    KEYS_FIRST (the dK/dV kernel's transposed tiles).

    One Philox-4x32-10 call (Triton's tl.philox, keyed by the 64-bit `seed`) gives eight 16-bit
    draws to the 2 x 4 block of rows {i, i + 8} x keys {k, k + 1, k + 8, k + 9} (i % 16 < 8,
    k % 16 < 8, k even), at counter (key group (k // 16) * 4 + (k % 8) // 2, row group
    (i // 16) * 8 + i % 8, head, batch); row i + 8a and key k + 8b + s take half s (low 16 bits
    for s = 0) of word 2a + b. A key is kept when its draw >= threshold = round(dropout_p * 2**16).

    Why this block: it is what one thread holds of a tensor-core accumulator tile (rows r and
    r + 8, key pairs 8j + 2t + {0, 1}), so each call is made once, by the thread that uses all
    of its draws; the compiler lays the call grid out as a slice of that accumulator. The mask
    depends on the coordinates only, never on the tiling, so the backward and
    csrc/attention/dropout.cpp (the CPU implementation) regenerate it exactly."""
    RG: tl.constexpr = BLOCK_ROWS // 16
    KG: tl.constexpr = BLOCK_KEYS // 16
    # The call grid, one entry per Philox call: (row group, i % 8) x (key group, (k % 8) // 2).
    if KEYS_FIRST:
        key_group = (key0 // 16 + tl.arange(0, KG))[:, None, None, None] * 4 + tl.arange(0, 4)[None, :, None, None]
        row_group = (row0 // 16 + tl.arange(0, RG))[None, None, :, None] * 8 + tl.arange(0, 8)[None, None, None, :]
    else:
        row_group = (row0 // 16 + tl.arange(0, RG))[:, None, None, None] * 8 + tl.arange(0, 8)[None, :, None, None]
        key_group = (key0 // 16 + tl.arange(0, KG))[None, None, :, None] * 4 + tl.arange(0, 4)[None, None, None, :]
    zero = row_group * 0 + key_group * 0
    c0 = (zero + key_group).to(tl.uint32, bitcast=True)
    c1 = (zero + row_group).to(tl.uint32, bitcast=True)
    c2 = (zero + head).to(tl.uint32)
    c3 = (zero + batch).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    # Spread each call over its 8 elements: a = (i // 8) % 2, b = (k // 8) % 2, s = k % 2, in a
    # 7-d view of the tile whose reshape is the tile itself.
    w0 = _call_grid_to_tile_view(w0, KEYS_FIRST)
    w1 = _call_grid_to_tile_view(w1, KEYS_FIRST)
    w2 = _call_grid_to_tile_view(w2, KEYS_FIRST)
    w3 = _call_grid_to_tile_view(w3, KEYS_FIRST)
    two = tl.arange(0, 2)
    if KEYS_FIRST:  # [KG, b, 4, s, RG, a, 8]
        a = two[None, None, None, None, None, :, None]
        b = two[None, :, None, None, None, None, None]
        s = two[None, None, None, :, None, None, None]
    else:  # [RG, a, 8, KG, b, 4, s]
        a = two[None, :, None, None, None, None, None]
        b = two[None, None, None, None, :, None, None]
        s = two[None, None, None, None, None, None, :]
    word = tl.where(a == 0, tl.where(b == 0, w0, w1), tl.where(b == 0, w2, w3))
    draws = (word >> (s * 16).to(tl.uint32)) & 0xFFFF
    keep = draws >= threshold.to(tl.uint32)
    if KEYS_FIRST:
        return tl.reshape(keep, [BLOCK_KEYS, BLOCK_ROWS])
    else:
        return tl.reshape(keep, [BLOCK_ROWS, BLOCK_KEYS])


@triton.jit
def dropout_seed(DropoutSeed, dropout_threshold, SCORE_MOD: tl.constexpr):
    """The dropout's int64 seed, read from the device (DropoutSeed) by the bias_dropout variants
    when there is dropout (dropout_threshold > 0); 0 otherwise, where nothing draws from it."""
    if SCORE_MOD == BIAS_DROPOUT:
        seed = tl.load(DropoutSeed, mask=dropout_threshold > 0, other=0)
    else:
        seed = 0
    return seed
