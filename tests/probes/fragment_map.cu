// Host-only check of the fragment layouts the epic_nodes rely on (runs on any machine, no GPU).
//
// For each GEMM configuration of nodes_probe.cu it rebuilds, with the collective's own types, the
// thread partition that the sm90 TMA epilogue hands to the visitor nodes (ConsumerStoreArgs.tCcD and
// tiled_copy), and then checks, for every consumer thread and every fragment element:
//   - the thread partitions cover the CTA tile exactly once;
//   - elements 2j, 2j+1 are columns n, n+1 (n even) of one row (Sm90PackedInt4Store, BlockScale Output 1);
//   - the row slots of Sm90RowLsePartial: same slot <=> same row, and the row map's value is that row;
//   - the (row, segment) slots of Sm90BlockScale for each Block that fits the subtile;
//   - the lanes that share a row (the XOR butterfly group) hold the same rows / segments in the same
//     slot order, and no other lane holds them;
// and prints how one thread's fragment maps to rows and columns.
//
// Build: nvcc -std=c++17 -O1 --expt-relaxed-constexpr -I$CUTLASS/include -I$CUTLASS/tools/util/include
//        -I templates/nodes tests/probes/fragment_map.cu -o /tmp/fragment_map && /tmp/fragment_map
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>
#include <tuple>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"

#include "epic_nodes/coordinate.hpp"
#include "epic_nodes/row_lse_partial.hpp"
#include "epic_nodes/packed_int4_store.hpp"
#include "epic_nodes/block_scale.hpp"

using namespace cute;

static int g_failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++g_failures; if (g_failures < 40) { printf("  FAIL: " __VA_ARGS__); printf("\n"); } } } while (0)

template <class TileShape, class ClusterShape, bool Coop, class EpiTileType, class ElementD>
struct Config {
  using KernelSchedule = std::conditional_t<Coop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = std::conditional_t<Coop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                              cutlass::epilogue::TmaWarpSpecialized>;
  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>;
  using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, EpiTileType,
      float, float, void, cutlass::layout::RowMajor, 128 / cutlass::sizeof_bits<ElementD>::value,
      ElementD, cutlass::layout::RowMajor, 128 / cutlass::sizeof_bits<ElementD>::value,
      EpilogueSchedule, Fusion>::CollectiveOp;
  using Main = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::bfloat16_t, cutlass::layout::RowMajor, 8, cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epi::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using ElementSmemD = ElementD;
};

