// epic_nodes::Sm90BlockReduceScale<Block, Fn, Divide, ElementScale, Masked>: the ROOT of an epilogue DAG that
// scales its first child y by a statistic of each 1 x Block row segment of its second child z.
//
// For every row m and column segment g = n / Block (valid columns only):
//   stat = Fn::identity(), then Fn::merge(stat, Fn::pre(z[m, n]))   over n in the segment
//   s    = Fn::finalize(stat)                                         (a generated functor)
//   D    = y * s            (Divide: y / s, IEEE fp32 division)       converted and stored by the collective
//   ptr_scale, when given: ElementScale(s) at [m * ceil(N / Block) + g]   (row-major [M, ceil(N/Block)])
//   Masked: a third child, per element 0 or 1: D = y where it is 0 (the scale skipped), y * s where 1.
//           A fused QKV projection's QK-norm: select(col < qk_cols, head_rmsnorm(acc, gamma, 128), acc)
//           gives y = select(col < qk_cols, acc * gamma, acc) and mask = (col < qk_cols); one bit per
//           element of the subtile is kept from visit() to reduce().
//
// QK-norm after epic's hoist-block-scale pass: y = rope(acc * gamma, pos, freq), z = acc * acc,
// Fn = sum with finalize rsqrt(stat / Dh + eps): one epilogue, no second pass over the output.
//
//   struct Fn { static float identity(); static float pre(float); static void merge(float&, float);
//               static float finalize(float); };     (all CUTLASS_DEVICE; merge commutative)
//   using Node = epic_nodes::Sm90BlockReduceScale<128, Fn, false, float>;
//   Arguments: {ElementScale* ptr_scale}
//
// Split segments (CTA tile N = Block / 2, cluster 1x2, pingpong): each CTA reduces its half of every
// segment and the pair exchange the halves through each other's shared memory (detail::exchange_halves;
// the kernel's mainloop is wrapped in epic_mainloop::PairSlots); the left CTA stores s.
//
// z is reduced while the subtile is visited: visit() merges each valid element into a thread-local slot
// per (row, segment) of the subtile; reduce() merges the slots over the lanes that share the rows (XOR
// butterfly: every lane ends with the same bits, whatever its position), rewrites the subtile and resets
// the slots. Requirements as Sm90BlockScale's: a segment never spans two subtiles, one warp owns each
// subtile row. Registers only, no shared memory, deterministic.
#pragma once

#include <utility>
#include "epic_nodes/detail.hpp"
#include "epic_nodes/pair_exchange.hpp"

namespace epic_nodes {

template <int Block, class Fn, bool Divide, class ElementScale, bool Masked = false>
struct Sm90BlockReduceScale : detail::NoWorkspaceNoLoads {
  static_assert(Block >= 8 && Block <= 256 && (Block & (Block - 1)) == 0,
                "epic_nodes::Sm90BlockReduceScale: Block must be a power of two in [8, 256]");

  struct SharedStorage {};

  struct Arguments {
    ElementScale* ptr_scale = nullptr;  // nullptr: scale, but store no statistic
  };

  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const&) { return true; }

  CUTLASS_HOST_DEVICE Sm90BlockReduceScale() {}
  CUTLASS_HOST_DEVICE Sm90BlockReduceScale(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  template <int TileM, int TileN, class Segs, class StatTensor, class CoordTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(Segs seg, StatTensor tStat, CoordTensor tCcD, Residue residue_tCcD, Params const& params)
      : seg(seg), tStat(tStat), tCcD(tCcD), residue_tCcD(residue_tCcD), params(params) {
      reset();
    }

    Segs seg;              // the segment map, the lanes sharing rows, the CTA tile (detail::BlockSegments)
    StatTensor tStat;      // one register per (row, segment) slot of the current subtile
    CoordTensor tCcD;      // element coordinates relative to the thread's first element
    Residue residue_tCcD;  // (M, N) - absolute coordinate of the thread's first element
    Params const& params;
    static constexpr int Elements = decltype(cute::size(std::declval<StatTensor&>()))::value;  // per subtile
    uint32_t mask_bits[Masked ? (Elements + 31) / 32 : 1];   // Masked: bit k set: element k is scaled

    CUTLASS_DEVICE void reset() {
      auto fStat = cute::filter(tStat);
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < cute::size(fStat); ++s) {
        fStat(s) = Fn::identity();
      }
    }

