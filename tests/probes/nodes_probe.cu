// GPU probe for the custom sm90 EVT nodes in templates/nodes/epic_nodes/.
//
// Each node runs inside a real CUTLASS 3.x sm90 GEMM (bf16 x bf16 -> fp32), instantiated the way epic's
// generated code does it: an Sm90TopologicalVisitor DAG handed to the epilogue CollectiveBuilder,
// cooperative 128x256x64 cluster 2x1 or pingpong 64x64x64 cluster 1x1. Every output is compared with a
// host reference on ragged sizes and on a tile-multiple size; every kernel runs twice with different
// poison bytes in its outputs (0xFF, then 0x5A) and the two results must be bit-identical (catches
// unwritten elements and non-determinism); 256 guard bytes after each output buffer must keep the poison.
// Then each fused GEMM is timed against the same mainloop with a plain D = acc epilogue.
//
// Inputs are small integers (A, B in {-1, 0, 1}), so the fp32 accumulator is exact and the host can
// reproduce bit-exact quantized outputs; the LSE sums are compared with a relative tolerance.
//
// Output: one "PASS name" / "FAIL name: detail" line per check, "TIME ..." lines, exit status 1 on any
// failure. Run it under `timeout` (see README.md).
//
// Kernels (7 GEMM instantiations):
//   base_coop  cooperative 128x256x64 c2x1, D bf16 = acc (LinearCombination)     timing baseline
//   ce_coop    cooperative, D bf16 = acc; x = acc/16; RowLsePartial(x); target = select(col == label[row], x, 0)
//              through a stock Sm90ColReduction (uses Sm90Coordinate<1> and Sm90ColBroadcast)
//   bs128_coop cooperative, epilogue tile 128x128, BlockScale<128, float, Pow2, MN-major, D e4m3>(0.3 acc)
//   int4_coop  cooperative, D void: BlockScale<32, ue8m0, Pow2, row-major, packed int4>(0.3 acc)
//              + PackedInt4Store(clamp(rint(acc/4), -8, 7))
//   base_pp    pingpong 64x64x64 c1x1, D bf16 = acc                                  timing baseline
//   misc_pp    pingpong, D f32 = 1024 * row + col (Sm90Coordinate<0>, <1>); RowLsePartial(acc/16);
//              PackedInt4Store(clamp(rint(acc/4), -8, 7))
//   bs64_pp    pingpong (epilogue tile auto = 64x64 for 8-bit D), BlockScale<64, bf16, !Pow2, MN-major, D int8>
#include <cstdio>
#include <cstdlib>
#include <cstdarg>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>
#include <map>
#include <tuple>
#include <random>
#include <algorithm>
#include <functional>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "epic_nodes/coordinate.hpp"
#include "epic_nodes/row_lse_partial.hpp"
#include "epic_nodes/block_scale.hpp"
#include "epic_nodes/packed_int4_store.hpp"

using namespace cute;
using namespace cutlass::epilogue::fusion;
constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;
using bf16 = cutlass::bfloat16_t;
using e4m3 = cutlass::float_e4m3_t;
using ue8m0 = cutlass::float_ue8m0_t;

// ------------------------------------------------------------------------------------------------
// Element-wise functors (the shape epic generates: whole fragment in, whole fragment out)

template <class T> struct FnIdentity {
  CUTLASS_HOST_DEVICE T operator()(T const& a) const { return a; }
};
template <class T> struct FnDiv16 {          // x = acc / 16 (exact)
  CUTLASS_HOST_DEVICE T operator()(T const& a) const {
    T o;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < T::kElements; ++k) o[k] = a[k] * 0.0625f;
    return o;
  }
};
template <class T> struct FnMul03 {          // x = 0.3 * acc (one fp32 multiply, reproducible on the host)
  CUTLASS_HOST_DEVICE T operator()(T const& a) const {
    T o;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < T::kElements; ++k) o[k] = a[k] * 0.3f;
    return o;
  }
};
template <class T> struct FnSelect {         // select(col == label[row], x, 0)
  CUTLASS_HOST_DEVICE T operator()(T const& x, T const& col, T const& label) const {
    T o;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < T::kElements; ++k) o[k] = (col[k] == label[k]) ? x[k] : 0.f;
    return o;
  }
};
template <class T> struct FnInt4 {           // clamp(rint(acc / 4), -8, 7)
  CUTLASS_HOST_DEVICE T operator()(T const& a) const {
    T o;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < T::kElements; ++k) o[k] = fminf(fmaxf(rintf(a[k] * 0.25f), -8.f), 7.f);
    return o;
  }
};
template <class T> struct FnRowCol {         // 1024 * row + col (exact below 2^24)
  CUTLASS_HOST_DEVICE T operator()(T const& row, T const& col) const {
    T o;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < T::kElements; ++k) o[k] = row[k] * 1024.f + col[k];
    return o;
  }
};

// ------------------------------------------------------------------------------------------------
// GEMM configurations

using TileCoop = Shape<_128, _256, _64>;
using ClusterCoop = Shape<_2, _1, _1>;
using TilePP = Shape<_64, _64, _64>;
using ClusterPP = Shape<_1, _1, _1>;
using EpiAuto = cutlass::epilogue::collective::EpilogueTileAuto;

template <class TileShape_, class ClusterShape_, bool Coop, class EpiTile_, class ElementD_, class Fusion_,
          class ElementSmemD = ElementD_>
