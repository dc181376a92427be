#include "attention/segment_spans.h"

#include <torch/csrc/stable/ops.h>

#include "common/kernel_choice.h"

namespace fattn {

using kernels::segment_spans;  // the kernel; tile_segment_spans launches it

Tensor tile_segment_spans(const char* op, const AttentionVariant& variant, const AttentionShape& s, SpanOver over,
                          int64_t tile) {
  const bool over_keys = over == SpanOver::kKeyTiles;
  const Tensor& q = *variant.q_segment_ids;
  const Tensor& kv = *variant.kv_segment_ids;
  const Tensor& own = over_keys ? kv : q;
  const Tensor& other = over_keys ? q : kv;
  const int64_t seqlen_own = over_keys ? s.seqlen_k : s.seqlen_q;
  const int64_t tiles = ceil_div(seqlen_own, tile);
  // The kernel reads int32 ids alone: configs.json builds it once per arch, as fp32 with no
  // head-dim bucket.
  const auto kernel = choose<segment_spans>(op, own.get_device_index(), ScalarType::Float, 0, {});
  const runtime::Grid grid{dim(tiles), dim(s.batch), 1};
  check_grid(op, grid, over_keys ? "key tiles" : "query tiles", "batch", "nothing");
  Tensor spans = torch::stable::new_empty(own, {s.batch, tiles, 4}, ScalarType::Int);
  if (tiles == 0 || s.batch == 0) return spans;
  kernels::launch_segment_spans(kernel, grid, {
      .OwnIds = own.data_ptr(), .OtherIds = other.data_ptr(), .Spans = spans.data_ptr(),
      .stride_ownb = kernel_stride(own, 0), .stride_otherb = kernel_stride(other, 0), .stride_spanb = tiles * 4,
      .seqlen_own = seqlen_own, .seqlen_other = over_keys ? s.seqlen_q : s.seqlen_k, .tile = tile});
  return spans;
}

}  // namespace fattn
