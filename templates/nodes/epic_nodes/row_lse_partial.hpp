// epic_nodes::Sm90RowLsePartial<TileShape>: a sink with one child x (float). For every row m and CTA
// column tile t = n / TileN it writes the log-sum-exp of the tile's valid columns, one float:
//
//   ptr[t * Mpad + m] = mx + log(se),  mx = max_n x[m, n],  se = sum_n exp(x[m, n] - mx)
//                                                                     Mpad = round_up(M, TileM)
//
// Rows m in [M, Mpad) get -inf; so does a row whose valid x are all -inf. Columns n >= N (ragged
// edge) enter neither max nor sum. A separate combine pass merges the ceil(N / TileN) values of a row
// (log(exp(a) + exp(b)), the lse reduction's merge in epic/ir/primitives.py). One float, not the
// (max, sum) pair: half the bytes for the combine to read (cross entropy: 668 tiles per row).
//
//   using Node = epic_nodes::Sm90RowLsePartial<TileShape>;   // Arguments: {float* ptr}
//
// Deterministic: every thread keeps one (max, sum) register set per row it holds ("slots", see
// detail.hpp) online, folds each fragment in with a fixed order, and the lanes that share a row merge
// with an XOR butterfly (bit-identical on all of them) once, after the last subtile. No shared memory, no
// atomics, no barrier. Sums are split into two interleaved accumulators (even / odd fragment elements)
// to halve the serial fp32 addition chain. exp is __expf. The arithmetic is detail::lse_* (arith.hpp),
// which the host simulator runs too.
#pragma once

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

template <class TileShape>
struct Sm90RowLsePartial : detail::NoWorkspaceNoLoads {
  struct SharedStorage {};

  struct Arguments {
    float* ptr = nullptr;  // [ceil(N / TileN), Mpad] fp32; nullptr: compute nothing, write nothing
  };

  struct Params {
    float* ptr = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return {args.ptr}; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const& args) {
    return (reinterpret_cast<uintptr_t>(args.ptr) % 4) == 0;
  }


  CUTLASS_HOST_DEVICE Sm90RowLsePartial() {}
  CUTLASS_HOST_DEVICE Sm90RowLsePartial(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <class RegTensor, class RowMap, class CoordTensor, class Residue, class LaneLayout>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(RegTensor const& reg_like, RowMap tRow, CoordTensor tCcD, Residue residue_tCcD,
                           LaneLayout lane_layout, int lane_n, bool cta_in_problem, bool tile_inside,
                           float* ptr_tile, Params const& params)
      : tMax(reg_like), tSum0(reg_like), tSum1(reg_like), tRow(tRow), tCcD(tCcD), residue_tCcD(residue_tCcD),
        lane_layout(lane_layout), lane_n(lane_n), cta_in_problem(cta_in_problem), tile_inside(tile_inside),
        ptr_tile(ptr_tile), params(params) {
      using namespace cute;
      fill(tMax, -INFINITY);
      fill(tSum0, 0.f);
      fill(tSum1, 0.f);
    }

    RegTensor tMax;        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N), zero strides along N: one register per row
    RegTensor tSum0;       // sum of exp over even fragment elements
    RegTensor tSum1;       // ... odd fragment elements
    RowMap tRow;           // same partition, value = row within the CTA tile
    CoordTensor tCcD;      // element coordinates relative to the thread's first element
    Residue residue_tCcD;  // (M, N) - absolute coordinate of the thread's first element
    LaneLayout lane_layout;
    int lane_n;            // this lane's index among the lanes that share its rows
    bool cta_in_problem;   // false for a CTA entirely outside (M, N) (cluster padding)
    bool tile_inside;      // the whole CTA tile lies inside (M, N): no element to mask
    float* ptr_tile;       // &ptr[t * Mpad + m0]
    Params const& params;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using namespace cute;
      if (params.ptr == nullptr) {
        return frg_input;
      }
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert;
      cutlass::Array<float, FragmentSize> x = convert(frg_input);

      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      Tensor tMax_mn = tMax(_,_,_,epi_m,epi_n);
      Tensor tSum0_mn = tSum0(_,_,_,epi_m,epi_n);
      Tensor tSum1_mn = tSum1(_,_,_,epi_m,epi_n);

