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

// The spans as a kernel takes them (SegmentSpans, stride_spanb): int32 [batch, tiles, 4] on the
// current stream, kept alive in `spans` across the attention launch; `placeholder`'s address
// and nothing launched when the call has no segment ids.
struct KernelSpans {
  std::optional<Tensor> spans;
  const void* data;
  int64_t stride_b;
};

enum class SpanOver { kQueryTiles, kKeyTiles };

// Query tiles get the keys they need (forward, dQ); key tiles the queries (dK/dV). Call it after
// every check: it launches.
KernelSpans kernel_segment_spans(const char* op, const AttentionVariant& variant, const AttentionShape& s,
                                 SpanOver over, int64_t tile, const Tensor& placeholder);

}  // namespace fattn
