// epic custom sm90 EVT nodes: helpers shared by the node headers (not a node itself).
//
// Every node header includes this one, so a generated gemm only includes the node headers it uses.
// Written for CUTLASS 4.2 (sm90 TMA warp-specialized epilogue, Sm90TopologicalVisitor).
//
// Vocabulary used in the nodes:
//   - "subtile": one epilogue tile (EPI_TILE_M x EPI_TILE_N) of the CTA tile; the collective visits
//     the subtiles one after another and calls reduce() once per subtile with that subtile's root
//     fragment.
//   - "slot": a per-thread register that several fragment elements share (one per row for a row
//     reduction, one per (row, 1xBlock column segment) for a block reduction). Slots are built the way
//     the stock reductions build theirs: partition a tile-shaped layout whose strides are zero along the
//     reduced columns with the same tiled copy as the accumulator, then take a compact register tensor
//     "like" it (static zero strides survive). Element k of the fragment and slot tensor(k) then refer
//     to the same row (segment) by construction, for whatever thread-value layout CUTLASS picks.
//   - "row lanes": the lanes of a warp that hold elements of the same rows (the quad of an sm90 wgmma
//     accumulator). A row (segment) reduction is a thread-local step plus an XOR butterfly over them.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#include "cutlass/cutlass.h"
#include "cutlass/array.h"
#include "cutlass/numeric_conversion.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
// the nodes' scalar arithmetic (lse_merge, pow2_ceil, ...)
#include "epic_nodes/arith.hpp"

namespace epic_nodes {
namespace detail {

using namespace cute;

// Maps (m, n) of the reference tile of a tiled copy to the thread-value index, i.e. the inverse of the
// copy's TV layout, for register tensors that reference the copy's source (ReferenceSrc) or destination.
template <bool ReferenceSrc, class TiledCopy>
CUTE_HOST_DEVICE constexpr auto
tile_mn_to_tv(TiledCopy const& tiled_copy) {
  auto mn_shape = shape(typename TiledCopy::Tiler_MN{});
  if constexpr (ReferenceSrc) {
    return right_inverse(tiled_copy.get_layoutS_TV()).with_shape(mn_shape);
  } else {
    return right_inverse(tiled_copy.get_layoutD_TV()).with_shape(mn_shape);
  }
}

// (lane_m, lane_n) -> lane index: which lanes of a warp cover the rows (mode 0) and the columns
// (mode 1) of the copy tile. Lanes that differ only in lane_n hold the same rows.
template <bool ReferenceSrc, class TiledCopy>
CUTE_HOST_DEVICE constexpr auto
lane_layout_mn(TiledCopy const& tiled_copy) {
  constexpr int kWarps = TiledCopy::TiledNumThr::value / 32;
  // tv index -> lane: thread index modulo 32 (values and warps do not change the lane)
  auto tv_to_lane = Layout<Shape<_32, Int<kWarps>, _1>, Stride<_1, _0, _0>>{};
  auto mn_to_lane = composition(tv_to_lane, tile_mn_to_tv<ReferenceSrc>(tiled_copy));
  return make_layout(filter(get<0>(mn_to_lane)), filter(get<1>(mn_to_lane)));
}

// (warp_m, warp_n) -> warp index within the consumer threads.
template <bool ReferenceSrc, class TiledCopy>
CUTE_HOST_DEVICE constexpr auto
warp_layout_mn(TiledCopy const& tiled_copy) {
  constexpr int kWarps = TiledCopy::TiledNumThr::value / 32;
  auto tv_to_warp = Layout<Shape<_32, Int<kWarps>, _1>, Stride<_0, _1, _0>>{};
  auto mn_to_warp = composition(tv_to_warp, tile_mn_to_tv<ReferenceSrc>(tiled_copy));
  return make_layout(filter(get<0>(mn_to_warp)), filter(get<1>(mn_to_warp)));
}

// A counting tensor over the CTA tile whose value at (m, n) is `layout(m, n)`, partitioned exactly like
// the accumulator fragment: (CPY, CPY_M, CPY_N, EPI_M, EPI_N). With a layout that has zero strides along
// the columns that share a slot, filter() of the partition enumerates the thread's distinct slots and
// its values say which tile row / segment each slot is.
template <bool ReferenceSrc, class TileLayout, class EpiTile, class TiledCopy>
CUTE_HOST_DEVICE constexpr auto
partition_tile_map(TileLayout const& tile_layout, EpiTile const& epi_tile, TiledCopy const& tiled_copy, int thread_idx) {
  auto cT = make_coord_tensor(tile_layout);
  return cutlass::epilogue::fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
      cT, epi_tile, tiled_copy, thread_idx);
}

// Linear index of this lane along the row-lane group (0 .. size<1>(lane_layout)-1).
template <class LaneLayout>
CUTE_HOST_DEVICE int
lane_n_index(LaneLayout const& lane_layout, int lane_idx) {
  auto inv = right_inverse(lane_layout);
  auto lane_mn = idx2crd(inv(lane_idx), shape(lane_layout));
  return int(crd2idx(get<1>(lane_mn), shape<1>(lane_layout)));
}

// What a 1 x Block segment node (Sm90BlockScale, Sm90BlockReduceScale) needs to find its slots: the
// segment map (value at (m, n) of the CTA tile = m + TileM * (n / Block); zero stride inside a segment,
// so one slot per (row, segment)), partitioned like the accumulator; the lanes sharing the rows; where
// the CTA tile starts. Asserts the shapes a segment node can handle.
//
// Split segments (TileN = Block / 2, a 1x2 cluster along N): a segment is half in this CTA and half in
// the other CTA of its cluster, which works on the neighbouring tile at the same time; each CTA has one
// segment, its whole tile width, and the two exchange their halves' statistics (exchange_halves).
template <class SegMap, class LaneLayout>
struct BlockSegments {
  SegMap tSeg;             // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
  LaneLayout lane_layout;  // (lane_m, lane_n) -> lane
  int lane_n;              // this lane's index among the lanes sharing its rows
  bool cta_in_problem;     // false for a CTA of cluster padding
  int M, N;
  int m0;                  // first row of the CTA tile
  int g0;                  // first segment of the CTA tile (n0 / Block)
  bool right;              // split segments: this CTA holds the right half
};

template <bool ReferenceSrc, int Block, int TileM, int TileN, class Args>
CUTLASS_DEVICE auto
block_segments(Args const& args) {
  constexpr bool Split = TileN < Block;
  constexpr int EpiN = decltype(size<1>(shape(args.epi_tile)))::value;
  static_assert(EpiN % (Split ? TileN : Block) == 0,
                "epic_nodes: the epilogue subtile N must be a multiple of Block (of the tile N for a split "
                "segment); choose an explicit epilogue tile (see tests/probes/README.md)");
  static_assert(Split ? Block == 2 * TileN : TileN % Block == 0,
                "epic_nodes: CTA tile N must be a multiple of Block, or half of it (a split segment)");
  auto warp_layout = warp_layout_mn<ReferenceSrc>(args.tiled_copy);
  static_assert(decltype(size<1>(warp_layout))::value == 1,
                "epic_nodes: several warps share a row segment; not supported");
  auto lane_layout = lane_layout_mn<ReferenceSrc>(args.tiled_copy);
  int lane_n = lane_n_index(lane_layout, int(threadIdx.x % 32));
  constexpr int SegN = Split ? TileN : Block;       // columns of a segment in this tile
  auto seg_layout = make_layout(
      make_shape(Int<TileM>{}, make_shape(Int<SegN>{}, Int<TileN / SegN>{})),
      make_stride(_1{}, make_stride(_0{}, Int<TileM>{})));
  auto tSeg = partition_tile_map<ReferenceSrc>(seg_layout, args.epi_tile, args.tiled_copy, args.thread_idx);
  auto [M, N, K, L] = args.problem_shape_mnkl;
  auto [m, n, k, l] = args.tile_coord_mnkl;
  int m0 = int(m) * TileM;
  int n0 = int(n) * TileN;
  return BlockSegments<decltype(tSeg), decltype(lane_layout)>{
      tSeg, lane_layout, lane_n, m0 < int(M) && n0 < int(N), int(M), int(N), m0, n0 / Block, n0 % Block != 0};
}


// Merges each slot of f (a filtered register tensor) with the same slot of the lanes that share its
// rows: an XOR butterfly, after which every such lane holds merge(...) of all of them. With a
// commutative merge the lanes end with the same bits.
template <class LaneLayout, class FTensor, class Merge>
CUTLASS_DEVICE void
merge_row_lanes(LaneLayout const& lane_layout, FTensor&& f, Merge const& merge) {
  constexpr int RowLanes = decltype(size<1>(lane_layout))::value;
  constexpr int Slots = decltype(size(f))::value;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 1; r < RowLanes; r *= 2) {
    int mask = int(lane_layout(_0{}, r));
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < Slots; ++s) {
      f(s) = merge(f(s), __shfl_xor_sync(0xffffffffu, f(s), mask));
    }
  }
}