struct GemmCfg {
  using TileShape = TileShape_;
  using ElementD = ElementD_;
  using KernelSchedule = std::conditional_t<Coop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = std::conditional_t<Coop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                              cutlass::epilogue::TmaWarpSpecialized>;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementSmemD>::value;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape_, EpiTile_,
      float, float, void, cutlass::layout::RowMajor, AlignD, ElementD, cutlass::layout::RowMajor, AlignD,
      EpilogueSchedule, Fusion_>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      bf16, cutlass::layout::RowMajor, 8, bf16, cutlass::layout::ColumnMajor, 8, float, TileShape, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

// base_coop / base_pp: the plain epilogue
using PlainFusion = LinearCombination<bf16, float, void, float>;
using BaseCoop = GemmCfg<TileCoop, ClusterCoop, true, EpiAuto, bf16, PlainFusion>;
using BasePP = GemmCfg<TilePP, ClusterPP, false, EpiAuto, bf16, PlainFusion>;

// ce_coop
using CeDAG = Sm90TopologicalVisitor<float,
    cute::tuple<cute::seq<>, cute::seq<>, cute::seq<>, cute::seq<0>, cute::seq<3, 1, 2>, cute::seq<4>, cute::seq<3>, cute::seq<0>>,
    Sm90AccFetch,                                                                  // 0 acc
    epic_nodes::Sm90Coordinate<1>,                                                 // 1 col
    Sm90ColBroadcast<0, TileCoop, float, float, Stride<_1, _0, int64_t>>,          // 2 label[row]
    Sm90Compute<FnDiv16, float, float, RN>,                                        // 3 x = acc / 16
    Sm90Compute<FnSelect, float, float, RN>,                                       // 4 select(col == label, x, 0)
    Sm90ColReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileCoop, float, float, RN,
                     Stride<_1, _0, int64_t>, 4, true, /*FinalReduction=*/false>,  // 5 target partials
    epic_nodes::Sm90RowLsePartial<TileCoop>,                                       // 6 lse partials of x
    Sm90Compute<FnIdentity, bf16, float, RN>>;                                     // 7 D = acc
using CeCoop = GemmCfg<TileCoop, ClusterCoop, true, EpiAuto, bf16, CeDAG>;

// bs128_coop
using Bs128DAG = Sm90TopologicalVisitor<float,
    cute::tuple<cute::seq<>, cute::seq<0>, cute::seq<1>>,
    Sm90AccFetch,
    Sm90Compute<FnMul03, float, float, RN>,
    epic_nodes::Sm90BlockScale<128, float, true, 1, 0>>;
using Bs128Coop = GemmCfg<TileCoop, ClusterCoop, true, Shape<_128, _128>, e4m3, Bs128DAG>;

// int4_coop (D void: the DAG declares ElementAux so the collective can size its unused D buffer)
using Int4DAGBase = Sm90TopologicalVisitor<float,
    cute::tuple<cute::seq<>, cute::seq<0>, cute::seq<1>, cute::seq<0>, cute::seq<3>>,
    Sm90AccFetch,
    Sm90Compute<FnInt4, float, float, RN>,
    epic_nodes::Sm90PackedInt4Store,
    Sm90Compute<FnMul03, float, float, RN>,
    epic_nodes::Sm90BlockScale<32, ue8m0, true, 0, 1>>;
struct Int4DAG : Int4DAGBase { using Int4DAGBase::Int4DAGBase; using ElementAux = int8_t; };
using Int4Coop = GemmCfg<TileCoop, ClusterCoop, true, EpiAuto, void, Int4DAG, int8_t>;

// misc_pp
using MiscDAG = Sm90TopologicalVisitor<float,
    cute::tuple<cute::seq<>, cute::seq<>, cute::seq<>, cute::seq<0>, cute::seq<3>, cute::seq<0>, cute::seq<5>, cute::seq<1, 2>>,
    Sm90AccFetch,                                   // 0
    epic_nodes::Sm90Coordinate<0>,                  // 1 row
    epic_nodes::Sm90Coordinate<1>,                  // 2 col
    Sm90Compute<FnDiv16, float, float, RN>,         // 3 x
    epic_nodes::Sm90RowLsePartial<TilePP>,          // 4
    Sm90Compute<FnInt4, float, float, RN>,          // 5
    epic_nodes::Sm90PackedInt4Store,                // 6
    Sm90Compute<FnRowCol, float, float, RN>>;       // 7 D
using MiscPP = GemmCfg<TilePP, ClusterPP, false, EpiAuto, float, MiscDAG>;

// bs64_pp
using Bs64DAG = Sm90TopologicalVisitor<float,
    cute::tuple<cute::seq<>, cute::seq<0>, cute::seq<1>>,
    Sm90AccFetch,
    Sm90Compute<FnMul03, float, float, RN>,
    epic_nodes::Sm90BlockScale<64, bf16, false, 1, 0>>;
using Bs64PP = GemmCfg<TilePP, ClusterPP, false, EpiAuto, int8_t, Bs64DAG>;

// ------------------------------------------------------------------------------------------------
// Harness

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("FAIL cuda: %s at %s:%d (%s); the context is unusable, stopping\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
  fflush(stdout); exit(2); } } while (0)

static int g_failures = 0;
static int g_sms = 0;
static std::string g_only;  // --only SUBSTRING: run only the kernels whose name contains it
static bool selected(const char* kernel) { return g_only.empty() || std::string(kernel).find(g_only) != std::string::npos; }

struct Report {
  std::string name;
  long checked = 0, bad = 0;
  std::string detail, note;
  int shown = 0;
  explicit Report(std::string n) : name(std::move(n)) {}
  void ok() { ++checked; }
  void fail(const char* fmt, ...) {
    ++checked; ++bad;
    if (shown < 5) {
      char buf[400];
      va_list ap; va_start(ap, fmt); vsnprintf(buf, sizeof buf, fmt, ap); va_end(ap);
      detail += (shown ? "; " : "") + std::string(buf);
      ++shown;
    }
  }
  void print() {
    if (bad) { printf("FAIL %s: %ld of %ld wrong; first: %s%s\n", name.c_str(), bad, checked, detail.c_str(), note.c_str()); ++g_failures; }
    else     { printf("PASS %s (%ld checked%s)\n", name.c_str(), checked, note.c_str()); }
    fflush(stdout);
  }
};