    // y passes through (as float); each valid z element is merged into its slot. The collective calls
    // this for every fragment of a subtile (epi_v unrolled: the slot index is static) before reduce().
    template <class ElementAccumulator, class ElementY, class ElementZ, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementY, FragmentSize> const& frg_y, cutlass::Array<ElementZ, FragmentSize> const& frg_z) {
      using namespace cute;
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int k = epi_v * FragmentSize + i;
        if (elem_less(tCcD_mn(k), residue_tCcD)) {
          float a = tStat(k);
          Fn::merge(a, Fn::pre(float(frg_z[i])));
          tStat(k) = a;
        }
      }
      cutlass::NumericArrayConverter<float, ElementY, FragmentSize> convert;
      return convert(frg_y);
    }

    // Masked: the mask's bits recorded (k is static once unrolled), then as above
    template <class ElementAccumulator, class ElementY, class ElementZ, class ElementMask, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const& acc, int epi_v, int epi_m, int epi_n,
          cutlass::Array<ElementY, FragmentSize> const& frg_y, cutlass::Array<ElementZ, FragmentSize> const& frg_z,
          cutlass::Array<ElementMask, FragmentSize> const& frg_mask) {
      static_assert(Masked, "epic_nodes::Sm90BlockReduceScale: a third child needs Masked");
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int k = epi_v * FragmentSize + i;
        uint32_t bit = uint32_t(float(frg_mask[i]) != 0.f) << (k & 31);
        mask_bits[k >> 5] = (mask_bits[k >> 5] & ~(1u << (k & 31))) | bit;
      }
      return visit(acc, epi_v, epi_m, epi_n, frg_y, frg_z);
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      using Fragment = typename cute::remove_cvref_t<VTensor>::value_type;
      constexpr int FragmentSize = Fragment::kElements;
      constexpr int NumFragments = decltype(size(visit_results))::value;
      static_assert(std::is_same<typename Fragment::Element, float>::value, "root fragments must be float");

      if (not seg.cta_in_problem) {  // a CTA outside the problem (cluster padding): nothing is stored
        reset();
        return;
      }
      Tensor tSeg_mn = seg.tSeg(_,_,_,epi_m,epi_n);
      static_assert(decltype(size(tSeg_mn))::value == NumFragments * FragmentSize, "fragment/partition mismatch");
      Tensor fStat = filter(tStat);
      Tensor fSeg = filter(tSeg_mn);
      constexpr int Slots = decltype(size(fStat))::value;
      static_assert(decltype(size(fSeg))::value == Slots, "segment map and slots disagree");

      // 1. lanes that share the rows: XOR butterfly merge
      auto merge = [](float a, float b) { Fn::merge(a, b); return a; };
      detail::merge_row_lanes(seg.lane_layout, fStat, merge);
      if constexpr (TileN < Block) {   // split segment: the other half is in the cluster's other CTA
        detail::exchange_halves<Block, TileM, TileN>(seg, fSeg, fStat, Fn::identity(), merge);
      }

      // 2. the statistic's value per slot (in place), then the subtile rewritten
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < Slots; ++s) {
        fStat(s) = Fn::finalize(fStat(s));
      }
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < NumFragments; ++v) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < FragmentSize; ++i) {
          int const k = v * FragmentSize + i;
          float s = Masked && !((mask_bits[k >> 5] >> (k & 31)) & 1u) ? 1.f : tStat(k);   // y * 1, y / 1: y
          visit_results(v)[i] = detail::apply_scale<Divide>(visit_results(v)[i], s);
        }
      }

      // 3. one store per (row, segment), spread over the lanes that share the row
      if (params.ptr_scale != nullptr && !seg.right) {    // a split segment's left half stores it
        int const segs_n = (seg.N + Block - 1) / Block;
        detail::for_each_owned_segment<Block, TileM>(seg, fSeg, [&](int s, int m, int g) {
          params.ptr_scale[int64_t(m) * segs_n + g] = cutlass::NumericConverter<ElementScale, float>{}(fStat(s));
        });
      }
      reset();
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    constexpr int TileM = decltype(size<0>(args.tile_shape_mnk))::value;
    constexpr int TileN = decltype(size<1>(args.tile_shape_mnk))::value;
    auto seg = detail::block_segments<ReferenceSrc, Block, TileM, TileN>(args);
    auto tStat = make_tensor_like<float>(seg.tSeg(_,_,_,_0{},_0{}).layout());
    return ConsumerStoreCallbacks<TileM, TileN, decltype(seg), decltype(tStat), decltype(args.tCcD),
                                  decltype(args.residue_tCcD)>(seg, tStat, args.tCcD, args.residue_tCcD, params);
  }
};

} // namespace epic_nodes