// Per-Block check of the segment slots (only instantiated when the subtile N is a multiple of Block).
template <int Block, int TileM, int TileN, class EpiTile, class TiledCopy, class GetElem>
void check_segments(EpiTile epi_tile, TiledCopy tiled_copy, int num_threads, int epi_m_count, int epi_n_count,
                    GetElem const& elem_coord) {
  auto seg_layout = make_layout(
      make_shape(Int<TileM>{}, make_shape(Int<Block>{}, Int<TileN / Block>{})),
      make_stride(_1{}, make_stride(_0{}, Int<TileM>{})));
  auto lane_layout = epic_nodes::detail::lane_layout_mn<true>(tiled_copy);
  constexpr int RowLanes = decltype(size<1>(lane_layout))::value;
  // (thread, epi_m, epi_n) -> list of (row, seg) per slot
  std::map<std::tuple<int,int,int>, std::vector<std::pair<int,int>>> slot_of;
  for (int t = 0; t < num_threads; ++t) {
    auto tSeg = epic_nodes::detail::partition_tile_map<true>(seg_layout, epi_tile, tiled_copy, t);
    for (int em = 0; em < epi_m_count; ++em) for (int en = 0; en < epi_n_count; ++en) {
      auto tSeg_mn = tSeg(_,_,_,em,en);
      auto reg = make_tensor_like<float>(tSeg_mn.layout());
      auto fSeg = filter(tSeg_mn);
      int slots = size(fSeg);
      CHECK(slots == int(size(filter(reg))), "Block %d: slot count mismatch", Block);
      std::vector<std::pair<int,int>> slot_rs(slots, {-1, -1});
      for (int s = 0; s < slots; ++s) { int code = fSeg(s); slot_rs[s] = {code % TileM, code / TileM}; }
      // slot offset of element k in the compact register layout -> index s in the filtered order
      std::map<int,int> offset_to_s;
      { auto f = filter(reg.layout()); for (int s = 0; s < int(size(f)); ++s) offset_to_s[f(s)] = s; }
      for (int k = 0; k < int(size(tSeg_mn)); ++k) {
        auto [row, col] = elem_coord(t, em, en, k);
        int s = offset_to_s.count(reg.layout()(k)) ? offset_to_s[reg.layout()(k)] : -1;
        CHECK(s >= 0, "Block %d t%d k%d: no slot", Block, t, k);
        if (s < 0) continue;
        CHECK((slot_rs[s].first == row && slot_rs[s].second == col / Block),
              "Block %d t%d (%d,%d) k%d at (%d,%d): slot %d says (row %d, seg %d)", Block, t, em, en, k, row, col,
              s, slot_rs[s].first, slot_rs[s].second);
      }
      slot_of[std::make_tuple(t, em, en)] = slot_rs;
    }
  }
  // butterfly partners: same slot list; owners of a (row, seg) are exactly one lane group
  std::map<std::tuple<int,int,int,int>, std::set<int>> owners;  // (em, en, row, seg) -> threads
  for (auto& [key, v] : slot_of) {
    auto [t, em, en] = key;
    int lane = t % 32;
    for (int r = 1; r < RowLanes; r *= 2) {
      int partner = (t / 32) * 32 + (lane ^ int(lane_layout(_0{}, r)));
      CHECK((slot_of[std::make_tuple(partner, em, en)] == v), "Block %d: lanes %d and %d disagree on slots", Block, t, partner);
    }
    for (auto [row, seg] : v) owners[std::make_tuple(em, en, row, seg)].insert(t);
  }
  for (auto& [key, ts] : owners) {
    CHECK(int(ts.size()) == RowLanes, "Block %d: a (row, segment) is held by %d threads, want %d", Block,
          int(ts.size()), RowLanes);
  }
  printf("  Block %3d: segment slots per thread per subtile = %d: ok so far (%d failures)\n", Block,
         int(slot_of.begin()->second.size()), g_failures);
}