// A device output buffer with a guard zone; `h[run]` holds what came back after run 0 / run 1.
constexpr size_t kGuard = 256;
constexpr uint8_t kPoison[2] = {0xFF, 0x5A};
struct OutBuf {
  std::string name;
  size_t bytes = 0;
  uint8_t* d = nullptr;
  std::vector<uint8_t> h[2];
  OutBuf(std::string n, size_t b) : name(std::move(n)), bytes(b) { CK(cudaMalloc(&d, bytes + kGuard)); }
  ~OutBuf() { cudaFree(d); }
  void poison(int run) { CK(cudaMemset(d, kPoison[run], bytes + kGuard)); }
  void fetch(int run) { h[run].resize(bytes + kGuard); CK(cudaMemcpy(h[run].data(), d, bytes + kGuard, cudaMemcpyDeviceToHost)); }
  template <class T> T at(size_t i, int run = 0) const { T v; memcpy(&v, h[run].data() + i * sizeof(T), sizeof(T)); return v; }
  // bytes [lo, hi) and the guard must still hold the poison in both runs; everything else equal across runs
  void check_runs(std::string const& prefix, std::vector<std::pair<size_t, size_t>> untouched = {}) {
    Report r(prefix + " " + name + " unwritten/guard/rerun");
    untouched.push_back({bytes, bytes + kGuard});
    std::vector<uint8_t> must_keep(bytes + kGuard, 0);
    for (auto [lo, hi] : untouched) for (size_t i = lo; i < hi && i < bytes + kGuard; ++i) must_keep[i] = 1;
    for (size_t i = 0; i < bytes + kGuard; ++i) {
      if (must_keep[i]) {
        if (h[0][i] != kPoison[0] || h[1][i] != kPoison[1])
          r.fail("byte %zu%s written (run0 0x%02x, run1 0x%02x) but must not be", i, i >= bytes ? " (guard)" : "", h[0][i], h[1][i]);
        else r.ok();
      } else if (h[0][i] != h[1][i]) {
        r.fail("byte %zu differs between runs: 0x%02x vs 0x%02x (unwritten or nondeterministic)", i, h[0][i], h[1][i]);
      } else r.ok();
    }
    r.print();
  }
};

struct Problem {
  int M, N, K;
  std::vector<bf16> a, b;        // A [M, K] row-major, B [N, K] (K-major)
  std::vector<int32_t> acc;      // exact A @ B^T
  std::vector<float> label;      // per row: a column index, or -1
  bf16 *dA = nullptr, *dB = nullptr;
  float* dLabel = nullptr;
  Problem(int M_, int N_, int K_, unsigned seed) : M(M_), N(N_), K(K_) {
    std::mt19937 rng(seed);
    std::vector<int8_t> ia(size_t(M) * K), ib(size_t(N) * K);
    for (auto& v : ia) v = int8_t(int(rng() % 3) - 1);
    for (auto& v : ib) v = int8_t(int(rng() % 3) - 1);
    a.resize(ia.size()); b.resize(ib.size());
    for (size_t i = 0; i < ia.size(); ++i) a[i] = bf16(float(ia[i]));
    for (size_t i = 0; i < ib.size(); ++i) b[i] = bf16(float(ib[i]));
    acc.assign(size_t(M) * N, 0);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        int32_t s = 0;
        const int8_t* pa = &ia[size_t(m) * K];
        const int8_t* pb = &ib[size_t(n) * K];
        for (int k = 0; k < K; ++k) s += pa[k] * pb[k];
        acc[size_t(m) * N + n] = s;
      }
    label.resize(M);
    for (int m = 0; m < M; ++m) label[m] = (rng() % 10 == 0) ? -1.f : float(rng() % N);
    CK(cudaMalloc(&dA, sizeof(bf16) * a.size()));
    CK(cudaMalloc(&dB, sizeof(bf16) * b.size()));
    CK(cudaMalloc(&dLabel, sizeof(float) * M));
    CK(cudaMemcpy(dA, a.data(), sizeof(bf16) * a.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, b.data(), sizeof(bf16) * b.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dLabel, label.data(), sizeof(float) * M, cudaMemcpyHostToDevice));
  }
  ~Problem() { cudaFree(dA); cudaFree(dB); cudaFree(dLabel); }
  float x(int m, int n) const { return float(acc[size_t(m) * N + n]); }
  std::string tag() const { return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K); }
};

template <class Cfg>
using ThreadArgs = typename Cfg::CollectiveEpilogue::FusionCallbacks::Arguments;

template <class Cfg>
ThreadArgs<Cfg> plain_args() {  // D = 1 * acc + 0 (no C)
  ThreadArgs<Cfg> th;
  th.alpha = 1.f;
  th.beta = 0.f;
  return th;
}

template <class Cfg>
typename Cfg::Gemm::Arguments
make_gemm_args(int M, int N, int K, bf16 const* A, bf16 const* B, void* D, ThreadArgs<Cfg> const& thread) {
  using Kernel = typename Cfg::Gemm::GemmKernel;
  auto sA = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {M, K, 1});
  auto sB = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {N, K, 1});
  auto sC = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {M, N, 1});
  auto sD = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {M, N, 1});
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = g_sms;
  using ElementD = typename Cfg::ElementD;
  typename Cfg::Gemm::Arguments args{
    cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, {A, sA, B, sB},
    {thread, nullptr, sC, static_cast<ElementD*>(D), sD}, hw};
  return args;
}

