"""The dropout keep-mask for the Hopper (Gluon) kernels: dropout.dropout_keep's draws, bit for
bit, laid out as a wgmma accumulator tile.

dropout.dropout_keep gives each Philox call the 2 x 4 block of rows {i, i + 8} x keys {k, k + 1,
k + 8, k + 9} that one thread of a tensor-core accumulator holds. Triton finds that layout
itself; Gluon's tensors carry explicit layouts, so here the call grid is laid out so that each
thread makes the calls whose draws it keeps, and the draws are spread over the tile by joins,
a reshape and a permute whose layouts Gluon infers. For a 64-row accumulator tile of one
warpgroup (queries as rows: the forward and the dQ kernel) the result is that accumulator's
layout exactly (`assert_trivial`: no data moves); for the dK/dV kernel's transposed tiles it goes
through a shared-memory buffer of the caller's. Not through a layout conversion's own scratch: in
a warp-specialized kernel Triton 3.6 may place that scratch where the default partition's
arguments to the other partitions lie, which those read after the default partition has gone on
(compute-sanitizer's racecheck finds it; docs/notes/tuning.md T30).
"""

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# One warpgroup's call grid over [rows // 2, keys // 4]: (row group, i % 8) down the lanes'
# three high bits and the warps, (key group, (k % 8) // 2) along the lanes' two low bits and the
# registers, as a wgmma accumulator's rows and key pairs are.
_CALL_GRID = gl.constexpr(gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0]))


@gluon.jit
def dropout_keep(seed, batch, head, row0, key0, threshold, layout: gl.constexpr, ROWS: gl.constexpr,
                 KEYS: gl.constexpr, KEYS_FIRST: gl.constexpr, scratch=None):
    """dropout.dropout_keep (its draw of every (row, key) of the tile at row0, key0, multiples of
    16, counted from the sequence's start): bool [ROWS, KEYS] in `layout`, or [KEYS, ROWS] when
    KEYS_FIRST, transposed through `scratch`, an int8 [ROWS, KEYS] shared buffer of the calling
    warpgroup's own. ROWS is 64, one warpgroup's rows."""
    gl.static_assert(ROWS == 64, "one warpgroup's 64 rows")
    # Call (r, c) serves rows i with (i // 16) * 8 + i % 8 = r and keys k with
    # (k // 16) * 4 + (k % 8) // 2 = c.
    r = row0 // 2 + gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, _CALL_GRID))
    c = key0 // 4 + gl.arange(0, KEYS // 4, layout=gl.SliceLayout(0, _CALL_GRID))
    zero = r[:, None] * 0 + c[None, :] * 0
    c0 = (zero + c[None, :]).to(tl.uint32, bitcast=True)
    c1 = (zero + r[:, None]).to(tl.uint32, bitcast=True)
    c2 = (zero + head).to(tl.uint32)
    c3 = (zero + batch).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, c0, c1, c2, c3)
    # Row i + 8a and key k + 8b + s take half s of word 2a + b: [r, c, b, a, s].
    words = gl.join(gl.join(w0, w1), gl.join(w2, w3))
    draws = gl.join(words & 0xFFFF, words >> 16)
    keep = draws >= threshold.to(tl.uint32)
    # r = 8 * (i // 16) + i % 8 and c = 4 * (k // 16) + (k % 8) // 2: split them, then order the
    # pieces as the tile's row (i // 16, a, i % 8) and key (k // 16, b, (k % 8) // 2, s) bits.
    keep = gl.reshape(keep, [ROWS // 16, 8, KEYS // 16, 4, 2, 2, 2])
    keep = gl.permute(keep, (0, 5, 1, 2, 4, 3, 6))
    keep = gl.reshape(keep, [ROWS, KEYS])
    if KEYS_FIRST:
        scratch.store(keep.to(gl.int8))
        gl.thread_barrier()  # every thread's part is there
        keep = scratch.permute((1, 0)).load(layout) != 0
        gl.thread_barrier()  # and read, before the next tile's is stored
        return keep
    else:
        return gl.convert_layout(keep, layout, assert_trivial=True)
