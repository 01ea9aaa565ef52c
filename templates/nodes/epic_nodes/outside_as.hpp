// epic_nodes::Sm90OutsideAs: a node with one child x that passes x on, with every element outside the
// problem (the ragged edge: row >= M or column >= N) replaced by `value`.
//
//   using Node = epic_nodes::Sm90OutsideAs;   // Arguments: {float value}
//
// It stands before CUTLASS's Sm90ColReduction / Sm90RowReduction built with VisitCheckOOB = false,
// value = the reduction's identity: the reduction then adds every element it visits, and those
// outside add the identity, which leaves each partial as the checked reduction makes it (bit for bit:
// it starts from the identity, and the identity is neutral for every value the partial can hold).
// The point is where the test happens: a tile inside the problem (all but the last row and column of
// tiles) passes its fragments untouched after one branch per fragment that its warp takes alike,
// where the checked reduction tests every element's coordinates (two compares, a predicate
// combination and a select per element, on every tile).
#pragma once

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

struct Sm90OutsideAs : detail::NoWorkspaceNoLoads {
  struct SharedStorage {};

  struct Arguments {
    float value = 0.f;     // what an element outside the problem becomes (a reduction's identity)
  };

  struct Params {
    float value = 0.f;
  };

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return {args.value}; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const&) { return true; }

  CUTLASS_HOST_DEVICE Sm90OutsideAs() {}
  CUTLASS_HOST_DEVICE Sm90OutsideAs(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, Residue residue_tCcD, bool tile_inside, float value)
      : tCcD(tCcD), residue_tCcD(residue_tCcD), tile_inside(tile_inside), value(value) {}

    CoordTensor tCcD;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's first element
    Residue residue_tCcD;  // (M, N) - absolute coordinate of the thread's first element
    bool tile_inside;      // the whole CTA tile lies inside (M, N): nothing to replace
    float value;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using namespace cute;
      if (tile_inside) {
        return frg_input;
      }
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      cutlass::Array<ElementInput, FragmentSize> out = frg_input;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        if (not elem_less(tCcD_mn(epi_v * FragmentSize + i), residue_tCcD)) {
          out[i] = ElementInput(value);
        }
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, detail::tile_inside_problem(args), params.value);
  }
};

} // namespace epic_nodes