// Launch once (initialize + run); false (after a FAIL line) if CUTLASS refuses.
template <class Cfg>
bool launch(std::string const& what, typename Cfg::Gemm::Arguments const& args, typename Cfg::Gemm& gemm, void** ws) {
  using Gemm = typename Cfg::Gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    printf("FAIL %s: can_implement: %s\n", what.c_str(), cutlassGetStatusString(st)); ++g_failures; fflush(stdout);
    return false;
  }
  size_t wsb = Gemm::get_workspace_size(args);
  if (*ws) { CK(cudaFree(*ws)); *ws = nullptr; }
  if (wsb) CK(cudaMalloc(ws, wsb));
  st = gemm.initialize(args, *ws);
  if (st == cutlass::Status::kSuccess) st = gemm.run();
  if (st != cutlass::Status::kSuccess) {
    printf("FAIL %s: initialize/run: %s\n", what.c_str(), cutlassGetStatusString(st)); ++g_failures; fflush(stdout);
    return false;
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  return true;
}

// Runs the kernel twice (poison 0xFF, then 0x5A in every output) and fetches both results.
template <class Cfg>
bool run_twice(std::string const& what, typename Cfg::Gemm::Arguments const& args, std::vector<OutBuf*> outs) {
  typename Cfg::Gemm gemm;
  void* ws = nullptr;
  bool ok = true;
  for (int run = 0; run < 2 && ok; ++run) {
    for (auto* o : outs) o->poison(run);
    CK(cudaDeviceSynchronize());
    printf("RUN  %s (run %d)\n", what.c_str(), run); fflush(stdout);
    ok = launch<Cfg>(what, args, gemm, &ws);
    if (ok) for (auto* o : outs) o->fetch(run);
  }
  if (ws) cudaFree(ws);
  return ok;
}

// ---- host references for conversions

static uint8_t e4m3_encode(float v) {  // round to nearest, ties to even, |v| <= 448 (values are clamped)
  static std::vector<float> table;
  if (table.empty()) for (int c = 0; c < 0x7f; ++c) table.push_back(float(e4m3::bitcast(uint8_t(c))));
  if (std::isnan(v)) return 0x7f;
  uint8_t sign = std::signbit(v) ? 0x80 : 0;
  float a = std::fabs(v);
  int best = 0; double bd = 1e30;
  for (int c = 0; c < int(table.size()); ++c) {
    double d = std::fabs(double(table[c]) - a);
    if (d < bd || (d == bd && (c % 2 == 0))) { bd = d; best = c; }
  }
  return uint8_t(best) | sign;
}

static float host_pow2_ceil(float s) { return epic_nodes::detail::pow2_ceil(s); }

// The block-scale reference: scales (as stored, converted back to float) and quantized values.
template <class ElementScale, bool Pow2>
static void block_scale_ref(Problem const& p, int Block, float qmax, float floor_, bool int4,
                            std::vector<float>& scale_used, std::vector<ElementScale>& scale_stored,
                            std::function<float(int, int)> const& xval, std::vector<float>& q) {
  int G = (p.N + Block - 1) / Block;
  scale_used.assign(size_t(p.M) * G, 0.f);
  scale_stored.assign(size_t(p.M) * G, ElementScale(0.f));
  q.assign(size_t(p.M) * p.N, 0.f);
  for (int m = 0; m < p.M; ++m)
    for (int g = 0; g < G; ++g) {
      float amax = 0.f;
      for (int n = g * Block; n < std::min(p.N, (g + 1) * Block); ++n) amax = std::max(amax, std::fabs(xval(m, n)));
      float s = std::max(amax, floor_) / qmax;
      if (Pow2) s = host_pow2_ceil(s);
      ElementScale st = ElementScale(s);
      float su = float(st);
      scale_stored[size_t(m) * G + g] = st;
      scale_used[size_t(m) * G + g] = su;
      for (int n = g * Block; n < std::min(p.N, (g + 1) * Block); ++n) {
        double qd = double(xval(m, n)) / double(su);   // float64 division, then rounded
        float v = float(qd);
        float lo = int4 ? -8.f : -qmax, hi = int4 ? 7.f : qmax;
        v = v < lo ? lo : (v > hi ? hi : v);
        q[size_t(m) * p.N + n] = v;
      }
    }
}

// LSE partial check shared by ce_coop and misc_pp.
static void check_lse(std::string const& prefix, Problem const& p, OutBuf const& buf, int TileM, int TileN,
                      std::function<float(int, int)> const& xval) {
  Report r(prefix + " row_lse_partial");
  int T = (p.N + TileN - 1) / TileN, Mpad = (p.M + TileM - 1) / TileM * TileM;
  double worst = 0; int wm = -1, wt = -1;
  for (int t = 0; t < T; ++t)
    for (int m = 0; m < Mpad; ++m) {
      size_t i = size_t(t) * Mpad + m;
      float gm = buf.at<float>(2 * i), gs = buf.at<float>(2 * i + 1);
      if (m >= p.M) {
        if (gm == -INFINITY && gs == 0.f) r.ok();
        else r.fail("padding row m=%d t=%d: got (%g, %g) want (-inf, 0)", m, t, gm, gs);
        continue;
      }
      float mx = -INFINITY;
      for (int n = t * TileN; n < std::min(p.N, (t + 1) * TileN); ++n) mx = std::max(mx, xval(m, n));
      double se = 0;
      for (int n = t * TileN; n < std::min(p.N, (t + 1) * TileN); ++n) se += std::exp(double(xval(m, n)) - double(mx));
      double rel = std::fabs(double(gs) - se) / se;
      if (rel > worst) { worst = rel; wm = m; wt = t; }
      if (gm != mx || !(rel <= 1e-6))
        r.fail("(m=%d, t=%d): got (max %.9g, sum %.9g) want (%.9g, %.9g), sum rel err %.3g", m, t, gm, gs, mx, se, rel);
      else r.ok();
    }
  char b[160];
  snprintf(b, sizeof b, "; max rel err of sum %.3g at (m=%d, t=%d), tolerance 1e-6", worst, wm, wt);
  r.note = b;
  r.print();
}

