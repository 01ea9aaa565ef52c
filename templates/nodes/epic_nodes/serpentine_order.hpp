// epic_scheduler::serpentine_tile: the serpentine tile order's reflection, as plain integer arithmetic
// (no CUTLASS types), so that a host test can check it is a permutation of the grid
// (tests/test_tile_order.py compiles this header with g++).
//
// The persistent scheduler's order (CUTLASS's, epic's grouped grid) splits one dimension of the tile
// grid into groups of `group` clusters and walks each group along the other dimension, one position
// of the walk after another. Serpentine walks every odd group backwards, so the first tiles of a group
// share their operand from the walked dimension (B's columns when walking N) with the last tiles of the
// group before, still in L2 (QuACK's sm90 tile scheduler orders its tiles so).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EPIC_ORDER_HD __host__ __device__
#else
#define EPIC_ORDER_HD
#endif

namespace epic_scheduler {

struct TileCoord {
  int32_t m, n;
};

// m, n: a tile of the linear order (in tiles, including the CTA's offset within its cluster).
// cluster_m, cluster_n: the cluster's shape; walk_clusters: how many clusters long the walk is (the
// walked dimension's tile count over its cluster extent); log_group: log2 of the group's width in
// clusters; along_n: the walk runs along N (groups of rows), else along M (groups of columns).
EPIC_ORDER_HD inline TileCoord serpentine_tile(int32_t m, int32_t n, int32_t cluster_m, int32_t cluster_n,
                                               int32_t walk_clusters, int32_t log_group, bool along_n) {
  int32_t const walked = along_n ? n : m;           // the tile's position along the walk
  int32_t const grouped = along_n ? m : n;          // and across it
  int32_t const walk_cluster = along_n ? cluster_n : cluster_m;
  int32_t const group_cluster = along_n ? cluster_m : cluster_n;
  int32_t const group = (grouped / group_cluster) >> log_group;
  if ((group & 1) == 0) {
    return {m, n};
  }
  int32_t const reflected = (walk_clusters - 1 - walked / walk_cluster) * walk_cluster + walked % walk_cluster;
  return along_n ? TileCoord{m, reflected} : TileCoord{reflected, n};
}

}  // namespace epic_scheduler
