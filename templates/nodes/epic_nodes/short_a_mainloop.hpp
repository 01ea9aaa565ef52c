// epic_mainloop::ShortA<Mainloop, Rows, Hinted> (kernel option a_rows = 8, 16 or 32): CUTLASS's sm90 TMA
// mainloop whose producer loads only the first Rows rows of each A tile. At decode sizes a call has
// fewer rows than the tile (M = 1 on a 64-row tile): CUTLASS's load of A is then a box of 64 rows,
// 63 of them past M, which TMA fills with zeros, and the gemm ran 22.7 us at M = 1 against 18.5 us at
// M = 64 with the same instructions and DRAM bytes (docs/PERFORMANCE.md, "Below 33 rows"). Here the
// box is Rows x TileK, into the top of the stage's tile, and each stage expects that many bytes.
//
// The tile's rows past Rows are never written: they hold whatever shared memory held, and so do the
// accumulator rows the tensor cores make of them. Those rows lie past M (the plan takes a_rows only
// for a gemm of at most Rows rows, and can_implement refuses a larger M before the launch), and every
// epilogue node masks the elements past M by their coordinates (the checked reductions, Sm90OutsideAs,
// the block nodes) while the TMA stores clip them, as for a ragged M's last tile.
//
// A is K-major (epic's A is always a row-major [M, K]), so the first Rows rows of a stage's swizzled
// tile are a TMA box of their own (the 128-byte swizzle repeats every 8 rows). A is loaded by each CTA
// alone, never multicast over a cluster (it is Rows x TileK, tiny); B as the base loads it.
#pragma once

#include <cstdint>

namespace epic_mainloop {

template <class Mainloop, int Rows, bool Hinted>
struct ShortA : Mainloop {
  using Base = Mainloop;
  using TileShape = typename Base::TileShape;
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileK = cute::size<2>(TileShape{});
  static_assert(Rows % 8 == 0 && kTileM % Rows == 0 && Rows < kTileM,
                "epic_mainloop::ShortA: Rows must be a multiple of 8 that divides the tile's M");
  static_assert(cutlass::gemm::detail::is_k_major<typename Base::StrideA>(),
                "epic_mainloop::ShortA: A must be K-major");

  using ElementA = cute::remove_cvref_t<decltype(*typename Base::Arguments{}.ptr_A)>;
  // the first Rows rows of one stage's (TileM, TileK) tile, in the stage's own swizzled layout
  using BoxLayout = decltype(cute::composition(
      typename Base::SmemLayoutA{}(cute::_, cute::_, cute::Int<0>{}),
      cute::make_layout(cute::make_shape(cute::Int<Rows>{}, cute::Int<kTileK>{}),
                        cute::make_stride(cute::_1{}, cute::Int<kTileM>{}))));
  using BoxTile = cute::Shape<cute::Int<Rows>, cute::_1, cute::Int<kTileK>>;
  using TmaBox = decltype(cute::make_tma_copy_A_sm90(
      cute::SM90_TMA_LOAD{},
      cute::make_tensor(static_cast<ElementA const*>(nullptr),
                        cute::repeat_like(typename Base::StrideA{}, int32_t(0)), typename Base::StrideA{}),
      BoxLayout{}, BoxTile{}, cute::Shape<cute::_1, cute::_1, cute::_1>{}));
  static constexpr uint32_t kBoxBytes = uint32_t(Rows * kTileK * cute::sizeof_bits_v<ElementA> / 8);

  struct Params : Base::Params {
    TmaBox tma_box_a;
    int m = 0, k = 0, l = 1;
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(shape, args, workspace);
    auto [M, N, K, L] = cute::append<4>(shape, 1);
    auto a = cute::make_tensor(reinterpret_cast<ElementA const*>(args.ptr_A), cute::make_layout(cute::make_shape(M, K, L), args.dA));
    p.tma_box_a = cute::make_tma_copy_A_sm90(cute::SM90_TMA_LOAD{}, a, BoxLayout{}, BoxTile{},
                                             cute::Shape<cute::_1, cute::_1, cute::_1>{});
    p.m = int(M), p.k = int(K), p.l = int(L);
    // a stage completes when its A box and its B tile have landed
    p.tma_transaction_bytes = kBoxBytes + p.tma_transaction_bytes_nk;
    p.tma_transaction_bytes_mk = kBoxBytes;
    return p;
  }

