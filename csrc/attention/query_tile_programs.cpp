#include "attention/query_tile_programs.h"

#include <limits>

#include "runtime/kernel_table.h"

namespace fattn {

namespace {
// A program's setup (descriptors, barriers, the first loads, the last store), in query tiles'
// time, as the H100 measured it (docs/notes/tuning.md T13).
constexpr int64_t kSetupTiles = 2;
// At most this many query tiles with a right edge: one tile per program measured faster
// (d256, 512 tokens, causal: two tiles per program ran at 0.86x).
constexpr int64_t kShortHeavyFirst = 4;
// Packed sequences: the looping kernel above this bucket (prefers_tile_loop).
constexpr int kPackedTileLoopAbove = 64;
}  // namespace

bool prefers_tile_loop(int arch, int bucket, int64_t seqlen_q, bool packed, bool right_edge) {
  if (packed) return bucket > kPackedTileLoopAbove;
  const runtime::TileLoopRows* rows = runtime::tile_loop_rows();
  for (size_t i = 0; i < runtime::tile_loop_rows_size(); ++i) {
    if (rows[i].arch == arch && rows[i].bucket == bucket) {
      return seqlen_q >= (right_edge ? rows[i].from_rows_right_edge : rows[i].from_rows);
    }
  }
  return true;
}

int64_t query_tile_programs(int64_t tiles, int64_t sequence_heads, int64_t sms, bool heavy_first) {
  if (tiles <= 1 || sms <= 0 || (heavy_first && tiles <= kShortHeavyFirst)) return tiles;
  // The fewest waves of the longest programs: waves x (tiles per program + setup). At least
  // two programs per pair: their loads of the pair's K and V coincide and share L2 (one per
  // pair read them from memory twice over and ran at 0.6-0.8x from 1k to 2k tokens).
  int64_t best = tiles, best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t g = 2; g <= tiles; ++g) {
    const int64_t waves = (sequence_heads * g + sms - 1) / sms;
    if (waves * (1 + kSetupTiles) >= best_cost) break;  // waves only grow with g
    const int64_t cost = waves * ((tiles + g - 1) / g + kSetupTiles);
    if (cost < best_cost) best = g, best_cost = cost;
  }
  return best;
}

}  // namespace fattn

// The forward's choices for a call, as the op makes them, for the tuner
// (tuning/tune_tile_loop.py) and tests through python/fattn/_library.py: whether it asks for the
// looping kernel first and how many programs per (head, sequence) the looping kernel gets.
extern "C" __attribute__((visibility("default"))) int fattn_prefers_tile_loop(int arch, int bucket, int64_t seqlen_q,
                                                                              int packed, int right_edge) {
  return fattn::prefers_tile_loop(arch, bucket, seqlen_q, packed != 0, right_edge != 0) ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) int64_t fattn_query_tile_programs(int64_t tiles,
                                                                                    int64_t sequence_heads,
                                                                                    int64_t sms, int heavy_first) {
  return fattn::query_tile_programs(tiles, sequence_heads, sms, heavy_first != 0);
}
