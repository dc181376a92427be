"""Row tiles moved by TMA between global and shared memory, from either kind of source the Hopper
kernels take (forward_sm90.py, backward_sm90.py, backward_dq_sm90.py):

- `(descriptor,)`: a descriptor the kernel made over one (sequence, head)'s rows, a
  [seqlen, head_dim] matrix; a tile's coordinates are [row, 0];
- `(map, batch, head)`: a rank-4 map the host made over the whole dense [batch, seqlen, heads,
  head_dim] tensor (HOST_MAPS); a tile's coordinates are [batch, row, head, 0], and the 2-D
  shared tile is viewed as the map's [1, rows, 1, columns] box.

load_group_rows reads one head of a GQA group (the dK/dV kernel's Q and dO): from a descriptor
over the group's [seqlen, group, head_dim] rows at [row, g, 0], or from a map whose source names
the group's first head, at [batch, row, head + g, 0].

Both zero-fill rows past the sequence's end and columns past head_dim on loads and clip them on
stores, so the kernel reads the same tiles either way. A tuple's length tells the kinds apart
when the kernel is compiled, so the code around a copy is the same for both; `source[0]`'s
block_type.nbytes is what one copy moves, for either.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma


@gluon.jit
def load_rows(source, row, barrier, smem):
    """TMA load of rows [row, row + the box's rows) of `source` into `smem`, completing on `barrier`."""
    if len(source) == 3:
        tile_map, batch, head = source
        box: gl.constexpr = tile_map.block_type.shape
        tma.async_copy_global_to_shared(tile_map, [batch, row, head, 0], barrier,
                                        smem._reinterpret(smem.dtype, box, tile_map.layout))
    else:
        tma.async_copy_global_to_shared(source[0], [row, 0], barrier, smem)


@gluon.jit
def store_rows(source, row, smem):
    """TMA store of `smem` to rows [row, row + the box's rows) of `source`."""
    if len(source) == 3:
        tile_map, batch, head = source
        box: gl.constexpr = tile_map.block_type.shape
        tma.async_copy_shared_to_global(tile_map, [batch, row, head, 0],
                                        smem._reinterpret(smem.dtype, box, tile_map.layout))
    else:
        tma.async_copy_shared_to_global(source[0], [row, 0], smem)


@gluon.jit
def load_group_rows(source, row, g, barrier, smem):
    """TMA load of rows [row, row + the box's rows) of head g of the group `source` covers into
    `smem`, a [rows, 1, columns] tile, completing on `barrier`."""
    if len(source) == 3:
        tile_map, batch, first_head = source
        load_rows((tile_map, batch, first_head + g), row, barrier, smem)
    else:
        tma.async_copy_global_to_shared(source[0], [row, g, 0], barrier, smem)