static void check_int4(std::string const& name, Problem const& p, OutBuf const& buf, std::function<float(int, int)> const& q) {
  Report r(name);
  for (int m = 0; m < p.M; ++m)
    for (int n = 0; n < p.N; n += 2) {
      uint8_t want = uint8_t((int(q(m, n)) & 0xf) | ((int(q(m, n + 1)) & 0xf) << 4));
      uint8_t got = buf.h[0][size_t(m) * (p.N / 2) + n / 2];
      if (got == want) r.ok();
      else r.fail("(m=%d, n=%d..%d): got 0x%02x want 0x%02x (q %g, %g)", m, n, n + 1, got, want, q(m, n), q(m, n + 1));
    }
  r.print();
}

// ------------------------------------------------------------------------------------------------
// The kernels' checks

static void probe_base_coop(Problem const& p, std::string const& tag) {
  if (!selected("base_coop")) return;
  OutBuf D("D", size_t(p.M) * p.N * 2);
  auto args = make_gemm_args<BaseCoop>(p.M, p.N, p.K, p.dA, p.dB, D.d, plain_args<BaseCoop>());
  std::string w = "base_coop " + tag;
  if (!run_twice<BaseCoop>(w, args, {&D})) return;
  Report r(w + " D=acc");
  for (size_t i = 0; i < size_t(p.M) * p.N; ++i) {
    float got = float(D.at<bf16>(i)), want = float(bf16(float(p.acc[i])));
    if (got == want) r.ok(); else r.fail("(m=%zu, n=%zu): got %g want %g", i / p.N, i % p.N, got, want);
  }
  r.print();
  D.check_runs(w);
}

static void probe_ce_coop(Problem const& p, std::string const& tag) {
  if (!selected("ce_coop")) return;
  constexpr int TM = 128, TN = 256;
  int T = (p.N + TN - 1) / TN, Mpad = (p.M + TM - 1) / TM * TM;
  OutBuf D("D", size_t(p.M) * p.N * 2), tgt("target_partials", size_t(T) * Mpad * 4), lse("lse_partials", size_t(T) * Mpad * 8);
  typename CeDAG::Arguments th{
    {}, {}, {p.dLabel, 0.f, {_1{}, _0{}, int64_t(0)}}, {}, {},
    {tgt.d, 0.f, {_1{}, _0{}, int64_t(0)}}, {reinterpret_cast<float*>(lse.d)}, {}};
  auto args = make_gemm_args<CeCoop>(p.M, p.N, p.K, p.dA, p.dB, D.d, th);
  std::string w = "ce_coop " + tag;
  if (!run_twice<CeCoop>(w, args, {&D, &tgt, &lse})) return;
  auto xv = [&](int m, int n) { return p.x(m, n) * 0.0625f; };
  {
    Report r(w + " D=acc");
    for (size_t i = 0; i < size_t(p.M) * p.N; ++i) {
      float got = float(D.at<bf16>(i)), want = float(bf16(float(p.acc[i])));
      if (got == want) r.ok(); else r.fail("(m=%zu, n=%zu): got %g want %g", i / p.N, i % p.N, got, want);
    }
    r.print();
  }
  {
    Report r(w + " target select(col==label[row]) via Sm90Coordinate<1> + ColReduction");
    for (int t = 0; t < T; ++t)
      for (int m = 0; m < Mpad; ++m) {
        float want = 0.f;
        if (m < p.M) {
          int l = int(p.label[m]);
          if (l >= t * TN && l < std::min(p.N, (t + 1) * TN)) want = xv(m, l);
        }
        float got = tgt.at<float>(size_t(t) * Mpad + m);
        if (got == want) r.ok();
        else r.fail("(m=%d, t=%d, label %d): got %g want %g", m, t, m < p.M ? int(p.label[m]) : -1, got, want);
      }
    r.print();
  }
  check_lse(w, p, lse, TM, TN, xv);
  D.check_runs(w); tgt.check_runs(w); lse.check_runs(w);
}

static void probe_bs128_coop(Problem const& p, std::string const& tag) {
  if (!selected("bs128_coop")) return;
  constexpr int Block = 128;
  int G = (p.N + Block - 1) / Block, M4 = (p.M + 3) / 4 * 4;
  OutBuf D("D(e4m3)", size_t(p.M) * p.N), S("scales(f32,MN-major)", size_t(G) * M4 * 4);
  typename Bs128DAG::Arguments th{{}, {}, {reinterpret_cast<float*>(S.d), 448.f, 1e-4f, nullptr}};
  auto args = make_gemm_args<Bs128Coop>(p.M, p.N, p.K, p.dA, p.dB, D.d, th);
  std::string w = "bs128_coop " + tag;
  if (!run_twice<Bs128Coop>(w, args, {&D, &S})) return;
  std::vector<float> su, q; std::vector<float> st;
  auto xv = [&](int m, int n) { return p.x(m, n) * 0.3f; };
  block_scale_ref<float, true>(p, Block, 448.f, 1e-4f, false, su, st, xv, q);
  {
    Report r(w + " block_scale scales");
    for (int m = 0; m < p.M; ++m)
      for (int g = 0; g < G; ++g) {
        float got = S.at<float>(size_t(g) * M4 + m), want = st[size_t(m) * G + g];
        if (got == want) r.ok(); else r.fail("(m=%d, g=%d): got %g want %g", m, g, got, want);
      }
    r.print();
  }
  {
    Report r(w + " block_scale D e4m3");
    for (int m = 0; m < p.M; ++m)
      for (int n = 0; n < p.N; ++n) {
        uint8_t got = D.h[0][size_t(m) * p.N + n], want = e4m3_encode(q[size_t(m) * p.N + n]);
        if (got == want) r.ok();
        else r.fail("(m=%d, n=%d): got 0x%02x (%g) want 0x%02x (%g); x %g scale %g", m, n, got,
                    float(e4m3::bitcast(got)), want, float(e4m3::bitcast(want)), xv(m, n), su[size_t(m) * G + n / Block]);
      }
    r.print();
  }
  D.check_runs(w);
  std::vector<std::pair<size_t, size_t>> pad;  // MN-major padding rows [M, round_up(M, 4)) are not written
  for (int g = 0; g < G; ++g) pad.push_back({(size_t(g) * M4 + p.M) * 4, (size_t(g) * M4 + M4) * 4});
  S.check_runs(w, pad);
}

