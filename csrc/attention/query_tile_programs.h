// How many programs the attention forward gives each (head, sequence) when its kernel loops
// over query tiles (runtime::Variant::loops_over_tiles, the Hopper forward): fewer programs
// than tiles set up their TMA descriptors and barriers once and load the next tile while they
// finish the last, and a grid of about one wave leaves no tail of short programs.
#pragma once

#include <cstdint>

namespace fattn {

// Programs per (head, sequence) for `tiles` query tiles each, `sequence_heads` (head, sequence)
// pairs and `sms` multiprocessors; `heavy_first`: later query tiles see more keys (causal, a
// right window edge). Returns `tiles` (one tile per program) where that measured faster.
int64_t query_tile_programs(int64_t tiles, int64_t sequence_heads, int64_t sms, bool heavy_first);

}  // namespace fattn
