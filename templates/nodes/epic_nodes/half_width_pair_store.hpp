// epic_nodes::Sm90HalfWidthPairStore<Element, EpilogueTile>: the root sink of a kernel whose one output
// is half as wide as the accumulator (swiglu: column pair (2k, 2k+1) -> output column k), stored as an
// [M, N/2] tile of a 16-bit Element with stmatrix and a TMA store of its own.
//
//   y[m, n / 2] = Element(x[m, n])      for even n, m < M, n < N   (x: the child; element 2k of a pair)
//
// Why: through the collective the half-width tile can only go out as an [M, N] tile of bytes (two
// bytes per pair), which shared memory takes as one 16-bit store per value. Here a quad of lanes
// exchanges its values (2 shuffles, 2 selects and 2 byte permutes per two registers) so that each lane
// holds two adjacent outputs, as stmatrix wants them: one stmatrix.x4 stores 8 values a lane, 8x
// fewer shared-memory store instructions.
//
// The lane of an sm90 wgmma accumulator quad (q = lane % 4, g = lane / 4) holds, in each 8-column block
// j of its rows g and g + 8, the pair (8j + 2q, 8j + 2q + 1): output column 4j + q. Of two blocks
// (2b, 2b + 1), lane q packs W0 = (row g, row g + 8) of block 2b and W1 the same of block 2b + 1, sends
// one of them in each of two shuffles, and ends with R0 = (8b + 2q, 8b + 2q + 1) of row g and R1 of row
// g + 8, the registers of an 8x8 stmatrix tile; four such tiles go out in one stmatrix.x4 (two in an
// x2 where a subtile has an odd number of them). The fragment order this relies on (element 4j + 2h + c
// = row g + 8h, column 8j + 2q + c) is asserted at compile time from the partition's coordinates.
//
// Shared memory: the collective's D staging buffer of the current store stage, which reduce() hands to
// every node and which is unused here (D is void; the DAG's ElementAux is uint8_t, so a stage holds
// EPI_M x EPI_N bytes, exactly the half-width subtile). The collective fences, synchronizes and commits
// around tma_store() as for its own D, so the stage's reuse is guarded by its store pipeline. No other
// node of the kernel may use that buffer (epic emits this node only as the kernel's one store).
//
//   using Node = epic_nodes::Sm90HalfWidthPairStore<cutlass::bfloat16_t, typename EpiDesc::EpilogueTile>;
//   Arguments: {Element* ptr}   ([M, N/2] row-major, row pitch N/2; N / 2 * sizeof(Element) % 16 == 0)
#pragma once

#include "epic_nodes/detail.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"   // sm90_get_epilogue_smem_swizzle_layout_atom

namespace epic_nodes {

template <class Element, class EpilogueTile>
struct Sm90HalfWidthPairStore : detail::NoWorkspaceNoLoads {
  static_assert(cute::sizeof_bits_v<Element> == 16, "a half-width pair store holds 16-bit outputs");
  static constexpr int EpiM = decltype(cute::size<0>(cute::shape(EpilogueTile{})))::value;
  static constexpr int EpiN = decltype(cute::size<1>(cute::shape(EpilogueTile{})))::value;
  static_assert(EpiN % 16 == 0, "the subtile's half width must be whole 8x8 stmatrix tiles");
  using HalfShape = cute::Shape<cute::Int<EpiM>, cute::Int<EpiN / 2>>;
  using StrideHalf = cute::Stride<int64_t, cute::_1, int64_t>;
  using SmemLayout = decltype(cute::tile_to_shape(
      cutlass::epilogue::collective::detail::sm90_get_epilogue_smem_swizzle_layout_atom<StrideHalf, Element, HalfShape>(),
      HalfShape{}));