  // a call with more rows than the box would leave rows unread: refused before the launch
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& shape, typename Base::Arguments const& args) {
    auto mnkl = cute::append<4>(shape, 1);
    return Base::can_implement(shape, args) && int(cute::get<0>(mnkl)) <= Rows;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
    cute::prefetch_tma_descriptor(p.tma_box_a.get_tma_descriptor());
  }

  // the pingpong and cooperative kernels call it once per tile from one producer warp
  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, typename Base::MainloopPipeline pipeline,
                           typename Base::PipelineState write_state, cute::tuple<TensorA, TensorB> const& inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t block_rank_in_cluster,
                           typename Base::TensorStorage& storage) {
    using namespace cute;
    if (!elect_one_sync()) return;     // one lane issues every copy

    using Cluster = typename Base::DispatchPolicy::ClusterShape;
    constexpr uint32_t kClusterX = size<0>(Cluster{});
    uint32_t const cx = block_rank_in_cluster % kClusterX;
    auto [m, n, k, l] = blk_coord;

    // A: rows [m * TileM, m * TileM + Rows) of every k-block, into the top of the stage
    Tensor mA = params.tma_box_a.get_tma_tensor(make_shape(params.m, params.k, params.l));     // (M, K, L)
    Tensor gA = local_tile(mA(_, _, l), make_shape(Int<Rows>{}, Int<kTileK>{}),
                           make_coord(m * (kTileM / Rows), _));                                  // (Rows, TileK, k)
    Tensor sA = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Base::SmemLayoutA{}); // (TileM, TileK, PIPE)
    Tensor sA_box = local_tile(sA, make_shape(Int<Rows>{}, Int<kTileK>{}), make_coord(0, 0));  // (Rows, TileK, PIPE)
    auto tma_a = params.tma_box_a.get_slice(0);
    Tensor tAgA = tma_a.partition_S(gA);        // (TMA, TMA_M, TMA_K, k)
    Tensor tAsA = tma_a.partition_D(sA_box);    // (TMA, TMA_M, TMA_K, PIPE)

    // B: the base's tiles and multicast (shared along the cluster's M)
    auto tma_b = params.tma_load_b.get_slice(cx);
    Tensor sB = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Base::SmemLayoutB{});
    Tensor tBgB = tma_b.partition_S(get<1>(inputs)(_, _, n, _, l));     // (TMA, TMA_N, TMA_K, k)
    Tensor tBsB = tma_b.partition_D(sB);
    uint16_t mask_b = 0;
    if constexpr (is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      uint32_t const cy = block_rank_in_cluster / kClusterX;
      auto rank = Layout<Cluster>{};     // (x, y) -> the CTA's rank in the cluster
      for (int x = 0; x < size<0>(rank); ++x) mask_b |= uint16_t(1) << rank(x, cy, Int<0>{});
    }

    // load_hint=none: policy 0, ptxas drops the operand and L2 applies its default
    constexpr auto kPolicy = Hinted ? TMA::CacheHintSm90::EVICT_NORMAL : static_cast<TMA::CacheHintSm90>(0);
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count, ++k_tile_iter, ++write_state) {
      pipeline.producer_acquire(write_state);      // wait until the consumers have freed the stage
      auto* full = pipeline.producer_get_barrier(write_state);
      int const stage = write_state.index();
      copy(params.tma_box_a.with(*full, 0, kPolicy), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*full, mask_b, kPolicy), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
    }
  }
};

}  // namespace epic_mainloop
