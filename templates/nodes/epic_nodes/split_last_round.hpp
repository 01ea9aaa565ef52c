// tile_order=split_last: a pingpong kernel whose last round of tiles is split along K over every CTA
// (epic_nodes/last_round_plan.hpp says which pieces each cluster takes), so the CTAs that would sit idle
// while that round runs share its k-blocks.
//
// - epic_scheduler::SplitLastRoundScheduler: the grouped persistent scheduler (its tiles, its order)
//   with the two scratch buffers the split needs: a partial accumulator slot per CTA and a counter per
//   CTA's tile of the last round. Both live in the library's per-stream scratch
//   (epic_nodes/stream_scratch.hpp); a final piece sets its counter back to zero, so a launch leaves
//   them as it found them.
// - epic_kernel_split::SplitLastRoundKernel<Base>: CUTLASS's pingpong GemmUniversal (Base: its
//   arguments, parameters, shared storage, grid) with a kernel body that walks work units instead of
//   whole tiles. A unit is a tile and a range of its k-blocks; unit u of a CTA goes to consumer warp
//   group u % 2, as in CUTLASS's kernel, and each warp group steps its pipeline states over the other's
//   units by what those units use (their k-blocks; the epilogue's stages only where the unit runs the
//   epilogue). A partial piece stores its accumulators where its epilogue would run; a final piece
//   waits there for its tile's counter, adds the partial pieces in cluster order and runs the epilogue.
// Without a split (no last round, too few k-blocks, or a grid larger than the scratch) the units are
// CUTLASS's tiles in CUTLASS's order.
#pragma once

#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp"
#include "epic_nodes/grouped_tile_scheduler.hpp"
#include "epic_nodes/last_round_plan.hpp"

namespace epic_scheduler {

struct SplitLastRoundPersistentScheduler {};   // the tag GemmUniversal takes

// the most CTAs a split kernel's scratch holds (a full GH100 has 144 SMs); a larger grid does not split
constexpr uint32_t kSplitMaxCtas = 144;
// a cluster's share of the last round must be at least this many k-blocks to split it
constexpr uint32_t kSplitMinShare = 4;

class SplitLastRoundScheduler : public GroupedTileScheduler {
  using Base = GroupedTileScheduler;

 public:
  struct Arguments : Base::Arguments {
    float* partials = nullptr;    // kSplitMaxCtas slots of a tile's accumulators
    uint32_t* counts = nullptr;   // kSplitMaxCtas counters, zero between launches
  };
  struct Params : Base::Params {
    float* partials = nullptr;
    uint32_t* counts = nullptr;
  };

  CUTLASS_DEVICE explicit SplitLastRoundScheduler(Params const& params) : Base(params) {}

  // the static tile at CUTLASS's linear index (the same decode as the grouped scheduler's)
  CUTLASS_DEVICE WorkTileInfo tile_at(uint32_t index) const { return get_current_work_for_linear_idx(index); }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, const uint32_t epilogue_subtiles = 1,
                                        uint32_t accumulators = 1u) {
    Params params;
    static_cast<Base::Params&>(params) =
        Base::to_underlying_arguments(problem, tile, cluster, hw_info, args, workspace, epilogue_subtiles, accumulators);
    // the split indexes tiles in 32 bits (the fast decode's range)
    bool const ok = params.fast && args.partials != nullptr && args.counts != nullptr;
    params.partials = ok ? args.partials : nullptr;
    params.counts = ok ? args.counts : nullptr;
    return params;
  }
};

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::SplitLastRoundPersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::SplitLastRoundScheduler;
};
}  // namespace cutlass::gemm::kernel::detail

namespace epic_kernel_split {

template <class Base>
class SplitLastRoundKernel : public Base {
 public:
  using typename Base::Params;
  using typename Base::SharedStorage;
  using typename Base::CollectiveMainloop;
  using typename Base::CollectiveEpilogue;
  using typename Base::TileScheduler;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::ClusterShape;
  using typename Base::MathWarpGroupOrderBarrier;
  using typename Base::LoadWarpOrderBarrier;
  using Base::LoadRegisterRequirement;
  using Base::MmaRegisterRequirement;
  static_assert(cute::is_same_v<TileScheduler, epic_scheduler::SplitLastRoundScheduler>,
                "SplitLastRoundKernel runs on epic_scheduler::SplitLastRoundScheduler");
  static_assert(cute::is_same_v<typename Base::ElementAccumulator, float>, "the partial slots hold float");