  // The element (row, col) of a subtile staged at smem, where the TMA store reads it (the layout's
  // swizzle acts on byte addresses; the position-independent tensor applies it to element offsets).
  CUTE_HOST_DEVICE static Element*
  element_at(Element* smem, int row, int col) {
    using namespace cute;
    Tensor sHalf = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(smem), SmemLayout{}));
    return &sHalf(row, col);
  }

  // One lane's part in the quad exchange (q = lane % 4). Shuffle 1 sends W1 from odd lanes (W0 from
  // even ones) and reads lane [0, 2, 1, 3][q] of the quad; shuffle 2 sends the other word and reads
  // [1, 3, 0, 2][q]; the byte permutes of the two words read give the row-g and row-(g + 8) registers
  // (lanes 2 and 3 get their two columns in the other order).
  struct Exchange {
    int src1, src2;            // the lanes shuffles 1 and 2 read
    bool send_w1_first;        // shuffle 1 sends W1 (shuffle 2 then W0)
    uint32_t sel_lo, sel_hi;   // byte selectors of (s1, s2): row g, row g + 8
  };

  CUTE_HOST_DEVICE static constexpr Exchange
  exchange_for(int lane) {
    int q = lane % 4, quad = lane & ~3;
    int first = (q >> 1) | ((q & 1) << 1);
    return {quad | first, quad | (first ^ 1), (q & 1) != 0, q < 2 ? 0x5410u : 0x1054u, q < 2 ? 0x7632u : 0x3276u};
  }

  struct SharedStorage {};

  struct Arguments {
    Element* ptr = nullptr;
  };

  struct Params {
    using TMA = decltype(cute::make_tma_copy(
        cute::SM90_TMA_STORE{},
        cute::make_tensor(static_cast<Element*>(nullptr), cute::repeat_like(StrideHalf{}, int32_t(0)), StrideHalf{}),
        SmemLayout{}));
    TMA tma;
    bool is_nullptr = true;
  };

  template <class ProblemShape>
  static Params
  to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    using namespace cute;
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    Params p;
    p.is_nullptr = args.ptr == nullptr;
    if (not p.is_nullptr) {
      int64_t half = int64_t(N) / 2;
      Tensor t = make_tensor(args.ptr, make_layout(make_shape(int32_t(M), int32_t(half), int32_t(L)),
                                                   StrideHalf{half, _1{}, int64_t(M) * half}));
      p.tma = make_tma_copy(SM90_TMA_STORE{}, t, SmemLayout{});
    }
    return p;
  }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const& problem_shape, Arguments const&) {
    auto shape_mnkl = cute::append<4>(problem_shape, 1);
    int N = int(cute::get<1>(shape_mnkl));
    return N % 2 == 0 && (N / 2 * int(sizeof(Element))) % 16 == 0;
  }

  CUTLASS_HOST_DEVICE Sm90HalfWidthPairStore() {}
  CUTLASS_HOST_DEVICE Sm90HalfWidthPairStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class CoordTensor, class GTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, GTensor bSG_g, int row0, int col0, Params const* params_ptr)
      : tCcD(tCcD), bSG_g(bSG_g), row0(row0), col0(col0), params_ptr(params_ptr) {}

    CoordTensor tCcD;     // element coordinates relative to the thread's first element (static)
    GTensor bSG_g;        // (TMA, TMA_M, TMA_N, EPI_M, EPI_N) of the output's [CTA_M, CTA_N / 2] tile
    int row0, col0;       // the thread's first element in the CTA tile
    Params const* params_ptr;
    Element* smem = nullptr;   // this subtile's stage (set by reduce, read by tma_store)

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&& smem_buffer, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      using SmemElement = typename cute::remove_cvref_t<STensor>::value_type;
      static_assert(sizeof(SmemElement) * decltype(cosize(smem_buffer.layout()))::value
                    >= sizeof(Element) * decltype(cosize(SmemLayout{}))::value,
                    "the collective's D stage is smaller than the half-width subtile");
      using Fragment = typename cute::remove_cvref_t<VTensor>::value_type;
      constexpr int FragmentSize = Fragment::kElements;
      constexpr int NumElements = decltype(size(visit_results))::value * FragmentSize;
      static_assert(NumElements % 8 == 0, "two 8-column blocks of two rows at a time");

      smem = reinterpret_cast<Element*>(raw_pointer_cast(smem_buffer.data()));
      if (params_ptr->is_nullptr) {
        return;
      }
      // the fragment order the exchange relies on, checked on the partition's static coordinates
      Tensor tC = tCcD(_,_,_,_0{},_0{});
      for_each(make_int_sequence<NumElements / 8>{}, [&](auto u) {
        constexpr int e = decltype(u)::value * 8;
        CUTE_STATIC_ASSERT_V(get<0>(tC(Int<e + 1>{})) == get<0>(tC(Int<e>{})));
        CUTE_STATIC_ASSERT_V(get<1>(tC(Int<e + 1>{})) == get<1>(tC(Int<e>{})) + _1{});
        CUTE_STATIC_ASSERT_V(get<0>(tC(Int<e + 2>{})) == get<0>(tC(Int<e>{})) + _8{});
        CUTE_STATIC_ASSERT_V(get<1>(tC(Int<e + 2>{})) == get<1>(tC(Int<e>{})));
        CUTE_STATIC_ASSERT_V(get<0>(tC(Int<e + 4>{})) == get<0>(tC(Int<e>{})));
        CUTE_STATIC_ASSERT_V(get<1>(tC(Int<e + 4>{})) == get<1>(tC(Int<e>{})) + _8{});
        CUTE_STATIC_ASSERT_V(get<0>(tC(Int<e + 6>{})) == get<0>(tC(Int<e>{})) + _8{});
        CUTE_STATIC_ASSERT_V(get<1>(tC(Int<e + 6>{})) == get<1>(tC(Int<e>{})) + _8{});
        CUTE_STATIC_ASSERT_V(get<1>(tC(Int<e>{})) % _16{} == _0{});
      });

      int lane = int(threadIdx.x) % 32;
      int q = lane % 4, g = lane / 4;
      Exchange const x = exchange_for(lane);
      int r_sub = row0 - epi_m * EpiM - g;      // + a block's row offset: the first row of its 8x8 tile
      int c_sub = col0 - epi_n * EpiN - 2 * q;  // + a block's column offset: its first accumulator column
      Tensor tC_mn = tCcD(_,_,_,epi_m,epi_n);

      cutlass::NumericArrayConverter<Element, float, 2> convert;
      uint32_t regs[4];
      int rows[4], cols[2];       // the four tiles' first rows; each block's first output column
      CUTLASS_PRAGMA_UNROLL
      for (int u = 0; u < NumElements / 8; ++u) {
        auto value = [&](int e) { return float(visit_results(e / FragmentSize)[e % FragmentSize]); };
        int e = 8 * u;
        cutlass::Array<float, 2> w0{}, w1{};
        w0[0] = value(e);     w0[1] = value(e + 2);    // block 2b: rows g, g + 8
        w1[0] = value(e + 4); w1[1] = value(e + 6);    // block 2b + 1
        auto p0 = convert(w0);
        auto p1 = convert(w1);
        uint32_t W0 = reinterpret_cast<uint32_t const&>(p0);
        uint32_t W1 = reinterpret_cast<uint32_t const&>(p1);
        uint32_t s1 = __shfl_sync(0xffffffffu, x.send_w1_first ? W1 : W0, x.src1);
        uint32_t s2 = __shfl_sync(0xffffffffu, x.send_w1_first ? W0 : W1, x.src2);
        int slot = (u % 2) * 2;
        regs[slot] = __byte_perm(s1, s2, x.sel_lo);       // row g:     outputs 8b + 2q, 8b + 2q + 1
        regs[slot + 1] = __byte_perm(s1, s2, x.sel_hi);   // row g + 8
        auto c = tC_mn(e);
        rows[slot] = r_sub + int(get<0>(c));
        rows[slot + 1] = rows[slot] + 8;
        cols[u % 2] = (c_sub + int(get<1>(c))) / 2;
        if (u % 2 == 0 && u == NumElements / 8 - 1) {
          // an odd number of blocks: the last two tiles alone (lanes 0-15 give the addresses)
          int row = (lane / 8 % 2 == 0 ? rows[0] : rows[1]) + lane % 8;
          uint32_t addr = cast_smem_ptr_to_uint(element_at(smem, row, cols[0]));
          asm volatile("stmatrix.sync.aligned.x2.m8n8.shared.b16 [%0], { %1, %2 };\n"
                       :: "r"(addr), "r"(regs[0]), "r"(regs[1]));
        }
        if (u % 2 == 1) {
          // lane l gives the address of row l % 8 of tile l / 8
          int t = lane / 8;
          int row = (t == 0 ? rows[0] : t == 1 ? rows[1] : t == 2 ? rows[2] : rows[3]) + lane % 8;
          int col = t < 2 ? cols[0] : cols[1];
          uint32_t addr = cast_smem_ptr_to_uint(element_at(smem, row, col));
          asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], { %1, %2, %3, %4 };\n"
                       :: "r"(addr), "r"(regs[0]), "r"(regs[1]), "r"(regs[2]), "r"(regs[3]));
        }
      }
    }

    CUTLASS_DEVICE void
    tma_store(int epi_m, int epi_n, int, bool issue_tma_store) {
      using namespace cute;
      if (params_ptr->is_nullptr or not issue_tma_store) {
        return;
      }
      Tensor sHalf = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(smem), SmemLayout{}));
      auto thr = params_ptr->tma.get_slice(_0{});
      copy(params_ptr->tma, thr.partition_S(sHalf), bSG_g(_,_,_,epi_m,epi_n));
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    constexpr int TileM = decltype(size<0>(args.tile_shape_mnk))::value;
    constexpr int TileN = decltype(size<1>(args.tile_shape_mnk))::value;
    static_assert(TileN % EpiN == 0 && TileM % EpiM == 0, "subtiles tile the CTA tile");
    Tensor mHalf = params_ptr->tma.get_tma_tensor(make_shape(int32_t(M), int32_t(N) / 2, int32_t(L)));
    Tensor gHalf = local_tile(mHalf, make_shape(Int<TileM>{}, Int<TileN / 2>{}), make_coord(m, n, l));
    Tensor gHalf_epi = flat_divide(gHalf, HalfShape{});                  // (EPI_M, EPI_N/2, EPI_M#, EPI_N#)
    Tensor bSG_g = params_ptr->tma.get_slice(_0{}).partition_D(gHalf_epi);
    int row0 = int(M) - int(get<0>(args.residue_tCcD)) - int(m) * TileM;
    int col0 = int(N) - int(get<1>(args.residue_tCcD)) - int(n) * TileN;
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(bSG_g)>(args.tCcD, bSG_g, row0, col0, params_ptr);
  }
};

} // namespace epic_nodes
