#include "attention/segment_spans.h"

#include <torch/csrc/stable/ops.h>

#include "common/kernel_choice.h"

namespace fattn {

using kernels::segment_spans;  // the kernel; kernel_segment_spans launches it

KernelSpans kernel_segment_spans(const char* op, const AttentionVariant& variant, const AttentionShape& s,
                                 SpanOver over, int64_t tile, const Tensor& placeholder) {
  const KernelSegments ids = kernel_segments(variant, placeholder);
  if (!ids.use_segments) return {std::nullopt, placeholder.data_ptr(), 0};
  const bool over_keys = over == SpanOver::kKeyTiles;
  const Tensor& own = over_keys ? *variant.kv_segment_ids : *variant.q_segment_ids;
  const int64_t seqlen_own = over_keys ? s.seqlen_k : s.seqlen_q;
  const int64_t tiles = ceil_div(seqlen_own, tile);
  // The kernel reads int32 ids alone: configs.json builds it once per arch, as fp32 with no
  // head-dim bucket.
  const auto kernel = choose<segment_spans>(op, own.get_device_index(), ScalarType::Float, 0, {});
  const runtime::Grid grid{dim(tiles), dim(s.batch), 1};
  check_grid(op, grid, over_keys ? "key tiles" : "query tiles", "batch", "nothing");
  Tensor spans = torch::stable::new_empty(own, {s.batch, tiles, 4}, ScalarType::Int);
  if (tiles == 0 || s.batch == 0) return {spans, spans.data_ptr(), 0};
  kernels::launch_segment_spans(kernel, grid, {
      .OwnIds = over_keys ? ids.kv : ids.q, .OtherIds = over_keys ? ids.q : ids.kv, .Spans = spans.data_ptr(),
      .stride_ownb = over_keys ? ids.stride_kv : ids.stride_q,
      .stride_otherb = over_keys ? ids.stride_q : ids.stride_kv,
      .stride_spanb = tiles * 4, .seqlen_own = seqlen_own, .seqlen_other = over_keys ? s.seqlen_q : s.seqlen_k,
      .tile = tile});
  return {spans, spans.data_ptr(), tiles * 4};
}

}  // namespace fattn