      // Masked (ragged) elements become -inf: they neither raise the max nor add to the sum. Only a
      // tile on the ragged edge has any (a branch the whole warp takes alike, not a test per element).
      if (not tile_inside) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          if (not elem_less(tCcD_mn(epi_v * FragmentSize + i), residue_tCcD)) {
            x[i] = -INFINITY;
          }
        }
      }

      // 1. new row maxima over this fragment (remember the old ones of this subtile's rows)
      Tensor fMax = filter(tMax_mn);
      Tensor fSum0 = filter(tSum0_mn);
      Tensor fSum1 = filter(tSum1_mn);
      constexpr int Slots = decltype(size(fMax))::value;
      float old_max[Slots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        old_max[s] = fMax(s);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        float& m = tMax_mn(epi_v * FragmentSize + i);
        m = fmaxf(m, x[i]);
      }
      // 2. rescale the running sums once per row (factor 1 when the max did not move)
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        float c = detail::lse_rescale(old_max[s], fMax(s));
        fSum0(s) *= c;
        fSum1(s) *= c;
      }
      // 3. add this fragment's terms against the new max (its pivot: one test per row, the same
      //    expression for every element of the row, computed once)
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int k = epi_v * FragmentSize + i;
        float e = detail::lse_term(x[i], detail::lse_pivot(tMax_mn(k)));
        if (i % 2 == 0) { tSum0_mn(k) += e; }
        else            { tSum1_mn(k) += e; }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      using namespace cute;
      if (not is_last_iteration || params.ptr == nullptr) {
        return;
      }
      Tensor fMax = filter(tMax);
      Tensor fSum0 = filter(tSum0);
      Tensor fSum1 = filter(tSum1);
      Tensor fRow = filter(tRow);
      constexpr int Slots = decltype(size(fMax))::value;
      static_assert(decltype(size(fRow))::value == Slots, "row map and accumulators disagree");

      float mx[Slots], se[Slots];
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        mx[s] = fMax(s);
        se[s] = fSum0(s) + fSum1(s);
      }
      // Lanes that hold the same rows: XOR butterfly (all lanes end with the same bits).
      constexpr int RowLanes = decltype(size<1>(lane_layout))::value;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 1; r < RowLanes; r *= 2) {
        int mask = int(lane_layout(_0{}, r));
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < Slots; ++s) {
          float m2 = __shfl_xor_sync(0xffffffffu, mx[s], mask);
          float s2 = __shfl_xor_sync(0xffffffffu, se[s], mask);
          detail::lse_merge(mx[s], se[s], m2, s2);
        }
      }
      if (not cta_in_problem) {
        return;
      }
      // Every row of the CTA tile is held by exactly one lane group; spread its slots over the group.
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        if (s % RowLanes == lane_n) {
          int row = int(fRow(s));
          ptr_tile[row] = detail::lse_value(mx[s], se[s]);
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
                  "epic_nodes::Sm90RowLsePartial: TileShape must be the GEMM's CTA tile shape");

    // One warp must own each row of an epilogue subtile (true for every sm90 wgmma tiled MMA, whose
    // warp groups and warps are stacked along M); then lane shuffles finish the reduction.
    auto warp_layout = detail::warp_layout_mn<ReferenceSrc>(args.tiled_copy);
    static_assert(decltype(size<1>(warp_layout))::value == 1,
                  "epic_nodes::Sm90RowLsePartial: several warps share a row; not supported");
    auto lane_layout = detail::lane_layout_mn<ReferenceSrc>(args.tiled_copy);
    int lane_n = detail::lane_n_index(lane_layout, int(threadIdx.x % 32));

    // Row map: value at (m, n) of the CTA tile is m; zero stride along n gives one slot per row.
    auto row_layout = make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_1{}, _0{}));
    auto tRow = detail::partition_tile_map<ReferenceSrc>(row_layout, args.epi_tile, args.tiled_copy, args.thread_idx);
    auto reg_like = make_tensor_like<float>(tRow.layout());

    int m0 = int(m) * TileM;
    int Mpad = ((int(M) + TileM - 1) / TileM) * TileM;
    bool cta_in_problem = m0 < int(M) && int(n) * TileN < int(N);
    float* ptr_tile = params.ptr == nullptr ? nullptr
                    : params.ptr + (int64_t(n) * Mpad + m0);

    return ConsumerStoreCallbacks<decltype(reg_like), decltype(tRow), decltype(args.tCcD),
                                  decltype(args.residue_tCcD), decltype(lane_layout)>(
        reg_like, tRow, args.tCcD, args.residue_tCcD, lane_layout, lane_n, cta_in_problem,
        detail::tile_inside_problem(args), ptr_tile, params);
  }
};

} // namespace epic_nodes
