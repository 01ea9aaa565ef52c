// epic_nodes::Sm90PeriodicRowBroadcast<Element>: a leaf that yields, for each fragment element,
// ptr[col % period] as float -- a vector of `period` values repeated along the row: a per-head
// vector (QK-norm's gamma, RoPE's frequencies) over N = heads * period columns.
//
//   using NodeGamma = epic_nodes::Sm90PeriodicRowBroadcast<cutlass::bfloat16_t>;
//   // Arguments: {ptr, period}
//
// Read straight from global memory through the read-only cache: the vector is small and every CTA
// reads the same values. Columns past N (ragged edges) wrap like the others, so no read leaves the
// vector; whoever consumes those elements masks as usual.
#pragma once

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

template <class Element>
struct Sm90PeriodicRowBroadcast : detail::NoWorkspaceNoLoads {
  struct SharedStorage {};
  struct Arguments {
    Element const* ptr = nullptr;
    int period = 1;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const& args) { return args.ptr != nullptr && args.period > 0; }

  CUTLASS_HOST_DEVICE Sm90PeriodicRowBroadcast() {}
  CUTLASS_HOST_DEVICE Sm90PeriodicRowBroadcast(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  // Column c of a thread's element reads ptr[c % period]. When the CTA tile's columns fall inside one
  // period (detail::periodic_tile_start: a head of 128 on 64- or 128-wide tiles, the usual case), no
  // column wraps: element k reads ptr[(tile_n0 % period) + (c_k - tile_n0)], one pointer per tile plus
  // the element's column offset, which is a compile-time constant once unrolled -- loads with immediate
  // offsets and no index arithmetic (QK-norm + RoPE at M = 8192: 3.4M of 58.1M warp instructions fewer,
  // 5% fewer cycles; bench/results/2026-12-03-h200-qk-norm-periodic.log). Otherwise: one division per
  // subtile (the subtile's first element); every other element is that remainder plus its distance in
  // columns, known at compile time and shorter than the subtile, so one conditional add or subtract (a
  // select, no branch) brings it back into [0, period) when the period is at least the subtile's width.
  // Narrower periods (a head narrower than the subtile) divide per element, as a uniform choice per
  // subtile.
  template <int EpiN, class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, int base, Element const* in_period, Params const& params)
        : tCcD(tCcD), base(base), in_period(in_period), params(params) {}

    CoordTensor tCcD;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's first element
    int base;          // absolute column of this thread's first element
    Element const* in_period;  // no wrap in this tile: where the thread's first element reads; else nullptr
    Params const& params;
    int ref = 0;       // this subtile's first element's column (relative to base)
    int ref_mod = 0;   // (base + ref) % period

    CUTLASS_DEVICE void
    begin_loop(int epi_m, int epi_n) {
      using namespace cute;
      if (in_period == nullptr) {
        ref = int(get<1>(tCcD(_,_,_,epi_m,epi_n)(0)));
        ref_mod = (base + ref) % params.period;
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n) {
      using namespace cute;
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      int const period = params.period;
      cutlass::Array<float, FragmentSize> out;
      if (in_period != nullptr) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          out[i] = float(in_period[int(get<1>(tCcD_mn(epi_v * FragmentSize + i)))]);
        }
      } else if (period >= EpiN) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int distance = int(get<1>(tCcD_mn(epi_v * FragmentSize + i))) - ref;   // |distance| < EpiN
          out[i] = float(params.ptr[detail::periodic_index(ref_mod, distance, period)]);
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          out[i] = float(params.ptr[(base + int(get<1>(tCcD_mn(epi_v * FragmentSize + i)))) % period]);
        }
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    int base = int(get<1>(args.problem_shape_mnkl)) - int(get<1>(args.residue_tCcD));
    constexpr int EpiN = int(size<1>(decltype(args.epi_tile){}));
    constexpr int TileN = int(size<1>(decltype(args.tile_shape_mnk){}));
    int tile_n0 = int(get<1>(args.tile_coord_mnkl)) * TileN;
    int start = detail::periodic_tile_start(tile_n0, TileN, params.period);
    // base - tile_n0: the thread's first column within the tile (its coordinates in tCcD count from it)
    Element const* in_period = start >= 0 ? params.ptr + start + (base - tile_n0) : nullptr;
    return ConsumerStoreCallbacks<EpiN, decltype(args.tCcD)>(args.tCcD, base, in_period, params);
  }
};

} // namespace epic_nodes
