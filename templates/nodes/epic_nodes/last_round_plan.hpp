// epic_scheduler::LastRoundPlan: which k-blocks of the last round's tiles each cluster of a persistent
// kernel computes when that round is split along K (tile_order=split_last).
//
// A persistent grid of G CTAs walks P tiles (CUTLASS's linear order, P and G multiples of the cluster
// size cs). When P is not a multiple of G, the last round has fewer tiles than CTAs and the others sit
// idle while it runs (docs/PERFORMANCE.md, "The last round of tiles"). Here every CTA takes
// floor(P / G) whole tiles; the last round's L = (P mod G) / cs cluster tiles, Kb k-blocks each, are laid
// end to end (W = L * Kb k-blocks) and cut into C = G / cs equal ranges, cluster c taking
// [c * W / C, (c + 1) * W / C). Since L < C, a range is shorter than a tile: it lies in one tile or
// runs from the end of one into the start of the next. Its pieces:
// - a piece that ends a tile is that tile's final piece: it waits for the tile's other pieces (all in
//   clusters before it), adds their partial accumulators in cluster order (the same sum every run), and
//   runs the epilogue;
// - any other piece stores its partial accumulator and raises the tile's count.
// A cluster computes its partial piece (the head of the later tile) before its final one, so no piece
// waits on a piece that itself waits: the clusters a final piece waits for computed their partial
// piece first. Every CTA of a cluster takes the same pieces (its own tile of the cluster tile), which
// keeps the cluster's multicast loads in step.
// Pure integer arithmetic, host and device: tests/test_last_round_plan.py runs it on the host against
// a model of this description.
#pragma once

#include <cstdint>

#ifndef CUTLASS_HOST_DEVICE
#define CUTLASS_HOST_DEVICE
#endif

namespace epic_scheduler {

struct LastRoundPlan {
  // a piece of the last round: cluster tile `tile` (0 .. L-1), k-blocks [k_begin, k_begin + k_count)
  struct Piece {
    uint32_t tile;
    uint32_t k_begin;
    uint32_t k_count;
    bool final;
  };

  bool split = false;         // false: the last round runs whole tiles, as CUTLASS's order does
  uint32_t rounds = 0;        // whole tiles per CTA when split
  uint32_t clusters = 1;      // C
  uint32_t cluster_tiles = 0; // L
  uint32_t k_blocks = 1;      // Kb

  // tiles P, CTAs G (a multiple of cs), cluster size cs, k-blocks per tile Kb; split only where every
  // cluster's range has at least min_share k-blocks
  CUTLASS_HOST_DEVICE static LastRoundPlan make(uint32_t tiles, uint32_t grid, uint32_t cs, uint32_t kb,
                                                uint32_t min_share) {
    LastRoundPlan p;
    if (grid == 0 || cs == 0 || grid % cs != 0 || tiles % cs != 0) return p;
    p.rounds = tiles / grid;
    p.clusters = grid / cs;
    p.cluster_tiles = (tiles % grid) / cs;
    p.k_blocks = kb;
    uint64_t const work = uint64_t(p.cluster_tiles) * kb;
    p.split = p.cluster_tiles > 0 && work >= uint64_t(min_share) * p.clusters;
    return p;
  }

  CUTLASS_HOST_DEVICE uint64_t range_begin(uint32_t cluster) const {
    return uint64_t(cluster) * cluster_tiles * k_blocks / clusters;
  }

  // the pieces of `cluster`'s range, partial one first; returns how many (0, 1 or 2)
  CUTLASS_HOST_DEVICE int pieces(uint32_t cluster, Piece out[2]) const {
    if (!split) return 0;
    uint64_t const a = range_begin(cluster), b = range_begin(cluster + 1);
    if (a >= b) return 0;
    uint32_t const first = uint32_t(a / k_blocks), last = uint32_t((b - 1) / k_blocks);
    uint64_t const first_start = uint64_t(first) * k_blocks;
    if (first == last) {
      out[0] = Piece{first, uint32_t(a - first_start), uint32_t(b - a), b == first_start + k_blocks};
      return 1;
    }
    uint64_t const last_start = uint64_t(last) * k_blocks;
    out[0] = Piece{last, 0u, uint32_t(b - last_start), false};   // head of the later tile
    out[1] = Piece{first, uint32_t(a - first_start), uint32_t(last_start - a), true};
    return 2;
  }

  // CUTLASS's linear index of a CTA's first tile (its persistent scheduler's, grouped_tile_scheduler.hpp):
  // the grid puts a cluster's CTAs on cs consecutive indices, the first a multiple of cs
  CUTLASS_HOST_DEVICE static uint32_t first_index(uint32_t bx, uint32_t by, uint32_t gx, uint32_t gy, bool along_n) {
    return along_n ? bx + by * gx : bx * gy + by;
  }

  // CUTLASS's linear index of the tile a piece of cluster tile `tile` is on, for the CTA of rank `rank`
  // in its cluster: the index that CTA's rank would take in the last round
  CUTLASS_HOST_DEVICE uint32_t piece_index(uint32_t tile, uint32_t grid, uint32_t cs, uint32_t rank) const {
    return rounds * grid + tile * cs + rank;
  }

  // the first cluster whose range reaches into cluster tile `tile` (the final piece's cluster waits for
  // the pieces of this one up to itself, exclusive)
  CUTLASS_HOST_DEVICE uint32_t first_contributor(uint32_t tile) const {
    uint64_t const start = uint64_t(tile) * k_blocks;
    // the cluster whose range holds k-block `start`: largest c with range_begin(c) <= start
    uint32_t c = uint32_t((start * clusters) / (uint64_t(cluster_tiles) * k_blocks));
    while (c + 1 < clusters && range_begin(c + 1) <= start) ++c;
    while (c > 0 && range_begin(c) > start) --c;
    return c;
  }
};

}  // namespace epic_scheduler