static void probe_int4_coop(Problem const& p, std::string const& tag) {
  if (!selected("int4_coop")) return;
  constexpr int Block = 32;
  int G = (p.N + Block - 1) / Block;
  OutBuf Q4("packed_int4_store", size_t(p.M) * p.N / 2), QB("block_scale_int4", size_t(p.M) * p.N / 2),
         S("scales(ue8m0,row-major)", size_t(p.M) * G);
  typename Int4DAG::Arguments th{{}, {}, {Q4.d}, {}, {reinterpret_cast<ue8m0*>(S.d), 7.f, 1e-4f, QB.d}};
  auto args = make_gemm_args<Int4Coop>(p.M, p.N, p.K, p.dA, p.dB, nullptr, th);
  std::string w = "int4_coop " + tag;
  if (!run_twice<Int4Coop>(w, args, {&Q4, &QB, &S})) return;
  check_int4(w + " packed_int4_store", p, Q4, [&](int m, int n) {
    return std::min(std::max(std::nearbyint(p.x(m, n) * 0.25f), -8.f), 7.f); });
  std::vector<float> su, q; std::vector<ue8m0> st;
  auto xv = [&](int m, int n) { return p.x(m, n) * 0.3f; };
  block_scale_ref<ue8m0, true>(p, Block, 7.f, 1e-4f, true, su, st, xv, q);
  {
    Report r(w + " block_scale scales(ue8m0)");
    for (int m = 0; m < p.M; ++m)
      for (int g = 0; g < G; ++g) {
        uint8_t got = S.h[0][size_t(m) * G + g], want = st[size_t(m) * G + g].storage;
        if (got == want) r.ok(); else r.fail("(m=%d, g=%d): got 0x%02x want 0x%02x (%g)", m, g, got, want, su[size_t(m) * G + g]);
      }
    r.print();
  }
  check_int4(w + " block_scale int4 (D void)", p, QB, [&](int m, int n) { return std::nearbyint(q[size_t(m) * p.N + n]); });
  Q4.check_runs(w); QB.check_runs(w); S.check_runs(w);
}

static void probe_base_pp(Problem const& p, std::string const& tag) {
  if (!selected("base_pp")) return;
  OutBuf D("D", size_t(p.M) * p.N * 2);
  auto args = make_gemm_args<BasePP>(p.M, p.N, p.K, p.dA, p.dB, D.d, plain_args<BasePP>());
  std::string w = "base_pp " + tag;
  if (!run_twice<BasePP>(w, args, {&D})) return;
  Report r(w + " D=acc");
  for (size_t i = 0; i < size_t(p.M) * p.N; ++i) {
    float got = float(D.at<bf16>(i)), want = float(bf16(float(p.acc[i])));
    if (got == want) r.ok(); else r.fail("(m=%zu, n=%zu): got %g want %g", i / p.N, i % p.N, got, want);
  }
  r.print();
  D.check_runs(w);
}

static void probe_misc_pp(Problem const& p, std::string const& tag) {
  if (!selected("misc_pp")) return;
  constexpr int TM = 64, TN = 64;
  int T = (p.N + TN - 1) / TN, Mpad = (p.M + TM - 1) / TM * TM;
  OutBuf D("D(f32)", size_t(p.M) * p.N * 4), lse("lse_partials", size_t(T) * Mpad * 8), Q4("packed_int4_store", size_t(p.M) * p.N / 2);
  typename MiscDAG::Arguments th{{}, {}, {}, {}, {reinterpret_cast<float*>(lse.d)}, {}, {Q4.d}, {}};
  auto args = make_gemm_args<MiscPP>(p.M, p.N, p.K, p.dA, p.dB, D.d, th);
  std::string w = "misc_pp " + tag;
  if (!run_twice<MiscPP>(w, args, {&D, &lse, &Q4})) return;
  {
    Report r(w + " Sm90Coordinate<0>,<1>: D = 1024*row + col");
    for (int m = 0; m < p.M; ++m)
      for (int n = 0; n < p.N; ++n) {
        float got = D.at<float>(size_t(m) * p.N + n), want = float(m) * 1024.f + float(n);
        if (got == want) r.ok();
        else r.fail("(m=%d, n=%d): got %.1f (row %d, col %d) want %.1f", m, n, got, int(got) / 1024, int(got) % 1024, want);
      }
    r.print();
  }
  check_lse(w, p, lse, TM, TN, [&](int m, int n) { return p.x(m, n) * 0.0625f; });
  check_int4(w + " packed_int4_store", p, Q4, [&](int m, int n) {
    return std::min(std::max(std::nearbyint(p.x(m, n) * 0.25f), -8.f), 7.f); });
  D.check_runs(w); lse.check_runs(w); Q4.check_runs(w);
}

