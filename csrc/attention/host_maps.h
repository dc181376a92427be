// Which calls take their tensors as TMA maps the host makes (the HOST_MAPS variants of the Hopper
// forward, dK/dV and dQ kernels), so that the kernels' programs make no descriptors of their own:
// dense 16-bit calls up to a length, whose tensors a map takes, where the driver makes maps.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/kernel_choice.h"

namespace fattn {

// The forward's limit: at 1k rows the maps ran 1.05-1.11x, at 2k 1.02-1.03x, at d128 4k
// 0.97-0.99x (docs/notes/tuning.md T39, T40).
constexpr int64_t kHostMapsUpToRows = 2048;

// The backward's (attn_bwd_dkdv's and attn_bwd_dq's HOST_MAPS), over the query rows as the
// forward's: the longest length measured. On the H200 the backward with maps ran 1.10-1.19x at
// 1k, 1.05-1.12x at 2k, 1.02-1.06x at 4k, 1.00-1.03x at 8k and 16k, no row below 0.996x
// (docs/notes/tuning.md T41): its programs loop over every query tile, so the setup they save
// weighs less as the sequence grows but never turns into a loss, unlike the forward's at 4k.
constexpr int64_t kBackwardHostMapsUpToRows = 16384;

// Whether a call with `seqlen_q` query rows asks for the HOST_MAPS variant first, up to
// `up_to_rows` rows: not for packed sequences (a map does not stop at a sequence's end), FP8
// inputs or seqused_k, and only where every one of `tensors` (dense [batch, seqlen, heads,
// head_dim]) fits a map.
bool wants_host_maps(int64_t seqlen_q, int64_t up_to_rows, bool packed, bool fp8, bool seqused_k,
                     std::initializer_list<const Tensor*> tensors);

}  // namespace fattn
