// epic_nodes::Sm90RowPickPartial<TileShape, Label>: a sink with one child x (float) that writes the
// per-tile partials of a row sum of select(col == L[m], x, 0) for an integer column vector L (cross
// entropy's label logit, row_pick) without the select: for every row m and CTA column tile t, one float
//
//   ptr[t * Mpad + m] = x[m, L[m]] + 0.0f   where 0 <= L[m] < N and column L[m] lies in tile t
//                       0.0f                 otherwise (rows m in [M, Mpad) too)
//                                                                      Mpad = round_up(M, TileM)
//
// which is what the stock row reduction of the select writes, bit for bit (every other element of the
// row adds +0; + 0.0f turns a -0 into +0 as that sum does), so the same combine kernel merges or picks it.
//
//   using Node = epic_nodes::Sm90RowPickPartial<TileShape, int32_t>;   // Arguments: {float* ptr, Label const* label}
//
// Why: the select form costs a column index, a compare, a select and an add per element and a reduction
// over the row's lanes per tile, for one element per row in the whole grid. Here each thread loads the
// labels of its rows once per tile and keeps rel = L[m] - (absolute column of its first element) per row
// slot (kNone for L[m] outside [0, N) and rows past M). Element k matches where rel equals its column
// offset from the thread's first element, a compile-time constant once the collective's loops unroll:
// one integer compare per element, ORed into one predicate per fragment. Only a fragment with a match
// (at most one in the grid per row) takes the branch that records x. After the last subtile the lane that
// recorded a row writes it; for a row whose label lies in another tile (or nowhere) the row's owning lane
// writes 0. No shuffle, no shared memory, no atomics.
#pragma once

#include <climits>

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

template <class TileShape, class Label>
struct Sm90RowPickPartial : detail::NoWorkspaceNoLoads {
  static constexpr int kNone = INT_MIN;   // no column matches it (offsets lie within +-TileN)

  struct SharedStorage {};

  struct Arguments {
    float* ptr = nullptr;          // [ceil(N / TileN), Mpad] fp32; nullptr: compute nothing, write nothing
    Label const* label = nullptr;  // [M]
  };

  struct Params {
    float* ptr = nullptr;
    Label const* label = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return {args.ptr, args.label}; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const& args) {
    return (reinterpret_cast<uintptr_t>(args.ptr) % 4) == 0 &&
           (reinterpret_cast<uintptr_t>(args.label) % sizeof(Label)) == 0 &&
           (args.ptr == nullptr || args.label != nullptr);
  }