  static constexpr uint32_t kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t kTileElements = cute::size<0>(TileShape{}) * cute::size<1>(TileShape{});

  // one unit of a CTA's work: a tile (CUTLASS's linear index) and a range of its k-blocks
  struct Unit {
    uint32_t index;
    uint32_t k_begin;
    uint32_t k_count;
    uint8_t kind;   // kWhole, kPartial or kFinal
    uint32_t piece_tile;   // the last round's cluster tile of a piece
  };
  static constexpr uint8_t kWhole = 0, kPartial = 1, kFinal = 2;

  // this CTA's units, in the order it runs them
  struct Units {
    uint32_t first, stride, whole, count;   // whole tiles: first + i * stride, i < whole
    uint32_t tiles_k;
    uint32_t cluster, rank;
    epic_scheduler::LastRoundPlan plan;
    epic_scheduler::LastRoundPlan::Piece piece0, piece1;   // not an array: indexed at run time it would
    int pieces;                                            // live in local memory

    CUTLASS_DEVICE Unit operator[](uint32_t u) const {
      if (u < whole) return Unit{first + u * stride, 0u, tiles_k, kWhole, 0u};
      auto const& p = u == whole ? piece0 : piece1;
      uint32_t const index = plan.piece_index(p.tile, stride, cute::size(ClusterShape{}), rank);
      return Unit{index, p.k_begin, p.k_count, p.final ? kFinal : kPartial, p.tile};
    }
  };

  CUTLASS_DEVICE static Units make_units(Params const& params, uint32_t tiles_k, bool can_split) {
    Units w;
    uint32_t const cs = cute::size(ClusterShape{});
    w.stride = gridDim.x * gridDim.y * gridDim.z;
    w.first = epic_scheduler::LastRoundPlan::first_index(
        blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, params.scheduler.raster_order_ == TileScheduler::RasterOrder::AlongN);
    w.cluster = w.first / cs;
    w.rank = w.first % cs;
    w.tiles_k = tiles_k;
    uint32_t const tiles = uint32_t(params.scheduler.blocks_per_problem_);
    w.plan = epic_scheduler::LastRoundPlan::make(tiles, w.stride, cs, tiles_k, epic_scheduler::kSplitMinShare);
    if (!can_split || w.stride > epic_scheduler::kSplitMaxCtas) w.plan.split = false;
    if (w.plan.split) {
      w.whole = w.plan.rounds;
      epic_scheduler::LastRoundPlan::Piece p[2];
      w.pieces = w.plan.pieces(w.cluster, p);
      w.piece0 = p[0];
      w.piece1 = p[1];
    } else {
      w.whole = w.first < tiles ? (tiles - w.first + w.stride - 1) / w.stride : 0u;
      w.pieces = 0;
    }
    w.count = w.whole + uint32_t(w.pieces);
    return w;
  }