static void probe_bs64_pp(Problem const& p, std::string const& tag) {
  if (!selected("bs64_pp")) return;
  constexpr int Block = 64;
  int G = (p.N + Block - 1) / Block, M4 = (p.M + 3) / 4 * 4;
  OutBuf D("D(int8)", size_t(p.M) * p.N), S("scales(bf16,MN-major)", size_t(G) * M4 * 2);
  typename Bs64DAG::Arguments th{{}, {}, {reinterpret_cast<bf16*>(S.d), 127.f, 1e-4f, nullptr}};
  auto args = make_gemm_args<Bs64PP>(p.M, p.N, p.K, p.dA, p.dB, D.d, th);
  std::string w = "bs64_pp " + tag;
  if (!run_twice<Bs64PP>(w, args, {&D, &S})) return;
  std::vector<float> su, q; std::vector<bf16> st;
  auto xv = [&](int m, int n) { return p.x(m, n) * 0.3f; };
  block_scale_ref<bf16, false>(p, Block, 127.f, 1e-4f, false, su, st, xv, q);
  {
    Report r(w + " block_scale scales(bf16)");
    for (int m = 0; m < p.M; ++m)
      for (int g = 0; g < G; ++g) {
        float got = float(S.at<bf16>(size_t(g) * M4 + m)), want = float(st[size_t(m) * G + g]);
        if (got == want) r.ok(); else r.fail("(m=%d, g=%d): got %g want %g", m, g, got, want);
      }
    r.print();
  }
  {
    Report r(w + " block_scale D int8");
    for (int m = 0; m < p.M; ++m)
      for (int n = 0; n < p.N; ++n) {
        int got = int8_t(D.h[0][size_t(m) * p.N + n]);
        int want = int(std::nearbyint(q[size_t(m) * p.N + n]));
        if (got == want) r.ok();
        else r.fail("(m=%d, n=%d): got %d want %d; x %g scale %g", m, n, got, want, xv(m, n), su[size_t(m) * G + n / Block]);
      }
    r.print();
  }
  D.check_runs(w);
  std::vector<std::pair<size_t, size_t>> pad;
  for (int g = 0; g < G; ++g) pad.push_back({(size_t(g) * M4 + p.M) * 2, (size_t(g) * M4 + M4) * 2});
  S.check_runs(w, pad);
}

// ------------------------------------------------------------------------------------------------
// Timing: median of 20 cudaEvent-timed launches (after 5 warm-ups), fused vs plain D = acc

__global__ void fill_small_ints(bf16* p, size_t n, unsigned seed) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = bf16(float(int(h % 3u) - 1));
  }
}

template <class Cfg>
float time_ms(std::string const& what, typename Cfg::Gemm::Arguments const& args) {
  typename Cfg::Gemm gemm;
  void* ws = nullptr;
  if (!launch<Cfg>(what + " (timing)", args, gemm, &ws)) return -1.f;
  for (int i = 0; i < 5; ++i) gemm.run();
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int r = 0; r < 20; ++r) {
    CK(cudaEventRecord(e0));
    gemm.run();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t; CK(cudaEventElapsedTime(&t, e0, e1)); ts.push_back(t);
  }
  CK(cudaGetLastError());
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  if (ws) cudaFree(ws);
  std::sort(ts.begin(), ts.end());
  return 0.5f * (ts[9] + ts[10]);
}

static void timing(int M, int N, int K) {
  printf("---- timing at %dx%dx%d (median of 20; ratio = fused / plain D=acc on the same mainloop)\n", M, N, K);
  bf16 *A, *B;
  CK(cudaMalloc(&A, sizeof(bf16) * size_t(M) * K)); CK(cudaMalloc(&B, sizeof(bf16) * size_t(N) * K));
  fill_small_ints<<<unsigned((size_t(M) * K + 255) / 256), 256>>>(A, size_t(M) * K, 1);
  fill_small_ints<<<unsigned((size_t(N) * K + 255) / 256), 256>>>(B, size_t(N) * K, 2);
  uint8_t *D, *P1, *P2, *P3;
  CK(cudaMalloc(&D, size_t(M) * N * 4));          // big enough for any D
  CK(cudaMalloc(&P1, size_t(M) * N / 2 + 4096));  // int4 outputs
  CK(cudaMalloc(&P2, size_t(M) * N / 2 + 4096));
  size_t part = size_t((N + 63) / 64) * ((M + 127) / 128 * 128) * 8 + size_t(M + 4) * ((N + 7) / 8) * 4 + 4096;
  CK(cudaMalloc(&P3, part));                      // partials / scales
  float* labels; CK(cudaMalloc(&labels, sizeof(float) * M));
  CK(cudaMemset(labels, 0, sizeof(float) * M));
  CK(cudaDeviceSynchronize());

  float base_coop = time_ms<BaseCoop>("base_coop", make_gemm_args<BaseCoop>(M, N, K, A, B, D, plain_args<BaseCoop>()));
  float base_pp = time_ms<BasePP>("base_pp", make_gemm_args<BasePP>(M, N, K, A, B, D, plain_args<BasePP>()));
  printf("TIME base_coop  %.4f ms (%.1f TFLOP/s)\n", base_coop, 2.0 * M * N * double(K) / (base_coop * 1e-3) / 1e12);
  printf("TIME base_pp    %.4f ms (%.1f TFLOP/s)\n", base_pp, 2.0 * M * N * double(K) / (base_pp * 1e-3) / 1e12);
  auto line = [](const char* name, float t, float base, const char* what) {
    printf("TIME %-10s %.4f ms  ratio %.3f  (%s)\n", name, t, t / base, what); fflush(stdout);
  };
  if (selected("ce_coop")) {
    typename CeDAG::Arguments th{{}, {}, {labels, 0.f, {_1{}, _0{}, int64_t(0)}}, {}, {},
                                 {P3, 0.f, {_1{}, _0{}, int64_t(0)}}, {reinterpret_cast<float*>(P1)}, {}};
    line("ce_coop", time_ms<CeCoop>("ce_coop", make_gemm_args<CeCoop>(M, N, K, A, B, D, th)), base_coop,
         "D bf16 + RowLsePartial + Coordinate<1>/ColBroadcast/select/ColReduction");
  }
  if (selected("bs128_coop")) {
    typename Bs128DAG::Arguments th{{}, {}, {reinterpret_cast<float*>(P3), 448.f, 1e-4f, nullptr}};
    line("bs128_coop", time_ms<Bs128Coop>("bs128_coop", make_gemm_args<Bs128Coop>(M, N, K, A, B, D, th)), base_coop,
         "BlockScale 1x128 -> e4m3 D, f32 pow2 scales MN-major, epi 128x128");
  }
  if (selected("int4_coop")) {
    typename Int4DAG::Arguments th{{}, {}, {P1}, {}, {reinterpret_cast<ue8m0*>(P3), 7.f, 1e-4f, P2}};
    line("int4_coop", time_ms<Int4Coop>("int4_coop", make_gemm_args<Int4Coop>(M, N, K, A, B, nullptr, th)), base_coop,
         "D void; BlockScale 1x32 -> packed int4 + ue8m0 scales; PackedInt4Store");
  }
  if (selected("misc_pp")) {
    typename MiscDAG::Arguments th{{}, {}, {}, {}, {reinterpret_cast<float*>(P3)}, {}, {P1}, {}};
    line("misc_pp", time_ms<MiscPP>("misc_pp", make_gemm_args<MiscPP>(M, N, K, A, B, D, th)), base_pp,
         "D f32 from Coordinate<0>,<1>; RowLsePartial; PackedInt4Store");
  }
  if (selected("bs64_pp")) {
    typename Bs64DAG::Arguments th{{}, {}, {reinterpret_cast<bf16*>(P3), 127.f, 1e-4f, nullptr}};
    line("bs64_pp", time_ms<Bs64PP>("bs64_pp", make_gemm_args<Bs64PP>(M, N, K, A, B, D, th)), base_pp,
         "BlockScale 1x64 -> int8 D, bf16 scales (IEEE division)");
  }
  cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(P1); cudaFree(P2); cudaFree(P3); cudaFree(labels);
}

