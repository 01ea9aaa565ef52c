// epic_scheduler::TileDecode: the persistent scheduler's tile order (CUTLASS's sm90 mapping of a linear
// work index to a tile's (m, n, l): batch, cluster, swizzle group, raster direction) computed in 32-bit
// integers with its two non-power-of-two divisions prepared on the host. CUTLASS's computes it in 64-bit
// integers (each division a chain of wide multiplies) and reads the CTA's place in its cluster from
// special registers on every call. Every warp runs it once per tile (the producer between one tile's
// last TMA load and the next tile's first); this gives the same tiles in the same order in fewer
// dependent steps (docs/PERFORMANCE.md, "The scheduler's tile decode").
// Used where every linear index fits 31 bits (the scheduler falls back to CUTLASS's otherwise).
#pragma once

#include <cstdint>
#include "cutlass/fast_math.h"

namespace epic_scheduler {

struct TileDecode {
  bool batched = false;            // more than one problem in the batch: divide by the tiles of one
  cutlass::FastDivmod per_problem{1};
  uint32_t minor_shift = 0;        // log2 of the cluster's extent along the grouped dimension
  uint32_t major_shift = 0;        // and along the walked one
  uint32_t minor_size = 1, major_size = 1;
  uint32_t log_group = 0;          // log2 of the swizzle
  cutlass::FastDivmod clusters_major{1};   // clusters along the walked dimension
  bool along_n = true;             // raster order: walk N (group M) or walk M (group N)

  struct Tile {
    int32_t m, n, l;
  };

  // tile `index` (< the padded grid's tiles) of the CTA at (cta_m, cta_n) in its cluster: CUTLASS's
  // PersistentTileSchedulerSm90::get_work_idx_m_and_n after its batch division, step for step
  CUTLASS_HOST_DEVICE Tile operator()(uint32_t index, uint32_t cta_m, uint32_t cta_n) const {
    int l = 0, rest = int(index);
    if (batched) per_problem.fast_divmod(l, rest, int(index));
    uint32_t const in_grid = uint32_t(rest) >> minor_shift;
    uint32_t const cluster = in_grid >> major_shift;
    uint32_t const major_offset = in_grid & (major_size - 1);
    uint32_t const minor_offset = along_n ? cta_m : cta_n;
    uint32_t const in_group = cluster & ((1u << log_group) - 1);
    int group, major;
    clusters_major.fast_divmod(group, major, int(cluster >> log_group));
    int32_t const minor_idx = int32_t(((uint32_t(group) << log_group) + in_group) * minor_size + minor_offset);
    int32_t const major_idx = int32_t(uint32_t(major) * major_size + major_offset);
    return along_n ? Tile{minor_idx, major_idx, l} : Tile{major_idx, minor_idx, l};
  }
};

}  // namespace epic_scheduler
