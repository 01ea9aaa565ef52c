// epic_nodes::Sm90Coordinate<Axis>: a leaf that yields each fragment element's absolute row (Axis 0)
// or column (Axis 1) index in the problem, as float (exact below 2^24), computed as float(base) +
// float(offset): the offset of an element from the thread's first is a compile-time constant, so each
// element costs one add instead of an integer add and a conversion (a quarter-rate instruction on the
// pipe that also runs the epilogue's exponentials). Below 2^24 both forms are the same exact integer.
//
//   using NodeRow = epic_nodes::Sm90Coordinate<0>;   // Arguments: {}
//   using NodeCol = epic_nodes::Sm90Coordinate<1>;   // Arguments: {}
//
// Elements outside the problem (ragged edges) get their would-be index (>= M or >= N); whoever
// consumes them masks as usual.
#pragma once

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

template <int Axis>
struct Sm90Coordinate : detail::NoWorkspaceNoLoads {
  static_assert(Axis == 0 || Axis == 1, "epic_nodes::Sm90Coordinate: Axis must be 0 (row) or 1 (column)");

  struct SharedStorage {};
  struct Arguments {};
  struct Params {};

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const&, void*) { return {}; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const&) { return true; }


  CUTLASS_HOST_DEVICE Sm90Coordinate() {}
  CUTLASS_HOST_DEVICE Sm90Coordinate(Params const& params, SharedStorage const&) : params(params) {}

  // A data member keeps the node non-empty: cute::tuple hands out empty elements by value, and the
  // visitor's `[&] (auto& op)` lambdas need an lvalue.
  Params params;

  template <class CoordTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, int base) : tCcD(tCcD), base(float(base)) {}

    CoordTensor tCcD;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's first element
    float base;        // absolute index (along Axis) of this thread's first element

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n) {
      using namespace cute;
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        out[i] = base + float(int(get<Axis>(tCcD_mn(epi_v * FragmentSize + i))));
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    // residue_tCcD = (M, N) - absolute coordinate of the thread's first element
    int extent = int(get<Axis>(args.problem_shape_mnkl));
    int base = extent - int(get<Axis>(args.residue_tCcD));
    return ConsumerStoreCallbacks<decltype(args.tCcD)>(args.tCcD, base);
  }
};

} // namespace epic_nodes
