// epic_nodes::Sm90BlockScale<Block, ElementScale, Pow2, ScaleLayout, Output, ElementQ>: the ROOT of an epilogue
// DAG that quantizes its one child x (float) in 1 x Block row segments.
//
// For every row m and column segment g = n / Block (valid columns only):
//   amax  = max |x[m, n]|                    over n in [g*Block, min((g+1)*Block, N))
//   s     = max(amax, floor) / qmax           (IEEE fp32 division)
//   Pow2:   s = smallest power of two >= s    (exact, see detail::pow2_ceil)
//   stored = ElementScale(s)                  written once per (m, g)
//   q     = x / s                             IEEE fp32 division by the unrounded scale, as the program
//                                             `q = x / s` says (a multiplication by the exact reciprocal
//                                             when the scale is a power of two: identical bits)
//   Output 0: q clamped to [-qmax, qmax]; rintf (half to even) too when ElementD is an integer type.
//             NaN stays NaN for float outputs and becomes 0 for integer ones (epic's saturation rules).
//             The collective converts q to ElementD and stores it as D (TMA).
//   Output 1: D is void; q clamped to [-8, 7], rintf, and column pairs (2k, 2k+1) packed into one byte
//             (low nibble = even column) stored straight to ptr_q[m * (N/2) + n/2].
//   Output 2: D is void; x is a half-width value repeated on both columns of each pair (SwiGLU's
//             output), so a segment of Block columns is one of Block/2 values; q clamped to
//             [-qmax, qmax] (rintf for an integer ElementQ), converted to the one-byte ElementQ
//             and stored once per pair (its even column) at ptr_q[m * (N/2) + n/2].
// Scales: ScaleLayout 0: ptr_scale[m * ceil(N/Block) + g]            (row-major [M, ceil(N/Block)])
//         ScaleLayout 1: ptr_scale[g * round_up(M, 4) + m]           (MN-major, TMA-aligned;
//                        rows [M, round_up(M,4)) of the padding are not written)
//
//   using Node = epic_nodes::Sm90BlockScale<128, float, true, 1, 0>;
//   Arguments: {ElementScale* ptr_scale, float qmax, float floor, uint8_t* ptr_q /* Output 1, 2 only */}
//
// Split segments (CTA tile N = Block / 2, cluster 1x2, pingpong): each CTA takes the amax of its half of
// every segment and the pair exchange the halves through each other's shared memory
// (detail::exchange_halves; the kernel's mainloop is wrapped in epic_mainloop::PairSlots); the left CTA
// stores the scale. For decode-sized M, where Block-wide tiles leave most SMs idle.
//
// A program that wants q * stored_scale ~ x for a low-precision ElementScale divides by the rounded
// scale itself (q = x / bf16(s)); that is a different program, and a different node match.
//
// Requirements (static_asserts): the epilogue subtile's N is a multiple of Block (a segment never spans
// two subtiles; e.g. Block 128 on cooperative 128x256 needs an explicit 128x128 epilogue tile), and one
// warp owns each subtile row. Works entirely in registers: thread-local amax per (row, segment) slot,
// then an XOR butterfly over the lanes sharing the row; no shared memory, no barrier, deterministic.
#pragma once

#include <type_traits>
#include "epic_nodes/detail.hpp"
#include "epic_nodes/pair_exchange.hpp"

namespace epic_nodes {

template <int Block, class ElementScale, bool Pow2, int ScaleLayout, int Output, class ElementQ = uint8_t>
struct Sm90BlockScale : detail::NoWorkspaceNoLoads {
  static_assert(Block >= 8 && Block <= 256 && (Block & (Block - 1)) == 0,
                "epic_nodes::Sm90BlockScale: Block must be a power of two in [8, 256]");
  static_assert(ScaleLayout == 0 || ScaleLayout == 1, "epic_nodes::Sm90BlockScale: ScaleLayout is 0 or 1");
  static_assert(Output >= 0 && Output <= 2,
                "epic_nodes::Sm90BlockScale: Output is 0 (D), 1 (packed int4) or 2 (half-width bytes)");
  static_assert(sizeof(ElementQ) == 1, "epic_nodes::Sm90BlockScale: ElementQ is a one-byte type");

  struct SharedStorage {};

