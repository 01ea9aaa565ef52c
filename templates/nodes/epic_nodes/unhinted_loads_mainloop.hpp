// epic_mainloop::UnhintedLoads<Mainloop> (kernel option load_hint=none): CUTLASS's sm90 TMA mainloop
// whose producer issues the A and B loads without an L2 cache policy. CUTLASS's load() passes
// TMA::CacheHintSm90::EVICT_NORMAL, which ptxas keeps in a uniform register (SASS `UTMALDG ...
// desc[URn]`); QuACK's sm90 gemm passes none (`desc[URZ]`). Everything else is the base's producer:
// the same tiles of A and B, the same multicast masks over the cluster, one stage per k-block, the
// same pipeline barriers. Only load() is replaced; the consumer (mma) and the kernel-start hooks are
// the base's.
#pragma once

#include <cstdint>

namespace epic_mainloop {

template <class Mainloop>
struct UnhintedLoads : Mainloop {
  using Base = Mainloop;

  // the pingpong and cooperative kernels call it once per tile from one producer warp
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Base::Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write_state, cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& storage) {
    using namespace cute;
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
    constexpr auto kNoPolicy = static_cast<TMA::CacheHintSm90>(0);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write_state) {
      pipeline.producer_acquire(write_state);      // wait until the consumers have freed the stage
      auto* full = pipeline.producer_get_barrier(write_state);
      int const stage = write_state.index();
      copy(params.tma_load_a.with(*full, mask_a, kNoPolicy), gA(_, _, _, *k_tile_iter), stage_a(_, _, _, stage));
      copy(params.tma_load_b.with(*full, mask_b, kNoPolicy), gB(_, _, _, *k_tile_iter), stage_b(_, _, _, stage));
    }
  }
};

}  // namespace epic_mainloop