  CUTLASS_DEVICE
  void operator()(Params const& params, char* smem_buf) {
    using namespace cute;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum class Role { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    enum class ProducerWarp { Mainloop = 0, Warp1 = 1, Epilogue = 2, MainloopAux = 3 };
    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const thread_idx = int(threadIdx.x);
    int const lane_idx = cutlass::canonical_lane_idx();
    int const warp_idx = cutlass::canonical_warp_idx_sync();
    int const wg_thread = thread_idx % kWarpGroupThreads;
    auto const role = Role(cutlass::canonical_warp_group_idx());
    auto const producer_warp = ProducerWarp(warp_idx % cutlass::NumWarpsPerWarpGroup);
    int const lane_predicate = cute::elect_one_sync();
    uint32_t const block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (role == Role::Producer && producer_warp == ProducerWarp::Mainloop) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    }
    if (role == Role::Consumer0 || role == Role::Consumer1) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    }
    mainloop_pipeline_params.is_leader = wg_thread == 0;
    mainloop_pipeline_params.num_consumers = kWarpGroupThreads;
    mainloop_pipeline_params.num_producers = CollectiveMainloop::NumProducerThreadEvents;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (role == Role::Producer && producer_warp == ProducerWarp::Epilogue) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    }
    if (role == Role::Consumer0 || role == Role::Consumer1) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    }
    epi_load_pipeline_params.dst_blockid = cute::block_rank_in_cluster();
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = kWarpGroupThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename LoadWarpOrderBarrier::Params load_order_params;
    load_order_params.group_id = producer_warp == ProducerWarp::Mainloop ? 0 : 1;
    load_order_params.group_size = cutlass::NumThreadsPerWarp;
    LoadWarpOrderBarrier load_order_barrier(shared_storage.pipelines.load_order, load_order_params);

    typename MathWarpGroupOrderBarrier::Params math_order_params;
    math_order_params.group_id = cutlass::canonical_warp_group_idx() - int(Role::Consumer0);
    math_order_params.group_size = kWarpGroupThreads;
    MathWarpGroupOrderBarrier math_order_barrier(shared_storage.pipelines.math_wg_order, math_order_params);

    typename CollectiveMainloop::PipelineState mainloop_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_consumer_state;
    auto mainloop_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    auto epi_load_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    auto epi_store_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    // pipeline initialisation visible to the whole cluster before anyone uses it
    if constexpr (size(ClusterShape{}) > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    auto problem_shape_MNKL = append<4>(params.problem_shape, Int<1>{});
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};
    CollectiveMainloop collective_mainloop;
    CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mkl = get<0>(load_inputs);
    Tensor gB_nkl = get<1>(load_inputs);
    uint32_t const tiles_k = uint32_t(size<3>(gA_mkl));
    auto const c_tile_count = CollectiveEpilogue::get_load_pipe_increment(blk_shape);
    auto const d_tile_count = CollectiveEpilogue::get_store_pipe_increment(blk_shape);

    TileScheduler scheduler{params.scheduler};
    bool const can_split = params.scheduler.partials != nullptr && size<4>(gA_mkl) == 1;
    Units const units = make_units(params, tiles_k, can_split);

    auto coord_of = [&](uint32_t index) {
      auto work = scheduler.tile_at(index);
      auto m_coord = idx2crd(work.M_idx, shape<2>(gA_mkl));
      auto n_coord = idx2crd(work.N_idx, shape<2>(gB_nkl));
      auto l_coord = idx2crd(work.L_idx, shape<4>(gB_nkl));
      return make_coord(m_coord, n_coord, _, l_coord);
    };

    if (role == Role::Producer) {
      cutlass::arch::warpgroup_reg_dealloc<LoadRegisterRequirement>();
      if (producer_warp == ProducerWarp::Mainloop) {
        cutlass::arch::wait_on_dependent_grids();
        for (uint32_t u = 0; u < units.count; ++u) {
          Unit const unit = units[u];
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(int(unit.k_begin), shape<3>(gA_mkl)), shape<3>(gA_mkl));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_producer_state, load_inputs,
                                   coord_of(unit.index), k_tile_iter, int(unit.k_count), lane_idx,
                                   block_rank_in_cluster, shared_storage.tensors.mainloop);
          mainloop_producer_state.advance(unit.k_count);
          if (u == 0) load_order_barrier.arrive();   // the epilogue's loads may begin
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_producer_state);
      } else if (producer_warp == ProducerWarp::Epilogue && collective_epilogue.is_producer_load_needed()) {
        cutlass::arch::wait_on_dependent_grids();
        bool first = true;
        for (uint32_t u = 0; u < units.count; ++u) {
          Unit const unit = units[u];
          if (unit.kind == kPartial) continue;
          if (first) {
            load_order_barrier.wait();
            first = false;
          }
          epi_load_producer_state = collective_epilogue.load(
              epi_load_pipeline, epi_load_producer_state, problem_shape_MNKL, blk_shape, coord_of(unit.index),
              tiled_mma, lane_idx, shared_storage.tensors.epilogue);
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_producer_state);
      }
    } else if (role == Role::Consumer0 || role == Role::Consumer1) {
      cutlass::arch::warpgroup_reg_alloc<MmaRegisterRequirement>();
      uint32_t const group = uint32_t(role) - uint32_t(Role::Consumer0);
      if (group >= units.count) {
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
        cutlass::arch::launch_dependent_grids();
#endif
        return;
      }
      // the barrier a warp group's 128 threads meet at around a piece's scratch (CUTLASS reserves two
      // for stream-K fixups; its sm90 pingpong kernel uses neither)
      cutlass::arch::NamedBarrier piece_barrier(
          kWarpGroupThreads, group == 0 ? cutlass::arch::ReservedNamedBarriers::StreamkBarrier0
                                        : cutlass::arch::ReservedNamedBarriers::StreamkBarrier1);
      uint32_t const cs = cute::size(ClusterShape{});
      for (uint32_t u = 0; u < units.count; ++u) {
        Unit const unit = units[u];
        if (u % 2 != group) {   // the other warp group's unit: step over what it uses
          mainloop_consumer_state.advance(unit.k_count);
          if (unit.kind != kPartial) {
            epi_load_consumer_state.advance(c_tile_count);
            epi_store_producer_state.advance(d_tile_count);
          }
          continue;
        }
        auto blk_coord = coord_of(unit.index);
        Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(blk_shape));

        math_order_barrier.wait();
        collective_mainloop.mma(mainloop_pipeline, mainloop_consumer_state, accumulators, int(unit.k_count),
                                wg_thread, shared_storage.tensors.mainloop, params.mainloop);
        math_order_barrier.arrive();
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_consumer_state, int(unit.k_count));
        mainloop_consumer_state.advance(unit.k_count);
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
        if (u + 2 >= units.count) cutlass::arch::launch_dependent_grids();   // this group's last unit
