// epic_nodes::Sm90PackedInt4Store: a sink with one child q (float values that are already integers in
// [-8, 7]). Packs column pairs (2k, 2k+1) of a row into one byte, low nibble = even column, two's
// complement nibbles, and stores the bytes straight to global memory (no shared memory, no TMA):
//
//   ptr[m * (N / 2) + n / 2] = (q[m, n] & 0xF) | (q[m, n + 1] & 0xF) << 4      for even n, m < M, n < N
//
// N must be even (can_implement checks). Only in-bounds pairs are written. q is converted with
// round-to-nearest-even (exact for integers); a value outside [-8, 7] keeps only its low 4 bits.
//
//   using Node = epic_nodes::Sm90PackedInt4Store;   // Arguments: {uint8_t* ptr}
//
// Relies on fragment elements 2j and 2j+1 being columns n and n+1 (n even) of one row, which holds
// for the sm90 wgmma accumulator layout (pinned by the probe, tests/probes/nodes_probe.cu, and checked
// on the host by tests/probes/fragment_map.cu).
#pragma once

#include "epic_nodes/detail.hpp"

namespace epic_nodes {

struct Sm90PackedInt4Store : detail::NoWorkspaceNoLoads {
  struct SharedStorage {};

  struct Arguments {
    uint8_t* ptr = nullptr;  // [M, N/2] bytes, row pitch N/2; nullptr: store nothing
  };

  struct Params {
    uint8_t* ptr = nullptr;
  };

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return {args.ptr}; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const& problem_shape, Arguments const&) {
    auto shape_mnkl = cute::append<4>(problem_shape, 1);
    return int(cute::get<1>(shape_mnkl)) % 2 == 0;
  }


  CUTLASS_HOST_DEVICE Sm90PackedInt4Store() {}
  CUTLASS_HOST_DEVICE Sm90PackedInt4Store(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, Residue residue_tCcD, uint8_t* ptr_thread, int64_t pitch)
      : tCcD(tCcD), residue_tCcD(residue_tCcD), ptr_thread(ptr_thread), pitch(pitch) {}

    CoordTensor tCcD;      // element coordinates relative to the thread's first element
    Residue residue_tCcD;  // (M, N) - absolute coordinate of the thread's first element
    uint8_t* ptr_thread;   // byte of the thread's first element (row m_t, column n_t) if n_t were even
    int64_t pitch;         // N / 2

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using namespace cute;
      static_assert(FragmentSize % 2 == 0, "epic_nodes::Sm90PackedInt4Store: odd fragment size");
      if (ptr_thread == nullptr) {
        return frg_input;
      }
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert;
      cutlass::Array<float, FragmentSize> q = convert(frg_input);
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < FragmentSize / 2; ++j) {
        auto c = tCcD_mn(epi_v * FragmentSize + 2 * j);   // the even column of the pair
        if (elem_less(c, residue_tCcD)) {
          ptr_thread[int64_t(get<0>(c)) * pitch + (int(get<1>(c)) >> 1)] = detail::pack_int4(q[2 * j], q[2 * j + 1]);
        }
      }
      return frg_input;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    int m_t = int(M) - int(get<0>(args.residue_tCcD));
    int n_t = int(N) - int(get<1>(args.residue_tCcD));
    int64_t pitch = int64_t(N) / 2;
    uint8_t* ptr_thread = params.ptr == nullptr ? nullptr
                        : params.ptr + int64_t(m_t) * pitch + (n_t >> 1);
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, ptr_thread, pitch);
  }
};

} // namespace epic_nodes