template <class Cfg, int... Blocks>
void check(const char* name) {
  using Epi = typename Cfg::Epi;
  using TiledMma = typename Cfg::Main::TiledMma;
  using TileShape = typename Epi::CtaTileMNK;
  using EpiTile = typename Epi::EpilogueTile;
  using SmemElementD = typename Cfg::ElementSmemD;
  constexpr int TileM = size<0>(TileShape{});
  constexpr int TileN = size<1>(TileShape{});
  constexpr int EpiM = size<0>(EpiTile{});
  constexpr int EpiN = size<1>(EpiTile{});
  printf("%s: CTA tile %dx%d, epilogue subtile %dx%d, CopyOpR2S %s\n", name, TileM, TileN, EpiM, EpiN,
         std::is_same_v<typename Epi::CopyOpR2R, void> ? "(no R2R)" : "(with R2R!)");
  static_assert(std::is_same_v<typename Epi::CopyOpR2R, void>, "this check assumes no register-to-register copy");

  // Exactly what the collective builds (sm90_epilogue_tma_warpspecialized.hpp, store())
  TiledMma tiled_mma;
  auto tiled_copy_C_atom = make_tiled_copy_C_atom(typename Epi::CopyAtomC{}, tiled_mma);
  auto tiled_copy = make_tiled_copy_S(Copy_Atom<typename Epi::CopyOpR2S, SmemElementD>{}, tiled_copy_C_atom);
  int num_threads = size(tiled_mma);
  auto cD_mn = make_identity_tensor(make_shape(Int<TileM>{}, Int<TileN>{}));  // tile-relative coordinates
  constexpr int EpiMCount = TileM / EpiM, EpiNCount = TileN / EpiN;
  int frag = size(EpiTile{}) / num_threads;
  printf("  consumer threads %d, FragmentSize %d (elements per thread per subtile), subtiles %dx%d\n",
         num_threads, frag, EpiMCount, EpiNCount);
  printf("  smem: epilogue %d B (D stages %d), mainloop %d stages of %d B, total %d B of 232448\n",
         int(sizeof(typename Epi::SharedStorage)), int(Epi::DispatchPolicy::StagesD),
         int(Cfg::Main::DispatchPolicy::Stages),
         int((TileM + TileN) * size<2>(TileShape{}) * 2),
         int(sizeof(typename Epi::SharedStorage)) + int(Cfg::Main::DispatchPolicy::Stages) * int((TileM + TileN) * size<2>(TileShape{}) * 2));

  auto elem_coord = [&](int t, int em, int en, int k) {
    auto part = tiled_copy.get_slice(t).partition_S(flat_divide(cD_mn, EpiTile{}));  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    auto c = part(_,_,_,em,en)(k);
    return std::make_pair(int(get<0>(c)), int(get<1>(c)));
  };

  // 1. coverage and pairs
  std::vector<int> hits(TileM * TileN, 0);
  for (int t = 0; t < num_threads; ++t) {
    auto part = tiled_copy.get_slice(t).partition_S(flat_divide(cD_mn, EpiTile{}));
    CHECK(int(size(part(_,_,_,0,0))) == frag, "partition size %d != FragmentSize %d", int(size(part(_,_,_,0,0))), frag);
    for (int em = 0; em < EpiMCount; ++em) for (int en = 0; en < EpiNCount; ++en) {
      auto p = part(_,_,_,em,en);
      for (int k = 0; k < int(size(p)); ++k) {
        int r = get<0>(p(k)), c = get<1>(p(k));
        hits[r * TileN + c]++;
        CHECK(r >= em * EpiM && r < (em + 1) * EpiM && c >= en * EpiN && c < (en + 1) * EpiN,
              "t%d element outside its subtile", t);
        if (k % 2 == 1) {
          int r0 = get<0>(p(k - 1)), c0 = get<1>(p(k - 1));
          CHECK(r0 == r && c0 + 1 == c && c0 % 2 == 0, "t%d k%d: pair (%d,%d),(%d,%d) is not (n, n+1) of one row",
                t, k, r0, c0, r, c);
        }
      }
    }
  }
  for (int i = 0; i < TileM * TileN; ++i) CHECK(hits[i] == 1, "tile element (%d,%d) covered %d times", i / TileN, i % TileN, hits[i]);

  // 2. lanes and warps
  auto lane_layout = epic_nodes::detail::lane_layout_mn<true>(tiled_copy);
  auto warp_layout = epic_nodes::detail::warp_layout_mn<true>(tiled_copy);
  printf("  lane layout (lane_m, lane_n) -> lane: "); print(lane_layout); printf("   warp layout: "); print(warp_layout); printf("\n");
  CHECK(size<1>(warp_layout) == 1, "several warps along N");

  // 3. row slots (Sm90RowLsePartial)
  {
    auto row_layout = make_layout(make_shape(Int<TileM>{}, Int<TileN>{}), make_stride(_1{}, _0{}));
    constexpr int RowLanes = decltype(size<1>(lane_layout))::value;
    std::map<int, std::vector<int>> rows_of;  // thread -> rows per slot
    for (int t = 0; t < num_threads; ++t) {
      auto tRow = epic_nodes::detail::partition_tile_map<true>(row_layout, EpiTile{}, tiled_copy, t);
      auto reg = make_tensor_like<float>(tRow.layout());
      auto fRow = filter(tRow);
      auto freg = filter(reg.layout());
      CHECK(size(fRow) == size(freg), "row slot count mismatch");
      std::map<int,int> offset_to_s;
      for (int s = 0; s < int(size(freg)); ++s) offset_to_s[freg(s)] = s;
      std::vector<int> rows(size(fRow));
      for (int s = 0; s < int(size(fRow)); ++s) rows[s] = fRow(s);
      for (int em = 0; em < EpiMCount; ++em) for (int en = 0; en < EpiNCount; ++en)
        for (int k = 0; k < frag; ++k) {
          auto [row, col] = elem_coord(t, em, en, k);
          int s = offset_to_s[reg.layout()(k + frag * (em + EpiMCount * en))];
          CHECK(rows[s] == row, "t%d: element (%d,%d) lands in the slot of row %d", t, row, col, rows[s]);
        }
      rows_of[t] = rows;
      if (t == 0) printf("  Sm90RowLsePartial: %d row slots per thread over the whole CTA tile\n", int(rows.size()));
    }
    std::map<int, int> row_owners;
    for (auto& [t, rows] : rows_of) {
      for (int r = 1; r < RowLanes; r *= 2) {
        int partner = (t / 32) * 32 + ((t % 32) ^ int(lane_layout(_0{}, r)));
        CHECK(rows_of[partner] == rows, "row lanes %d, %d disagree", t, partner);
      }
      for (int row : rows) row_owners[row]++;
    }
    for (int r = 0; r < TileM; ++r) CHECK(row_owners[r] == RowLanes, "row %d held by %d threads", r, row_owners[r]);
  }

  // 4. segment slots (Sm90BlockScale)
  (
    [&] {
      if constexpr (EpiN % Blocks == 0) {
        check_segments<Blocks, TileM, TileN>(EpiTile{}, tiled_copy, num_threads, EpiMCount, EpiNCount, elem_coord);
      } else {
        printf("  Block %3d: does not fit the %d-wide subtile (the node static_asserts)\n", Blocks, EpiN);
      }
    }(), ...);

  // 5. print threads 0..3 (the lanes of one quad) and thread 4 for subtile (0, 0); and one thread of warp 1
  for (int t : {0, 1, 2, 3, 4, 32, num_threads > 128 ? 128 : 127}) {
    printf("  thread %3d subtile(0,0):", t);
    for (int k = 0; k < frag && k < 16; ++k) {
      auto [r, c] = elem_coord(t, 0, 0, k);
      printf(" %d:(%d,%d)", k, r, c);
    }
    printf(frag > 16 ? " ... (%d more: columns continue in steps of 8)\n" : "\n", frag - 16);
  }
  printf("  -> %s\n\n", g_failures ? "FAILURES" : "all checks passed");
}

