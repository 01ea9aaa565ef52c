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

class SerpentineTileScheduler : public GroupedTileScheduler {
  using Base = GroupedTileScheduler;

 public:
  using Base::Base;
  using Params = Base::Params;
  using Arguments = Base::Arguments;
  using WorkTileInfo = Base::WorkTileInfo;

  CUTLASS_DEVICE WorkTileInfo reflected(WorkTileInfo work) const {
    if (work.is_valid()) {
      Params const& p = scheduler_params;
      bool const along_n = p.raster_order_ == RasterOrder::AlongN;
      int32_t const major = int32_t(p.divmod_cluster_shape_major_.divisor);
      int32_t const minor = int32_t(p.divmod_cluster_shape_minor_.divisor);
      TileCoord t = serpentine_tile(work.M_idx, work.N_idx, along_n ? minor : major, along_n ? major : minor,
                                    int32_t(p.divmod_cluster_blk_major_.divisor), p.log_swizzle_size_, along_n);
      work.M_idx = t.m;
      work.N_idx = t.n;
    }
    return work;
  }

  // what the kernels call for a tile (the base's, reflected)
  CUTLASS_DEVICE WorkTileInfo get_current_work_for_linear_idx(uint64_t linear_idx) const {
    return reflected(Base::get_current_work_for_linear_idx(linear_idx));
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return reflected(Base::get_current_work()); }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) {
    if (continue_current_work(work)) {
      return cute::make_tuple(work, true);
    }
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work, TileSchedulerPipeline&, TileSchedulerPipelineState) {
    return fetch_next_work(work);
  }
};

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::SerpentinePersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::SerpentineTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