  struct Arguments {
    ElementScale* ptr_scale = nullptr;  // nullptr: quantize but store no scales
    float qmax = 0.f;                   // e.g. 448 (e4m3), 57344 (e5m2), 127 (int8), 7 or 8 (int4)
    float floor = 0.f;                  // lower bound of amax (keeps all-zero segments finite): > 0
    uint8_t* ptr_q = nullptr;           // Output 1: [M, N/2] packed int4 bytes; 2: [M, N/2] ElementQ; 0: nullptr
  };

  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto shape_mnkl = cute::append<4>(problem_shape, 1);
    bool ok = args.qmax > 0.f;
    if constexpr (Output != 0) {
      ok = ok && int(cute::get<1>(shape_mnkl)) % 2 == 0;
    }
    return ok;
  }


  CUTLASS_HOST_DEVICE Sm90BlockScale() {}
  CUTLASS_HOST_DEVICE Sm90BlockScale(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <int TileM, int TileN, class Segs, class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(Segs seg, CoordTensor tCcD, Residue residue_tCcD, Params const& params)
      : seg(seg), tCcD(tCcD), residue_tCcD(residue_tCcD), params(params) {}

    Segs seg;              // the segment map, the lanes sharing rows, the CTA tile (detail::BlockSegments)
    CoordTensor tCcD;      // element coordinates relative to the thread's first element
    Residue residue_tCcD;  // (M, N) - absolute coordinate of the thread's first element
    Params const& params;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> convert;
      return convert(frg_input);
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      using ElementD = typename cute::remove_cvref_t<STensor>::value_type;  // the collective's smem D type
      using Fragment = typename cute::remove_cvref_t<VTensor>::value_type;
      constexpr int FragmentSize = Fragment::kElements;
      constexpr int NumFragments = decltype(size(visit_results))::value;
      constexpr bool IntegerOut = Output == 1 || (Output == 2 ? std::is_integral<ElementQ>::value
                                                                : std::is_integral<ElementD>::value);
      static_assert(std::is_same<typename Fragment::Element, float>::value, "root fragments must be float");

      if (not seg.cta_in_problem) {  // a CTA outside the problem (cluster padding): nothing is stored
        return;
      }

      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      Tensor tSeg_mn = seg.tSeg(_,_,_,epi_m,epi_n);
      static_assert(decltype(size(tSeg_mn))::value == NumFragments * FragmentSize, "fragment/partition mismatch");

      // 1. thread-local amax per (row, segment) slot, valid elements only
      Tensor tAmax = make_tensor_like<float>(tSeg_mn.layout());
      Tensor fAmax = filter(tAmax);
      Tensor fSeg = filter(tSeg_mn);
      constexpr int Slots = decltype(size(fAmax))::value;
      static_assert(decltype(size(fSeg))::value == Slots, "segment map and slots disagree");
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        fAmax(s) = 0.f;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < NumFragments; ++v) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int k = v * FragmentSize + i;
          tAmax(k) = detail::amax_fold(tAmax(k), visit_results(v)[i], elem_less(tCcD_mn(k), residue_tCcD));
        }
      }

      // 2. lanes that share the rows: XOR butterfly max
      auto max = [](float a, float b) { return fmaxf(a, b); };
      detail::merge_row_lanes(seg.lane_layout, fAmax, max);
      if constexpr (TileN < Block) {   // split segment: the other half is in the cluster's other CTA
        detail::exchange_halves<Block, TileM, TileN>(seg, fSeg, fAmax, 0.f, max);
      }

      // 3. scales: the stored copy is rounded to ElementScale; q is divided by the f32 value
      Tensor tScale = make_tensor_like<float>(tSeg_mn.layout());
      Tensor fScale = filter(tScale);
      ElementScale stored[Slots];
      // A multiplication by 1/s instead of a division: bit-exact for power-of-two scales; for fp8
      // outputs the product is within 1.5 ulp of f32 (24 bits) of x / s, far finer than fp8's 3 or 2
      // mantissa bits (it changes a value only at an fp8 rounding tie). Integer outputs divide.
      bool exact_reciprocal = true;
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        float sc = detail::block_scale_of<Pow2>(fAmax(s), params.floor, params.qmax);
        stored[s] = cutlass::NumericConverter<ElementScale, float>{}(sc);
        fScale(s) = sc;
        exact_reciprocal = exact_reciprocal && detail::use_reciprocal<Pow2, IntegerOut>(sc);
      }

      // 4. rewrite the fragments: q = x / scale, clamp (and round for integer outputs)
      float const lo = Output == 1 ? -8.f : -params.qmax;
      float const hi = Output == 1 ? 7.f : params.qmax;
      if (exact_reciprocal) {
        Tensor tRcp = make_tensor_like<float>(tSeg_mn.layout());
        Tensor fRcp = filter(tRcp);
        CUTLASS_PRAGMA_UNROLL
        for (int s = 0; s < Slots; ++s) {
          fRcp(s) = detail::reciprocal(fScale(s));
        }
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < NumFragments; ++v) {
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < FragmentSize; ++i) {
            visit_results(v)[i] = detail::quantize_rcp(visit_results(v)[i], tRcp(v * FragmentSize + i), lo, hi, IntegerOut);
          }
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int v = 0; v < NumFragments; ++v) {
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < FragmentSize; ++i) {
            visit_results(v)[i] = detail::quantize_div(visit_results(v)[i], tScale(v * FragmentSize + i), lo, hi,
                                                       IntegerOut);
          }
        }
      }

      // 5. one store per (row, segment), spread over the lanes that share the row
      if (params.ptr_scale != nullptr && !seg.right) {    // a split segment's left half stores it
        int const segs_n = (seg.N + Block - 1) / Block;
        int const m_pad4 = (seg.M + 3) / 4 * 4;
        detail::for_each_owned_segment<Block, TileM>(seg, fSeg, [&](int s, int m, int g) {
          int64_t idx = ScaleLayout == 0 ? int64_t(m) * segs_n + g : int64_t(g) * m_pad4 + m;
          params.ptr_scale[idx] = stored[s];
        });
      }

      // 6. Output 1: pack column pairs into int4 bytes and store them
      if constexpr (Output == 1) {
        if (params.ptr_q != nullptr) {
          int64_t const pitch = seg.N / 2;
          int const m_t = seg.M - int(get<0>(residue_tCcD));
          int const n_t = seg.N - int(get<1>(residue_tCcD));
          uint8_t* ptr_thread = params.ptr_q + int64_t(m_t) * pitch + (n_t >> 1);
          static_assert(FragmentSize % 2 == 0, "odd fragment size");
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < NumFragments; ++v) {
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < FragmentSize / 2; ++j) {
              auto c = tCcD_mn(v * FragmentSize + 2 * j);  // even column of the pair
              if (elem_less(c, residue_tCcD)) {
                ptr_thread[int64_t(get<0>(c)) * pitch + (int(get<1>(c)) >> 1)] =
                    detail::pack_int4(visit_results(v)[2 * j], visit_results(v)[2 * j + 1]);
              }
            }
          }
        }
      }

      // 7. Output 2: one ElementQ per column pair (the value is on both columns), stored directly
      if constexpr (Output == 2) {
        if (params.ptr_q != nullptr) {
          int64_t const pitch = seg.N / 2;
          int const m_t = seg.M - int(get<0>(residue_tCcD));
          int const n_t = seg.N - int(get<1>(residue_tCcD));
          ElementQ* ptr_thread = reinterpret_cast<ElementQ*>(params.ptr_q) + int64_t(m_t) * pitch + (n_t >> 1);
          static_assert(FragmentSize % 2 == 0, "odd fragment size");
          cutlass::NumericConverter<ElementQ, float> to_q;
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < NumFragments; ++v) {
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < FragmentSize / 2; ++j) {
              auto c = tCcD_mn(v * FragmentSize + 2 * j);  // even column of the pair
              if (elem_less(c, residue_tCcD)) {
                ptr_thread[int64_t(get<0>(c)) * pitch + (int(get<1>(c)) >> 1)] = to_q(visit_results(v)[2 * j]);
              }
            }
          }
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    constexpr int TileM = decltype(size<0>(args.tile_shape_mnk))::value;
    constexpr int TileN = decltype(size<1>(args.tile_shape_mnk))::value;
    auto seg = detail::block_segments<ReferenceSrc, Block, TileM, TileN>(args);
    return ConsumerStoreCallbacks<TileM, TileN, decltype(seg), decltype(args.tCcD), decltype(args.residue_tCcD)>(
        seg, args.tCcD, args.residue_tCcD, params);
  }
};

} // namespace epic_nodes
