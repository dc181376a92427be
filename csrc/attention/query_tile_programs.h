// How many programs the attention forward gives each (head, sequence) when its kernel loops
// over query tiles (attn_fwd's TILE_LOOP variants, the Hopper forward): fewer programs than
// tiles set up their TMA descriptors and barriers once and load the next tile while they
// finish the last, and a grid of about one wave leaves no tail of short programs.
#pragma once

#include <cstdint>

namespace fattn {

// Whether the forward asks for a TILE_LOOP variant first, for `arch` and head-dim `bucket`.
// Where the build has both (sm_90, configs.json: d64, and d128 without score modifications),
// dense calls pick by length: the looping kernel from the query rows the offline tuner found
// it faster from (runtime::tile_loop_rows(): tuning/tune_tile_loop.py), without and with a
// right edge (causal, a window). Packed sequences, whose lengths differ, keep attn_fwd at d64,
// where the Hopper kernel measured slower for them (docs/notes/tuning.md T6), and the looping kernel above.
// Without a tuned row it asks for the looping kernel; where the build has one of the two, that
// one serves every length.
bool prefers_tile_loop(int arch, int bucket, int64_t seqlen_q, bool packed, bool right_edge);

// Programs per (head, sequence) for `tiles` query tiles each, `sequence_heads` (head, sequence)
// pairs and `sms` multiprocessors; `heavy_first`: later query tiles see more keys (causal, a
// right window edge). Returns `tiles` (one tile per program) where that measured faster.
int64_t query_tile_programs(int64_t tiles, int64_t sequence_heads, int64_t sms, bool heavy_first);

}  // namespace fattn
