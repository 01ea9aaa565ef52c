// epic_scheduler::GroupedPersistentScheduler: CUTLASS's sm90 persistent tile scheduler with a swizzle
// that pads only the dimension it groups. (Printed outside the kernel's namespace, as it specializes
// CUTLASS's selector; not in epic_nodes, which the kernel's namespace has too.)
//
// CUTLASS's scheduler walks the tiles along one dimension (the raster order) in groups of `swizzle`
// clusters of the other, so that one wave's operands stay in L2. It rounds *both* dimensions' tile
// counts up to swizzle x cluster and runs the padding tiles like real ones (a padding tile costs a
// wave slot): at N = 14336 on 128x192 tiles, swizzle 8 turns 75 columns into 80. Only the grouped
// dimension needs the rounding: the walk along the other never leaves it. This scheduler rounds the
// grouped dimension only (to swizzle x cluster) and the walked one to the cluster, then reuses
// CUTLASS's tile order unchanged. Raster "heuristic" resolves as CUTLASS's does, from the tile counts.
// epic/plan/config.py (padded_tiles) models the grid this makes.
#pragma once

#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace epic_scheduler {

struct GroupedPersistentScheduler {};   // the tag GemmUniversal takes

class GroupedTileScheduler : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  using Base::Base;
  using Params = Base::Params;
  using Arguments = Base::Arguments;
  using RasterOrder = Base::RasterOrder;
  using RasterOrderOptions = Base::RasterOrderOptions;

  struct Grid {
    dim3 blocks;               // CTAs per dimension, padded
    int log_group;             // log2 of the swizzle CUTLASS's rule allows at these tile counts
    RasterOrderOptions order;  // resolved: AlongN walks N and groups M; AlongM walks M and groups N
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Grid grouped_grid(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster, Arguments const& args) {
    dim3 blocks = Base::get_tiled_cta_shape_mnl(problem, tile, cluster);   // each rounded to the cluster
    int log_group = Params::get_log_swizzle_size(blocks.x, blocks.y, args.max_swizzle_size);
    RasterOrder order = Params::get_rasterization_order(blocks.x, blocks.y, args.raster_order);
    int group = 1 << log_group;
    if (order == RasterOrder::AlongN) {
      blocks.x = cutlass::round_up(blocks.x, group * int(cute::size<0>(cluster)));
    } else {
      blocks.y = cutlass::round_up(blocks.y, group * int(cute::size<1>(cluster)));
    }
    return {blocks, log_group, order == RasterOrder::AlongN ? RasterOrderOptions::AlongN : RasterOrderOptions::AlongM};
  }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* = nullptr, const uint32_t = 1, uint32_t = 1u) {
    Grid grid = grouped_grid(problem, tile, cluster, args);
    Params params;
    // swizzle 1 here: the grid is padded already; the group is set after (CUTLASS's tile order reads it)
    params.initialize(grid.blocks, cutlass::gemm::to_gemm_coord(cluster), hw_info, 1, grid.order);
    params.log_swizzle_size_ = grid.log_group;
    return params;
  }

  // The kernel's launch grid (GemmKernel::get_grid_shape passes the group and order it resolved).
  template <class ProblemShapeMNK, class BlockShape, class ClusterShape>
  static dim3 get_grid_shape(Params const&, ProblemShapeMNK problem, BlockShape tile, ClusterShape cluster,
                             cutlass::KernelHardwareInfo hw_info, Arguments args = Arguments{}, bool = true) {
    Grid grid = grouped_grid(cute::append<4>(problem, cute::Int<1>{}), tile, cluster, args);
    return Params::get_grid_shape(grid.blocks, cutlass::gemm::to_gemm_coord(cluster), hw_info, 1, grid.order, true);
  }
};

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::GroupedPersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::GroupedTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
