// epic_mainloop::ProducerLoads<Mainloop, Scheduler, kHinted, kNextBlocks>: CUTLASS's sm90 TMA mainloop
// whose producer's load() is this one. The same tiles of A and B, the same multicast masks over the
// cluster, one stage per k-block, the same pipeline barriers as the base's; only load() is replaced,
// the consumer (mma) and the kernel-start hooks are the base's. Two kernel options:
//
// load_hint=none (kHinted false): the A and B loads carry no L2 cache policy. CUTLASS's load() passes
// TMA::CacheHintSm90::EVICT_NORMAL, which ptxas keeps in a uniform register (SASS `UTMALDG ...
// desc[URn]`); QuACK's sm90 gemm passes none (`desc[URZ]`).
//
// prefetch_next=N (kNextBlocks N > 0): while loading a tile, the producer asks L2 for the first N
// k-blocks of A and B of the tile the CTA takes next (Scheduler::work_ahead), when kAheadAt k-blocks of
// the current tile are left to load. A new tile's first loads otherwise go out only a pipeline's depth
// before the tensor cores need them and, coming from DRAM, arrive after the warp group's turn has begun
// (bench/tile_trace.py: "first load to data"). Each CTA asks for its own slice of the operands, as its
// loads do, so a cluster asks for each byte once. A prefetch is a hint: it never changes a result.
#pragma once

#include <cstdint>

namespace epic_mainloop {

template <class Mainloop, class Scheduler, bool kHinted, int kNextBlocks>
struct ProducerLoads : Mainloop {
  using Base = Mainloop;
  static constexpr int kAheadAt = 8;     // k-blocks of the current tile still to load when the next is asked for

  struct Params : Base::Params {
    typename Scheduler::Params schedule;   // the kernel's tile scheduler's (set by the launch)
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(shape, args, workspace);
    return p;
  }

  int tiles_ = 0;      // the producer's load() calls so far: its tiles, in the scheduler's order

  // the pingpong and cooperative kernels call it once per tile from one producer warp
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write_state, cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& storage) {
    using namespace cute;
    int const tile = tiles_++;
    if (!elect_one_sync()) return;     // one lane issues every copy

    using Cluster = typename Base::DispatchPolicy::ClusterShape;
    constexpr uint32_t kClusterX = size<0>(Cluster{});
    uint32_t const cx = block_rank_in_cluster % kClusterX, cy = block_rank_in_cluster / kClusterX;

    // this CTA's slice of each operand's TMA copy: A's is shared along the cluster's N, B's along M
    auto tma_a = params.tma_load_a.get_slice(cy);
    auto tma_b = params.tma_load_b.get_slice(cx);
    auto [m, n, k, l] = blk_coord;
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Base::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Base::SmemLayoutB{});
    Tensor gA = tma_a.partition_S(get<0>(inputs)(_, _, m, _, l));     // (TMA, TMA_M, TMA_K, k)
    Tensor gB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));     // (TMA, TMA_N, TMA_K, k)
    Tensor stage_a = tma_a.partition_D(sA);                             // (TMA, TMA_M, TMA_K, stage)
    Tensor stage_b = tma_b.partition_D(sB);

    // a multicast load lands in every CTA of the cluster that shares the operand's tile
    uint16_t mask_a = 0, mask_b = 0;
    auto rank = Layout<Cluster>{};     // (x, y) -> the CTA's rank in the cluster
    if constexpr (is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int y = 0; y < size<1>(rank); ++y) mask_a |= uint16_t(1) << rank(cx, y, Int<0>{});
    }
    if constexpr (is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int x = 0; x < size<0>(rank); ++x) mask_b |= uint16_t(1) << rank(x, cy, Int<0>{});
    }

    // policy 0: ptxas drops the operand (desc[URZ]) and L2 applies its default
    constexpr auto kPolicy = kHinted ? TMA::CacheHintSm90::EVICT_NORMAL : static_cast<TMA::CacheHintSm90>(0);
    int const ahead_at = k_tile_count < kAheadAt ? k_tile_count : kAheadAt;
    int const k_tiles = k_tile_count;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write_state) {
      if constexpr (kNextBlocks > 0) {
        if (k_tile_count == ahead_at) {
          auto const next = Scheduler(params.schedule).work_ahead(uint32_t(tile) + 1);
          if (next.is_valid()) {
            Tensor gA_next = tma_a.partition_S(get<0>(inputs)(_, _, next.M_idx, _, next.L_idx));
            Tensor gB_next = tma_b.partition_S(get<1>(inputs)(_, _, next.N_idx, _, next.L_idx));
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < kNextBlocks; ++j) {
              if (j < k_tiles) {
                prefetch(params.tma_load_a, gA_next(_, _, _, j));
                prefetch(params.tma_load_b, gB_next(_, _, _, j));
              }
            }
          }
        }
      }
      pipeline.producer_acquire(write_state);      // wait until the consumers have freed the stage
      auto* full = pipeline.producer_get_barrier(write_state);
      int const stage = write_state.index();
      copy(params.tma_load_a.with(*full, mask_a, kPolicy), gA(_, _, _, *k_tile_iter), stage_a(_, _, _, stage));
      copy(params.tma_load_b.with(*full, mask_b, kPolicy), gB(_, _, _, *k_tile_iter), stage_b(_, _, _, stage));
    }
  }
};

}  // namespace epic_mainloop