int main() {
  using Auto = cutlass::epilogue::collective::EpilogueTileAuto;
  using bf16 = cutlass::bfloat16_t;
  using e4m3 = cutlass::float_e4m3_t;
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Auto, bf16>, 8, 16, 32, 64, 128>("cooperative 128x256x64 c2x1, EpilogueTileAuto, bf16 D");
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Shape<_128,_128>, e4m3>, 8, 32, 64, 128>("cooperative 128x256x64 c2x1, epi 128x128, e4m3 D");
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Shape<_128,_64>, e4m3>, 64>("cooperative 128x256x64 c2x1, epi 128x64, e4m3 D");
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Shape<_128,_256>, e4m3>, 256>("cooperative 128x256x64 c2x1, epi 128x256, e4m3 D");
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Auto, int8_t>, 32>("cooperative 128x256x64 c2x1, EpilogueTileAuto, int8 D (void-D aux)");
  check<Config<Shape<_64,_64,_64>, Shape<_1,_1,_1>, false, Auto, float>, 8, 32>("pingpong 64x64x64 c1x1, EpilogueTileAuto, float D");
  check<Config<Shape<_64,_64,_64>, Shape<_1,_1,_1>, false, Auto, int8_t>, 32, 64>("pingpong 64x64x64 c1x1, EpilogueTileAuto, int8 D");
  check<Config<Shape<_64,_128,_64>, Shape<_1,_1,_1>, false, Shape<_64,_128>, e4m3>, 128>("pingpong 64x128x64 c1x1, epi 64x128, e4m3 D");
  check<Config<Shape<_64,_256,_64>, Shape<_1,_1,_1>, false, Shape<_64,_256>, e4m3>, 256>("pingpong 64x256x64 c1x1, epi 64x256, e4m3 D");
  check<Config<Shape<_128,_128,_64>, Shape<_2,_1,_1>, true, Shape<_128,_128>, e4m3>, 128>("cooperative 128x128x64 c2x1, epi 128x128, e4m3 D");
  check<Config<Shape<_128,_256,_64>, Shape<_2,_1,_1>, true, Shape<_128,_128>, bf16>, 128>("cooperative 128x256x64 c2x1, epi 128x128, bf16 D (for comparison)");
  // SwiGLU's half-width bf16 output stored as a tile of bytes (pair 2k, 2k+1: one output column)
  check<Config<Shape<_128,_192,_64>, Shape<_2,_1,_1>, false, Auto, uint8_t>, 32>("pingpong 128x192x64 c2x1, EpilogueTileAuto, uint8 D (SwiGLU's bytes)");
  printf("%s (%d failures)\n", g_failures ? "FAIL fragment_map" : "PASS fragment_map", g_failures);
  return g_failures != 0;
}