// Calls fn(slot, m, g) once per (row m, segment g) inside the problem, spread over the lanes that
// share the row: the one store per segment a segment node makes. fSeg: the filtered segment map.
template <int Block, int TileM, class Segs, class FSeg, class Fn>
CUTLASS_DEVICE void
for_each_owned_segment(Segs const& seg, FSeg const& fSeg, Fn const& fn) {
  constexpr int RowLanes = decltype(size<1>(seg.lane_layout))::value;
  constexpr int Slots = decltype(size(fSeg))::value;
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < Slots; ++s) {
    if (s % RowLanes == seg.lane_n) {
      int code = int(fSeg(s));
      int m = seg.m0 + code % TileM;
      int g = seg.g0 + code / TileM;
      if (m < seg.M && g * Block < seg.N) {
        fn(s, m, g);
      }
    }
  }
}

// The host-side and producer-side members every epic node has alike: no workspace, nothing loaded
// by the producer warp, no C. A node inherits them and defines its Arguments/Params and callbacks.
struct NoWorkspaceNoLoads {
  template <class ProblemShape, class Arguments>
  static size_t
  get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }

  template <class ProblemShape, class Arguments>
  static cutlass::Status
  initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                       cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto
  get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }
};

// Whether the CTA tile of a node's ConsumerStoreArgs lies wholly inside the problem (no row >= M, no
// column >= N): a node may skip its per-element tests against the ragged edge there (one branch per
// fragment that the whole warp takes alike).
template <class Args>
CUTLASS_DEVICE bool
tile_inside_problem(Args const& args) {
  auto [M, N, K, L] = args.problem_shape_mnkl;
  auto [m, n, k, l] = args.tile_coord_mnkl;
  constexpr int TileM = decltype(size<0>(args.tile_shape_mnk))::value;
  constexpr int TileN = decltype(size<1>(args.tile_shape_mnk))::value;
  return (int(m) + 1) * TileM <= int(M) && (int(n) + 1) * TileN <= int(N);
}

} // namespace detail
} // namespace epic_nodes
