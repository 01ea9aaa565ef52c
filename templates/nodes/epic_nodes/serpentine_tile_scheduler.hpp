// epic_scheduler::SerpentineTileScheduler (kernel option tile_order=serpentine): the grouped persistent
// scheduler (same grid, same tiles, same groups) with every odd group walked backwards
// (epic_nodes/serpentine_order.hpp says why). Each tile the base scheduler hands out is reflected in
// place, so the order is a permutation of the base's over the same padded grid: which tiles exist and
// whether a CTA has another one (is_last_tile) are the base's unchanged.
#pragma once

#include "epic_nodes/grouped_tile_scheduler.hpp"
#include "epic_nodes/serpentine_order.hpp"

namespace epic_scheduler {

struct SerpentinePersistentScheduler {};   // the tag GemmUniversal takes

// moves each tile the grouped scheduler decodes to its place in the serpentine order
struct SerpentineOrder {
  template <class Work, class Params>
  CUTLASS_HOST_DEVICE static Work apply(Work work, Params const& p) {
    if (work.is_valid()) {
      bool const along_n = p.raster_order_ == decltype(p.raster_order_)::AlongN;
      int32_t const major = int32_t(p.divmod_cluster_shape_major_.divisor);
      int32_t const minor = int32_t(p.divmod_cluster_shape_minor_.divisor);
      TileCoord t = serpentine_tile(work.M_idx, work.N_idx, along_n ? minor : major, along_n ? major : minor,
                                    int32_t(p.divmod_cluster_blk_major_.divisor), p.log_swizzle_size_, along_n);
      work.M_idx = t.m;
      work.N_idx = t.n;
    }
    return work;
  }
};

using SerpentineTileScheduler = GroupedTileSchedulerT<SerpentineOrder>;

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::SerpentinePersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::SerpentineTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
