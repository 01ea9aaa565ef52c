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
// epic/plan/config.py (padded_tiles) models the grid this makes. Each tile's (m, n, l) comes from
// epic_nodes/tile_decode.hpp: CUTLASS's order, in 32-bit steps prepared on the host. `Order` may then
// move it to another place in the order (tile_order=...); LinearOrder leaves it.
#pragma once

#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "epic_nodes/tile_decode.hpp"

namespace epic_scheduler {

struct GroupedPersistentScheduler {};   // the tag GemmUniversal takes

struct LinearOrder {      // CUTLASS's tile order, unchanged
  template <class Work, class Params>
  CUTLASS_HOST_DEVICE static Work apply(Work work, Params const&) { return work; }
};

template <class Order>
class GroupedTileSchedulerT : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;

 public:
  using Arguments = Base::Arguments;
  using RasterOrder = Base::RasterOrder;
  using RasterOrderOptions = Base::RasterOrderOptions;
  using WorkTileInfo = Base::WorkTileInfo;

  // CUTLASS's parameters and the 32-bit decode of its tile order (fast: every index fits 31 bits)
  struct Params : Base::Params {
    TileDecode decode;
    bool fast = false;
  };

  CUTLASS_DEVICE explicit GroupedTileSchedulerT(Params const& params) : Base(params), decode_(params.decode),
                                                                        fast_(params.fast) {
#if defined(__CUDA_ARCH__)
    // CUTLASS's first index and stride (its own copy stays in step: is_last_tile reads it)
    index_ = params.raster_order_ == RasterOrder::AlongN
                 ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x)
                 : uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    stride_ = uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
    auto [m, n, l] = cute::block_id_in_cluster();
    cta_m_ = uint32_t(m);
    cta_n_ = uint32_t(n);
#endif
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work_for_linear_idx(uint64_t index) const {
    if (!fast_) return Order::apply(Base::get_current_work_for_linear_idx(index), scheduler_params);
    if (index >= scheduler_params.blocks_per_problem_) return WorkTileInfo::invalid_work_tile();
    TileDecode::Tile const t = decode_(uint32_t(index), cta_m_, cta_n_);
    return Order::apply(WorkTileInfo{t.m, t.n, t.l, true}, scheduler_params);
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return get_current_work_for_linear_idx(index_); }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t count = 1) {
    Base::advance_to_next_work(count);
    index_ += stride_ * uint64_t(count);
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

  struct Grid {
    dim3 blocks;               // CTAs per dimension, padded
    int log_group;             // log2 of the swizzle CUTLASS's rule allows at these tile counts
    RasterOrderOptions order;  // resolved: AlongN walks N and groups M; AlongM walks M and groups N
  };

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Grid grouped_grid(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster, Arguments const& args) {
    dim3 blocks = Base::get_tiled_cta_shape_mnl(problem, tile, cluster);   // each rounded to the cluster
    int log_group = Base::Params::get_log_swizzle_size(blocks.x, blocks.y, args.max_swizzle_size);
    RasterOrder order = Base::Params::get_rasterization_order(blocks.x, blocks.y, args.raster_order);
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
    params.fast = params.blocks_per_problem_ < (uint64_t(1) << 31);
    if (params.fast) {
      TileDecode& d = params.decode;
      d.batched = params.divmod_batch_.divisor < params.blocks_per_problem_;
      d.per_problem = cutlass::FastDivmod(int(params.divmod_batch_.divisor));
      d.minor_shift = params.divmod_cluster_shape_minor_.shift_right;
      d.major_shift = params.divmod_cluster_shape_major_.shift_right;
      d.minor_size = uint32_t(params.divmod_cluster_shape_minor_.divisor);
      d.major_size = uint32_t(params.divmod_cluster_shape_major_.divisor);
      d.log_group = uint32_t(params.log_swizzle_size_);
      d.clusters_major = cutlass::FastDivmod(int(params.divmod_cluster_blk_major_.divisor));
      d.along_n = params.raster_order_ == RasterOrder::AlongN;
    }
    return params;
  }

  // The kernel's launch grid (GemmKernel::get_grid_shape passes the group and order it resolved).
  template <class ProblemShapeMNK, class BlockShape, class ClusterShape>
  static dim3 get_grid_shape(Base::Params const&, ProblemShapeMNK problem, BlockShape tile, ClusterShape cluster,
                             cutlass::KernelHardwareInfo hw_info, Arguments args = Arguments{}, bool = true) {
    Grid grid = grouped_grid(cute::append<4>(problem, cute::Int<1>{}), tile, cluster, args);
    return Base::Params::get_grid_shape(grid.blocks, cutlass::gemm::to_gemm_coord(cluster), hw_info, 1, grid.order, true);
  }

 private:
  TileDecode decode_;
  bool fast_ = false;
  uint64_t index_ = 0, stride_ = 0;
  uint32_t cta_m_ = 0, cta_n_ = 0;
};

using GroupedTileScheduler = GroupedTileSchedulerT<LinearOrder>;

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::GroupedPersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::GroupedTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
