// Under segment ids, the span of the other side each tile needs (triton_src/segments.py): for
// every tile of `tile` rows, the positions from the first to the last whose id lies within the
// range of the tile's own ids, and the run among them that shares the tile's one id. The
// attention kernels visit only the tiles of the span and mask only those outside the run, so a
// packed row of documents costs what its documents cost, not the whole square.
#pragma once

#include <optional>

#include "attention/attention_shape.h"
#include "attention/attention_variant.h"

namespace fattn {

enum class SpanOver { kQueryTiles, kKeyTiles };

// Each tile's span of the other side under the call's segment ids (which it must have), as the
// attention kernels read them (SegmentSpans): int32 [batch, tiles, 4], written on the current
// stream. Query tiles get the keys they need (forward, dQ); key tiles the queries (dK/dV). Call it
// after every check: it launches.
Tensor tile_segment_spans(const char* op, const AttentionVariant& variant, const AttentionShape& s, SpanOver over,
                          int64_t tile);

}  // namespace fattn
