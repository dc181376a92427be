"""The span of the other side that each tile needs under segment ids.

With q_segment_ids/kv_segment_ids, query i sees key j only if their ids are equal, so a query
tile needs only the keys whose ids lie within the range of its own ids, and likewise a key tile
in the backward needs only such queries. segment_spans finds, for every tile of one side, the
first and the last position of the other side whose id lies in that range; the attention kernels
then visit only the tiles from the first to the last (masks.segment_span) instead of every
tile. For packed documents (ids that never decrease along the sequence) the span is exactly the
documents the tile touches; for any other ids it is a superset, and the per-score mask still
decides. When every row of the tile has one id and the positions of the other side with that id
form one run, the tiles inside the run need no mask at all: segment_spans returns the run too. Ids do not depend on the head, so one launch per direction serves every head, and the
search runs once per call instead of once per program of every head.
"""

import triton
import triton.language as tl

from .spec import KernelSpec, i32, i64, index_tensor

INT32_MAX = tl.constexpr(2147483647)
INT32_MIN = tl.constexpr(-2147483648)


@triton.jit
def segment_spans(
    OwnIds, OtherIds, Spans,
    stride_ownb, stride_otherb, stride_spanb,
    seqlen_own, seqlen_other, tile,
    BLOCK: tl.constexpr,
):
    """Grid (cdiv(seqlen_own, tile), batch). OwnIds int32 [batch, seqlen_own] and OtherIds
    [batch, seqlen_other], rows contiguous. Writes Spans[b, t] (int32 [batch, tiles, 4], rows
    contiguous) = (first, last + 1, run_first, run_last + 1): the first and last position j of
    OtherIds[b] with min <= OtherIds[b, j] <= max over the ids of own rows [t * tile,
    (t + 1) * tile), (0, 0) when there is none; and the same span again as the run when min ==
    max and every position between first and last has that id, else (0, 0). Each position is
    read once; the running bounds stay elementwise until the end, so the loop's loads do not
    wait on a reduction."""
    t = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    own = OwnIds + batch * stride_ownb
    other = OtherIds + batch * stride_otherb
    start = t * tile
    stop = tl.minimum(start + tile, seqlen_own)

    id_min = tl.full([BLOCK], INT32_MAX, tl.int32)
    id_max = tl.full([BLOCK], INT32_MIN, tl.int32)
    for i in range(start, stop, BLOCK):
        rows = i + offs
        inside = rows < stop
        ids = tl.load(own + rows, mask=inside, other=0)
        id_min = tl.where(inside, tl.minimum(id_min, ids), id_min)
        id_max = tl.where(inside, tl.maximum(id_max, ids), id_max)
    lowest = tl.min(id_min, axis=0)
    highest = tl.max(id_max, axis=0)

    first = tl.full([BLOCK], INT32_MAX, tl.int32)
    last = tl.full([BLOCK], -1, tl.int32)
    hits = tl.zeros([BLOCK], tl.int32)
    for j in range(0, seqlen_other, BLOCK):
        cols = j + offs
        ids = tl.load(other + cols, mask=cols < seqlen_other, other=0)
        hit = (cols < seqlen_other) & (ids >= lowest) & (ids <= highest)
        first = tl.where(hit, tl.minimum(first, cols), first)
        last = tl.where(hit, tl.maximum(last, cols), last)
        hits += hit.to(tl.int32)
    span_first = tl.min(first, axis=0)
    span_last = tl.max(last, axis=0)
    found = span_last >= 0
    # One id on this side, and nothing else between its first and last position on the other.
    one_run = found & (lowest == highest) & (tl.sum(hits, axis=0) == span_last - span_first + 1)
    span = Spans + batch * stride_spanb + 4 * t
    tl.store(span, tl.where(found, span_first, 0))
    tl.store(span + 1, tl.where(found, span_last + 1, 0))
    tl.store(span + 2, tl.where(one_run, span_first, 0))
    tl.store(span + 3, tl.where(one_run, span_last + 1, 0))


SEGMENT_SPANS = KernelSpec(segment_spans, [
    index_tensor("OwnIds"), index_tensor("OtherIds"), index_tensor("Spans"),
    i64("stride_ownb"), i64("stride_otherb"), i64("stride_spanb"),
    i32("seqlen_own"), i32("seqlen_other"), i32("tile"),
])