  CUTLASS_HOST_DEVICE Sm90RowPickPartial() {}
  CUTLASS_HOST_DEVICE Sm90RowPickPartial(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <class IntTensor, class FloatTensor, class RowMap, class CoordTensor, class LaneLayout>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(IntTensor const& tRel, FloatTensor const& pick_like, RowMap tRow, CoordTensor tCcD,
                           LaneLayout lane_layout, int lane_n, int col0, bool cta_in_problem, float* ptr_tile)
      : tRel(tRel), tPick(pick_like), tFound(tRel), tRow(tRow), tCcD(tCcD), lane_layout(lane_layout),
        lane_n(lane_n), col0(col0), cta_in_problem(cta_in_problem), ptr_tile(ptr_tile) {
      using namespace cute;
      fill(tFound, 0);
    }

    IntTensor tRel;        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N), zero strides along N: one register per row
    FloatTensor tPick;     // x at the label's column, where this lane holds it
    IntTensor tFound;      // 1 where this lane holds the label's column
    RowMap tRow;           // same partition, value = row within the CTA tile
    CoordTensor tCcD;      // element coordinates relative to the thread's first element
    LaneLayout lane_layout;
    int lane_n;            // this lane's index among the lanes that share its rows
    int col0;              // the thread's first column, relative to the CTA tile's first
    bool cta_in_problem;   // false for a CTA entirely outside (M, N) (cluster padding)
    float* ptr_tile;       // &ptr[t * Mpad + m0]; nullptr: nothing to do

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using namespace cute;
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      Tensor tRel_mn = tRel(_,_,_,epi_m,epi_n);
      bool hit = false;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int k = epi_v * FragmentSize + i;
        hit |= tRel_mn(k) == int(get<1>(tCcD_mn(k)));
      }
      if (hit) {              // taken by one lane of one fragment per row in the whole grid
        Tensor tPick_mn = tPick(_,_,_,epi_m,epi_n);
        Tensor tFound_mn = tFound(_,_,_,epi_m,epi_n);
        cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert;
        cutlass::Array<float, FragmentSize> x = convert(frg_input);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int k = epi_v * FragmentSize + i;
          if (tRel_mn(k) == int(get<1>(tCcD_mn(k)))) {
            tPick_mn(k) = x[i] + 0.0f;
            tFound_mn(k) = 1;
          }
        }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      using namespace cute;
      if (not is_last_iteration || ptr_tile == nullptr || not cta_in_problem) {
        return;
      }
      constexpr int TileN = decltype(size<1>(TileShape{}))::value;
      constexpr int RowLanes = decltype(size<1>(lane_layout))::value;
      Tensor fRel = filter(tRel);
      Tensor fPick = filter(tPick);
      Tensor fFound = filter(tFound);
      Tensor fRow = filter(tRow);
      constexpr int Slots = decltype(size(fRel))::value;
      static_assert(decltype(size(fRow))::value == Slots, "row map and slots disagree");
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        int row = int(fRow(s));
        // the label's column relative to the tile's first: in [0, TileN) where this tile holds it
        bool here = fRel(s) != kNone && unsigned(fRel(s) + col0) < unsigned(TileN);
        if (fFound(s)) {
          ptr_tile[row] = fPick(s);
        } else if (not here && s % RowLanes == lane_n) {
          ptr_tile[row] = 0.0f;
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    constexpr int TileM = decltype(size<0>(TileShape{}))::value;
    constexpr int TileN = decltype(size<1>(TileShape{}))::value;
    static_assert(TileM == decltype(size<0>(args.tile_shape_mnk))::value &&
                  TileN == decltype(size<1>(args.tile_shape_mnk))::value,
                  "epic_nodes::Sm90RowPickPartial: TileShape must be the GEMM's CTA tile shape");

    // One warp must own each row of an epilogue subtile (as Sm90RowLsePartial): then a row's owning
    // lane among those that share it is well defined.
    auto warp_layout = detail::warp_layout_mn<ReferenceSrc>(args.tiled_copy);
    static_assert(decltype(size<1>(warp_layout))::value == 1,
                  "epic_nodes::Sm90RowPickPartial: several warps share a row; not supported");
    auto lane_layout = detail::lane_layout_mn<ReferenceSrc>(args.tiled_copy);
    int lane_n = detail::lane_n_index(lane_layout, int(threadIdx.x % 32));

    auto row_layout = make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_1{}, _0{}));
    auto tRow = detail::partition_tile_map<ReferenceSrc>(row_layout, args.epi_tile, args.tiled_copy, args.thread_idx);
    auto tRel = make_tensor_like<int>(tRow.layout());
    auto pick_like = make_tensor_like<float>(tRow.layout());

    int m0 = int(m) * TileM;
    int n0 = int(n) * TileN;
    int first_col = int(N) - int(get<1>(args.residue_tCcD));   // absolute column of the thread's first element
    int Mpad = ((int(M) + TileM - 1) / TileM) * TileM;
    bool cta_in_problem = m0 < int(M) && n0 < int(N);
    float* ptr_tile = params.ptr == nullptr ? nullptr : params.ptr + (int64_t(n) * Mpad + m0);

    Tensor fRel = filter(tRel);
    Tensor fRow = filter(tRow);
    constexpr int Slots = decltype(size(fRel))::value;
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < Slots; ++s) {
      int row = m0 + int(fRow(s));
      int rel = kNone;
      if (ptr_tile != nullptr && cta_in_problem && row < int(M)) {
        int64_t label = int64_t(params.label[row]);
        if (label >= 0 && label < int64_t(N)) {
          rel = int(label) - first_col;
        }
      }
      fRel(s) = rel;
    }

    return ConsumerStoreCallbacks<decltype(tRel), decltype(pick_like), decltype(tRow), decltype(args.tCcD),
                                  decltype(lane_layout)>(
        tRel, pick_like, tRow, args.tCcD, lane_layout, lane_n, first_col - n0, cta_in_problem, ptr_tile);
  }
};

} // namespace epic_nodes
