// How many programs the attention forward gives each (head, sequence) when its kernel loops
// over query tiles (attn_fwd's TILE_LOOP variants, the Hopper forward): fewer programs than
// tiles set up their TMA descriptors and barriers once and load the next tile while they
// finish the last, and a grid of about one wave leaves no tail of short programs.
#pragma once

#include <cstdint>

namespace fattn {

// Whether the forward asks for a TILE_LOOP variant first. Where the build has both (sm_90,
// configs.json: d64, and d128 without score modifications), it picks by length:
// - d64: dense queries of at least 4096 rows run the looping kernel, which measured 1.02-1.10x
//   attn_fwd there on the H100 (NOTES.md T14) and 0.47-1.00x from 512 to 2048 rows (T13); with a
//   right edge (causal, a window) from 8192 rows, since its 192-row tiles ran 4096 causal rows at
//   0.93x the 128-row ones, where attn_fwd ran at 0.93-0.98x (T14, T18). Packed sequences, where
//   the Hopper kernel measured slower than attn_fwd at d64 (T6), keep attn_fwd.
// - above d64: the looping kernel but for up to 512 rows with a right edge, where attn_fwd ran
//   1.17x it at d128 on the H200 (at 1024 rows 0.89x: NOTES.md T25); packed sequences keep the
//   looping kernel.
// Where the build has one of the two, it serves every length.
bool prefers_tile_loop(int64_t seqlen_q, int64_t head_dim, bool packed, bool right_edge);

// Programs per (head, sequence) for `tiles` query tiles each, `sequence_heads` (head, sequence)
// pairs and `sms` multiprocessors; `heavy_first`: later query tiles see more keys (causal, a
// right window edge). Returns `tiles` (one tile per program) where that measured faster.
int64_t query_tile_programs(int64_t tiles, int64_t sequence_heads, int64_t sms, bool heavy_first);

}  // namespace fattn