// ------------------------------------------------------------------------------------------------

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  bool do_time = true;
  int TM = 8192, TN = 4096, TK = 4096;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--no-time")) do_time = false;
    else if (!strcmp(argv[i], "--time") && i + 3 < argc) { TM = atoi(argv[++i]); TN = atoi(argv[++i]); TK = atoi(argv[++i]); }
    else if (!strcmp(argv[i], "--only") && i + 1 < argc) { g_only = argv[++i]; }
    else { printf("usage: %s [--no-time] [--time M N K] [--only KERNEL_SUBSTRING]\n", argv[0]); return 2; }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  printf("device: %s, sm_%d%d, %d SMs\n", prop.name, prop.major, prop.minor, g_sms);
  if (prop.major != 9) { printf("FAIL device: needs sm_90\n"); return 1; }
  printf("kernels (bf16 A[M,K] x B[N,K]^T, fp32 acc; A, B in {-1,0,1} so acc is exact):\n"
         "  base_coop   cooperative 128x256x64 c2x1, D bf16 = acc (LinearCombination): harness check + timing baseline\n"
         "  ce_coop     cooperative, D bf16 = acc; x = acc/16; epic_nodes::Sm90RowLsePartial(x) -> lse_partials\n"
         "              [T, Mpad, 2]; target = stock Sm90ColReduction(select(Sm90Coordinate<1> == label[row], x, 0))\n"
         "  bs128_coop  cooperative, epilogue tile 128x128: Sm90BlockScale<128, float, Pow2, ScaleLayout 1, Output 0>\n"
         "              of x = 0.3*acc -> D e4m3 (qmax 448, floor 1e-4)\n"
         "  int4_coop   cooperative, D void: Sm90BlockScale<32, ue8m0, Pow2, ScaleLayout 0, Output 1>(0.3*acc) -> packed\n"
         "              int4 (qmax 7) + Sm90PackedInt4Store(clamp(rint(acc/4), -8, 7))\n"
         "  base_pp     pingpong 64x64x64 c1x1, D bf16 = acc: harness check + timing baseline\n"
         "  misc_pp     pingpong, D f32 = 1024*Sm90Coordinate<0> + Sm90Coordinate<1>; Sm90RowLsePartial(acc/16);\n"
         "              Sm90PackedInt4Store(clamp(rint(acc/4), -8, 7))\n"
         "  bs64_pp     pingpong (epilogue tile auto 64x64 for 8-bit D): Sm90BlockScale<64, bf16, !Pow2, ScaleLayout 1,\n"
         "              Output 0>(0.3*acc) -> D int8 (qmax 127, floor 1e-4; IEEE division)\n"
         "every kernel runs twice (outputs poisoned with 0xFF, then 0x5A): 'unwritten/guard/rerun' lines compare the\n"
         "two runs byte for byte and check that 256 guard bytes after each buffer (and MN-major scale padding rows)\n"
         "kept the poison. 8-bit-D kernels use N rounded up to 16 (TMA row pitch).\n");

  // Ragged sizes (not multiples of any tile) and a tile-multiple size. Kernels with an 8-bit D need
  // N % 16 == 0 (TMA: 16-byte row pitch), so they get N rounded up to 16.
  std::vector<std::tuple<int, int, int>> sizes = {{333, 392, 200}, {77, 264, 136}, {1, 128, 64}, {512, 1024, 256}};
  for (auto [M, N0, K] : sizes) {
    {
      Problem p(M, N0, K, 1234u + M);
      std::string tag = p.tag();
      probe_base_coop(p, tag);
      probe_ce_coop(p, tag);
      probe_int4_coop(p, tag);
      probe_base_pp(p, tag);
      probe_misc_pp(p, tag);
    }
    {
      int N = (N0 + 15) / 16 * 16;
      Problem p(M, N, K, 4321u + M);
      std::string tag = p.tag();
      probe_bs128_coop(p, tag);
      probe_bs64_pp(p, tag);
    }
  }
  if (do_time) timing(TM, TN, TK);
  printf("%s: %d failing check(s)\n", g_failures ? "FAIL nodes_probe" : "PASS nodes_probe", g_failures);
  return g_failures ? 1 : 0;
}