#endif

        math_order_barrier.wait();
        if (unit.kind == kPartial) {
          // this CTA's slot: element i of thread t at i * 128 + t (coalesced across the warp group)
          float* slot = params.scheduler.partials + size_t(units.cluster * cs + units.rank) * kTileElements;
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(accumulators); ++i) {
            __stcg(slot + i * kWarpGroupThreads + wg_thread, accumulators(i));
          }
          __threadfence();
          piece_barrier.sync();
          if (wg_thread == 0) atomicAdd(params.scheduler.counts + unit.piece_tile * cs + units.rank, 1u);
        } else {
          if (unit.kind == kFinal) {
            uint32_t const from = units.plan.first_contributor(unit.piece_tile);
            uint32_t* count = params.scheduler.counts + unit.piece_tile * cs + units.rank;
            if (wg_thread == 0) {
              uint32_t const expect = units.cluster - from;
              uint32_t seen;
              do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
                if (seen < expect) __nanosleep(64);
              } while (seen < expect);
              *count = 0u;   // every piece of this tile has counted: leave the counter as the launch found it
            }
            piece_barrier.sync();
            for (uint32_t c = from; c < units.cluster; ++c) {
              float const* slot = params.scheduler.partials + size_t(c * cs + units.rank) * kTileElements;
              CUTLASS_PRAGMA_UNROLL
              for (int i = 0; i < size(accumulators); ++i) {
                accumulators(i) += __ldcg(slot + i * kWarpGroupThreads + wg_thread);
              }
            }
          }
          auto [epi_load_next, epi_store_next] = collective_epilogue.store(
              epi_load_pipeline, epi_load_consumer_state, epi_store_pipeline, epi_store_producer_state,
              problem_shape_MNKL, blk_shape, blk_coord, accumulators, tiled_mma, wg_thread,
              shared_storage.tensors.epilogue);
          auto [epi_load_after, epi_store_after] =
              collective_epilogue.store_tail(epi_load_pipeline, epi_load_next, epi_store_pipeline, epi_store_next);
          epi_load_consumer_state = epi_load_after;
          epi_store_producer_state = epi_store_after;
        }
        math_order_barrier.arrive();
      }
    }
#else
    (void)params;
    (void)smem_buf;
#endif
  }
};

}  // namespace epic_kernel_split
