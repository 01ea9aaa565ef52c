// Host (CPU) emulation of what epic's generated kernels rely on: CUDA's device-only math and launch
// builtins, and the CUTLASS sm90 epilogue visitor nodes epic uses, with CUTLASS's semantics.
//
// tests/hostsim/translate.py writes a translation unit that includes this header and then either
//   - a generated combine kernel's source, pasted whole (the shims below make it host C++), or
//   - an emulation of a generated gemm: the source's functors, node list, edges and node
//     initializers pasted into the node emulations below.
// What the GPU guarantees and nothing more: the epilogue visits every element of every CTA tile
// (out-of-bounds ones too), in fragments whose elements 2k, 2k+1 are adjacent columns of one row
// (which pairs share a fragment is the hardware's business: here, rows r and r + 8 as on sm90).
// Values the GPU leaves undefined (registers a predicated load skipped) are NaN here, so a kernel
// that lets them reach a stored or reduced element fails the comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>
#include <vector>

#include "cutlass/numeric_types.h"
#include "cutlass/array.h"
#include "cutlass/functional.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

// ------------------------------------------------------------------------------------------------
// CUDA device-only math as host functions (the fast intrinsics become the accurate functions: the
// comparison's tolerances cover the intrinsics' error on the GPU). CUDA's headers declare some of
// these names for device code, so the generated code's calls are redirected by macros.
namespace hostsim_math {
inline float expf_(float x) { return std::exp(x); }
inline float logf_(float x) { return std::log(x); }
inline float sinf_(float x) { return std::sin(x); }
inline float cosf_(float x) { return std::cos(x); }
inline float tanf_(float x) { return std::tan(x); }
inline float powf_(float x, float y) { return std::pow(x, y); }
inline float exp10f_(float x) { return std::pow(10.0f, x); }
inline float fdividef_(float x, float y) { return x / y; }
inline float frcp_rn_(float x) { return 1.0f / x; }
inline float fsqrt_rn_(float x) { return std::sqrt(x); }
inline float saturatef_(float x) { return x != x ? 0.0f : std::fmin(std::fmax(x, 0.0f), 1.0f); }
inline float rsqrtf_(float x) { return 1.0f / std::sqrt(x); }
inline uint32_t float_as_uint_(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float uint_as_float_(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }
inline int float_as_int_(float x) { int u; std::memcpy(&u, &x, 4); return u; }
inline float int_as_float_(int u) { float x; std::memcpy(&x, &u, 4); return x; }
inline float fdiv_rn_(float x, float y) { return x / y; }      // IEEE division, as on the device
// __float2int_rn: round half to even, saturating; NaN -> INT_MIN (as the device instruction does)
inline int float2int_rn_(float x) {
  if (x != x) return std::numeric_limits<int>::min();
  if (x >= 2147483648.0f) return std::numeric_limits<int>::max();
  if (x < -2147483648.0f) return std::numeric_limits<int>::min();
  return int(std::nearbyint(x));
}
}  // namespace hostsim_math
#define __expf hostsim_math::expf_
#define __logf hostsim_math::logf_
#define __sinf hostsim_math::sinf_
#define __cosf hostsim_math::cosf_
#define __tanf hostsim_math::tanf_
#define __powf hostsim_math::powf_
#define exp10f hostsim_math::exp10f_
#define __fdividef hostsim_math::fdividef_
#define __frcp_rn hostsim_math::frcp_rn_
#define __fsqrt_rn hostsim_math::fsqrt_rn_
#define __saturatef hostsim_math::saturatef_
#define rsqrtf hostsim_math::rsqrtf_
#define __float_as_uint hostsim_math::float_as_uint_
#define __uint_as_float hostsim_math::uint_as_float_
#define __float_as_int hostsim_math::float_as_int_
#define __int_as_float hostsim_math::int_as_float_
#define __fdiv_rn hostsim_math::fdiv_rn_
#define __float2int_rn hostsim_math::float2int_rn_
#define __shfl_sync(mask, ...) hostsim::shfl(__VA_ARGS__)
#define __shfl_xor_sync(mask, ...) hostsim::shfl_xor(__VA_ARGS__)
#define __shfl_down_sync(mask, ...) hostsim::shfl_down(__VA_ARGS__)
#define __shfl_up_sync(mask, ...) hostsim::shfl_up(__VA_ARGS__)
#define __syncwarp(...) ((void)0)
#define __ldcg(p) (*(p))

// The custom nodes' own arithmetic (templates/nodes/epic_nodes/arith.hpp), which the emulations of
// those nodes below call: the very lines the GPU runs, built for the host with the shims above.
#include "epic_nodes/arith.hpp"
namespace arith = epic_nodes::detail;

namespace hostsim {

// ------------------------------------------------------------------------------------------------
// CUDA launch builtins for a pasted combine kernel: its launch `launch_after_previous(grid, block, stream, P)`
// becomes `hostsim::launch(grid, block, smem, stream, [&] { kernel(args); })`.
//
// Warp-synchronous code (shuffles) on one host thread: the lanes of a warp run one after another,
// and a lane's k-th shuffle returns what the source lane passed to its k-th shuffle in the previous
// run of the warp. The warp runs again until every lane passes exactly the values it passed the
// run before: at that fixpoint each shuffle returns what its source lane passes in the same run,
// which is what the GPU's lockstep execution gives. A warp that never shuffles runs once. Needs
// what epic's combine kernels do: the lanes of a warp call the same shuffles in the same order, and
// no address a lane reads or writes depends on a shuffled value. Shared memory and __syncthreads
// are emulated only as a tail kernel uses them (cta_runs, below).
namespace cuda_builtins {
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
}  // namespace cuda_builtins

struct Warp {
  std::vector<uint64_t> sent[32], seen[32];   // what each lane passed to its shuffles: this run, the last
  int lane = 0;
};
inline Warp* current_warp = nullptr;
inline cudaError_t launch_status = cudaSuccess;

template <class T>
inline T shuffle_from(T v, int source) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffled values are at most 64 bits");
  Warp& w = *current_warp;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  size_t k = w.sent[w.lane].size();
  w.sent[w.lane].push_back(bits);
  uint64_t got = k < w.seen[source & 31].size() ? w.seen[source & 31][k] : 0;
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}
template <class T> inline T shfl(T v, int source, int width = 32) { return shuffle_from(v, (current_warp->lane & ~(width - 1)) + (source & (width - 1))); }
template <class T> inline T shfl_xor(T v, int mask, int width = 32) { return shfl(v, (current_warp->lane & (width - 1)) ^ mask, width); }
template <class T> inline T shfl_down(T v, unsigned delta, int width = 32) {
  int l = current_warp->lane & (width - 1);
  return shfl(v, l + int(delta) < width ? l + int(delta) : l, width);
}
template <class T> inline T shfl_up(T v, unsigned delta, int width = 32) {
  int l = current_warp->lane & (width - 1);
  return shfl(v, l >= int(delta) ? l - int(delta) : l, width);
}

// cta_runs > 1 (a tail kernel): each CTA runs that many times in a row, its warps in turn, so that a
// warp reading shared memory after __syncthreads (a no-op here, the array `static`) sees what every
// warp of the CTA wrote before it in the previous run; one barrier's exchange needs 2 runs.
template <class Body>
inline void launch(dim3 grid, dim3 block, size_t, cudaStream_t, Body&& body, int cta_runs = 1) {
  using namespace cuda_builtins;
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (int cta_run = 0; cta_run < cta_runs; ++cta_run)
        for (unsigned first = 0; first < threads; first += 32) {
          Warp warp;
          current_warp = &warp;
          for (int run = 0;; ++run) {
            for (unsigned lane = 0; lane < 32 && first + lane < threads; ++lane) {
              unsigned t = first + lane;
              blockIdx = make_uint3(bx, by, bz);
              threadIdx = make_uint3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
              warp.lane = int(lane);
              warp.sent[lane].clear();
              body();
            }
            bool fixed = true;
            for (int l = 0; l < 32; ++l) fixed = fixed && warp.sent[l] == warp.seen[l];
            if (fixed) break;
            if (run == 256) {   // shuffles that never settle: not warp-synchronous code this can run
              launch_status = cudaErrorLaunchFailure;
              break;
            }
            for (int l = 0; l < 32; ++l) warp.seen[l].swap(warp.sent[l]);
          }
          current_warp = nullptr;
        }
}

// cudaGetLastError() of a pasted kernel: the status of its host launches (and reset, as CUDA does)
inline cudaError_t last_launch_status() {
  cudaError_t status = launch_status;
  launch_status = cudaSuccess;
  return status;
}

// ------------------------------------------------------------------------------------------------
// Conversions with CUTLASS's NumericConverter semantics (round to nearest; integers saturate and
// NaN becomes 0, as cvt.rni.sat does). Everything goes through float, which holds every type the
// nodes see exactly (16- and 8-bit floats, 8- and 16-bit integers, float).
template <class To>
inline To convert(float x) {
  if constexpr (std::is_same_v<To, float>) {
    return x;
  } else if constexpr (std::is_integral_v<To>) {
    if (x != x) return To(0);
    float r = std::nearbyint(x);
    float lo = float(std::numeric_limits<To>::min()), hi = float(std::numeric_limits<To>::max());
    return r <= lo ? std::numeric_limits<To>::min() : (r >= hi ? std::numeric_limits<To>::max() : To(r));
  } else {
    return To(x);   // cutlass::bfloat16_t, half_t, float_e4m3_t, float_e5m2_t: round to nearest even
  }
}

template <class To, class From, int F>
inline cutlass::Array<To, F> convert(cutlass::Array<From, F> const& x) {
  cutlass::Array<To, F> out;
  for (int i = 0; i < F; ++i) out[i] = convert<To>(float(x[i]));
  return out;
}

// What a register holds that a predicated load skipped: NaN (a recognisable garbage pattern for
// integers), so that it shows wherever it leaks into a result.
template <class T>
inline T undefined() {
  if constexpr (std::is_integral_v<T>) {
    return T(0x5A);
  } else {
    return T(std::numeric_limits<float>::quiet_NaN());
  }
}

// ------------------------------------------------------------------------------------------------
// cute's static integers and strides, as far as node initializers name them (strides are not
// emulated: every [M, N] tensor is row-major, every vector dense, as epic's ABI says).
template <int N>
using Int = std::integral_constant<int, N>;

struct AnyStride {
  AnyStride() = default;
  template <class... T>
  AnyStride(T const&...) {}
};

template <int TM, int TN, int TK>
struct Shape {
  static constexpr int M = TM, N = TN, K = TK;
};

// ------------------------------------------------------------------------------------------------
// The problem, one CTA tile, and one fragment of the epilogue.
constexpr int kFrag = 4;   // two column pairs: (r, c), (r, c + 1), (r + 8, c), (r + 8, c + 1)

struct Problem {
  int M, N, K;
};

struct Tile {
  Problem problem;
  int tile_m, tile_n;   // CTA tile shape
  int m_index, n_index; // which tile
  int m0, n0;           // its first element
};

struct Fragment {
  int m[kFrag], n[kFrag];
  bool inside[kFrag];                    // inside the problem (what CUTLASS's residue predicates say)
  cutlass::Array<float, kFrag> acc;
};

template <class T>
using Frag = cutlass::Array<T, kFrag>;

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The f32 accumulator over the whole tile grid. A [M, K] is K-major (LayoutA RowMajor: A[m * K + k])
// or M-major (ColumnMajor: A[k * M + m]); B [K, N] is K-major (LayoutB ColumnMajor: B[n * K + k], an
// [N, K] in memory) or N-major (RowMajor: B[k * N + n]), packed as make_cute_packed_stride makes them;
// elements outside the problem are 0 (TMA fills out-of-bounds operand elements with zeros). Summed
// in double and rounded once: with the harness's inputs every partial sum is exact in f32 anyway.
template <bool AMMajor = false, bool BNMajor = false, class ElementA, class ElementB>
std::vector<float> accumulate(ElementA const* A, ElementB const* B, Problem p, int rows, int cols) {
  std::vector<float> a(size_t(p.M) * p.K), b(size_t(p.N) * p.K);     // a: [M][K], b: [N][K]
  for (int m = 0; m < p.M; ++m)
    for (int k = 0; k < p.K; ++k)
      a[size_t(m) * p.K + k] = float(A[AMMajor ? size_t(k) * p.M + m : size_t(m) * p.K + k]);
  for (int n = 0; n < p.N; ++n)
    for (int k = 0; k < p.K; ++k)
      b[size_t(n) * p.K + k] = float(B[BNMajor ? size_t(k) * p.N + n : size_t(n) * p.K + k]);
  std::vector<float> acc(size_t(rows) * cols, 0.0f);
  for (int m = 0; m < p.M; ++m)
    for (int n = 0; n < p.N; ++n) {
      double sum = 0;
      const float* ar = &a[size_t(m) * p.K];
      const float* br = &b[size_t(n) * p.K];
      for (int k = 0; k < p.K; ++k) sum += double(ar[k]) * double(br[k]);
      acc[size_t(m) * cols + n] = float(sum);
    }
  return acc;
}

// The exact sums as the accumulator type holds them (an f16 accumulator rounds; f32 and the i32 of
// i8 x i8 hold the harness's sums exactly), as the reference rounds them. The GPU's f16 accumulator
// rounds at every k-step too: tests/test_gpu.py's tolerance covers that, not this emulation.
template <class Acc>
std::vector<float> as_accumulator(std::vector<float> acc) {
  for (float& x : acc) x = float(convert<Acc>(x));
  return acc;
}

// Calls visit(tile) for every CTA tile of the problem.
template <class Visit>
void for_each_tile(Problem p, int tile_m, int tile_n, Visit&& visit) {
  for (int mi = 0; mi < ceil_div(p.M, tile_m); ++mi)
    for (int ni = 0; ni < ceil_div(p.N, tile_n); ++ni)
      visit(Tile{p, tile_m, tile_n, mi, ni, mi * tile_m, ni * tile_n});
}

// Calls visit(fragment) for every fragment of a tile (each element of the tile exactly once).
template <class Visit>
void for_each_fragment(Tile const& t, std::vector<float> const& acc, int acc_cols, Visit&& visit) {
  static_assert(kFrag == 4, "fragments are two column pairs");
  for (int r = 0; r < t.tile_m; ++r) {
    if (r % 16 >= 8) continue;           // rows r + 8 ride with row r
    for (int c = 0; c < t.tile_n; c += 2) {
      Fragment f;
      for (int i = 0; i < kFrag; ++i) {
        f.m[i] = t.m0 + r + (i / 2) * 8;
        f.n[i] = t.n0 + c + (i % 2);
        f.inside[i] = f.m[i] < t.problem.M && f.n[i] < t.problem.N;
        f.acc[i] = acc[size_t(f.m[i]) * acc_cols + f.n[i]];
      }
      visit(f);
    }
  }
}

// The collective's store of the root node's results as D: converted, masked to the problem.
template <class ElementD, class T>
void store_d(ElementD* D, Fragment const& f, Problem p, Frag<T> const& x) {
  for (int i = 0; i < kFrag; ++i)
    if (f.inside[i]) D[size_t(f.m[i]) * p.N + f.n[i]] = convert<ElementD>(float(x[i]));
}

// ------------------------------------------------------------------------------------------------
// Visitor nodes. Each mirrors its CUTLASS namesake's Arguments (member order and meaning, so a
// generated initializer means the same here) and is visited per tile, as CUTLASS's hooks are:
// begin(tile); visit(fragment, inputs...) per fragment; reduce<ElementD>(tile, fragments, results)
// with the root's results of the whole tile (a node may rewrite them before D is stored, as a
// block-scaled root does); end(tile).
struct Node {
  Problem problem;
  // runs of the whole tile loop a launch needs: 2 for nodes whose split blocks take the other half
  // from the tile after them (the first run records the halves, the second uses them)
  static constexpr int passes = 1;
  void begin(Tile const&) {}
  template <class ElementD, class Result>
  void reduce(Tile const&, std::vector<Fragment> const&, std::vector<Result>&) {}
  void end(Tile const&) {}
};

// Sm90AccFetch
struct AccFetch : Node {
  struct Arguments {};
  AccFetch(Arguments const&, Problem p) : Node{p} {}
  Frag<float> visit(Fragment const& f) const { return f.acc; }
};

// Sm90AuxLoad: an extra [M, N] tile. Through TMA (Stages > 0) out-of-bounds elements are 0; loaded
// straight to registers (Stages == 0) they are whatever the registers held.
template <class Element, bool Tma>
struct AuxLoad : Node {
  struct Arguments {
    Element const* ptr_aux = nullptr;
    Element null_default = Element(0);
    AnyStride dAux = {};
  };
  Arguments args;
  AuxLoad(Arguments const& a, Problem p) : Node{p}, args(a) {}
  Frag<Element> visit(Fragment const& f) const {
    Frag<Element> out;
    for (int i = 0; i < kFrag; ++i) {
      if (args.ptr_aux == nullptr) out[i] = args.null_default;
      else if (f.inside[i]) out[i] = args.ptr_aux[size_t(f.m[i]) * problem.N + f.n[i]];
      else out[i] = Tma ? Element(0) : undefined<Element>();
    }
    return out;
  }
};

// Sm90RowBroadcast: one value per column, converted to ElementCompute; columns past N read
// null_default (CUTLASS fills them so the shared-memory read needs no predicate).
template <class ElementInput, class ElementCompute>
struct RowBroadcast : Node {
  struct Arguments {
    ElementInput const* ptr_row = nullptr;
    ElementInput null_default = ElementInput(0);
    AnyStride dRow = {};
  };
  Arguments args;
  RowBroadcast(Arguments const& a, Problem p) : Node{p}, args(a) {}
  Frag<ElementCompute> visit(Fragment const& f) const {
    Frag<ElementCompute> out;
    for (int i = 0; i < kFrag; ++i) {
      bool load = args.ptr_row != nullptr && f.n[i] < problem.N;
      out[i] = convert<ElementCompute>(float(load ? args.ptr_row[f.n[i]] : args.null_default));
    }
    return out;
  }
};

// Sm90ColBroadcast: one value per row; rows past M are not loaded (undefined registers).
template <class ElementInput, class ElementCompute>
struct ColBroadcast : Node {
  struct Arguments {
    ElementInput const* ptr_col = nullptr;
    ElementInput null_default = ElementInput(0);
    AnyStride dCol = {};
  };
  Arguments args;
  ColBroadcast(Arguments const& a, Problem p) : Node{p}, args(a) {}
  Frag<ElementCompute> visit(Fragment const& f) const {
    Frag<ElementCompute> out;
    for (int i = 0; i < kFrag; ++i) {
      if (args.ptr_col == nullptr) out[i] = convert<ElementCompute>(float(args.null_default));
      else if (f.inside[i]) out[i] = convert<ElementCompute>(float(args.ptr_col[f.m[i]]));
      else out[i] = undefined<ElementCompute>();
    }
    return out;
  }
};

// Sm90ScalarBroadcast (BroadcastCount 1): the scalar, or what its pointer points to.
template <class Element>
struct ScalarBroadcast : Node {
  struct Arguments {
    Element scalars[1] = {};
    Element const* scalar_ptrs[1] = {};
    AnyStride dScalar[1] = {};
  };
  Arguments args;
  ScalarBroadcast(Arguments const& a, Problem p) : Node{p}, args(a) {}
  Frag<Element> visit(Fragment const&) const {
    Frag<Element> out;
    out.fill(args.scalar_ptrs[0] ? *args.scalar_ptrs[0] : args.scalars[0]);
    return out;
  }
};

// Sm90Compute: every input converted to ElementCompute, the functor called on the fragments, the
// result converted to ElementOutput (round to nearest).
template <template <class> class ComputeFn, class ElementOutput, class ElementCompute>
struct Compute : Node {
  struct Arguments {};
  Compute(Arguments const&, Problem p) : Node{p} {}
  template <class... Inputs>
  Frag<ElementOutput> visit(Fragment const&, Frag<Inputs> const&... inputs) const {
    ComputeFn<Frag<ElementCompute>> fn{};
    auto out = fn(convert<ElementCompute>(inputs)...);
    return convert<ElementOutput>(out);
  }
};

// Sm90AuxStore: converts and stores its input (masked to the problem), passes the input on.
template <class Element>
struct AuxStore : Node {
  struct Arguments {
    Element* ptr_aux = nullptr;
    AnyStride dAux = {};
  };
  Arguments args;
  AuxStore(Arguments const& a, Problem p) : Node{p}, args(a) {}
  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& x) const {
    if (args.ptr_aux != nullptr)
      for (int i = 0; i < kFrag; ++i)
        if (f.inside[i]) args.ptr_aux[size_t(f.m[i]) * problem.N + f.n[i]] = convert<Element>(float(x[i]));
    return x;
  }
};

// Sm90ColReduction / Sm90RowReduction with FinalReduction = false and VisitCheckOOB = false (as epic
// emits them, behind OutsideAs): every tile reduces every element it visits, those outside the
// problem too, along the row (ColReduction: one value per row) or the column (RowReduction: one per
// column), starting from reduction_identity, and writes one partial per row (column) of
// the tile -- padding rows (columns) past the problem hold the identity -- into ptr, laid out as
// CUTLASS's reduction buffer: ColReduction part[n_tile * round_up(M, tile M) + m], RowReduction
// part[m_tile * round_up(N, tile N) + n].
template <template <class> class ReduceFn, class ElementCompute, bool AlongRow>
struct TileReduction : Node {
  struct Arguments {
    void* ptr = nullptr;
    ElementCompute reduction_identity = ElementCompute(0);
    AnyStride stride = {};
  };
  Arguments args;
  std::vector<ElementCompute> lanes;   // one running value per row (AlongRow) or column of the tile
  int first = 0;                       // the tile's first row (AlongRow) or column
  TileReduction(Arguments const& a, Problem p) : Node{p}, args(a) {}

  void begin(Tile const& t) {
    lanes.assign(AlongRow ? t.tile_m : t.tile_n, args.reduction_identity);
    first = AlongRow ? t.m0 : t.n0;
  }

  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& x) {
    ReduceFn<ElementCompute> reduce{};
    for (int i = 0; i < kFrag; ++i) {
      int lane = (AlongRow ? f.m[i] : f.n[i]) - first;
      lanes[lane] = reduce(lanes[lane], convert<ElementCompute>(float(x[i])));
    }
    return x;
  }

  void end(Tile const& t) {
    if (args.ptr == nullptr) return;
    auto* buf = static_cast<ElementCompute*>(args.ptr);
    Problem p = problem;
    size_t pitch = AlongRow ? size_t(ceil_div(p.M, t.tile_m)) * t.tile_m : size_t(ceil_div(p.N, t.tile_n)) * t.tile_n;
    size_t base = AlongRow ? t.n_index * pitch + t.m0 : t.m_index * pitch + t.n0;
    for (size_t i = 0; i < lanes.size(); ++i) buf[base + i] = lanes[i];
  }
};

template <template <class> class ReduceFn, class ElementCompute>
using ColReduction = TileReduction<ReduceFn, ElementCompute, true>;
template <template <class> class ReduceFn, class ElementCompute>
using RowReduction = TileReduction<ReduceFn, ElementCompute, false>;

// epic_nodes::Sm90OutsideAs: its input, with the elements outside the problem replaced by `value`.
struct OutsideAs : Node {
  struct Arguments {
    float value = 0.f;
  };
  Arguments args;
  OutsideAs(Arguments const& a, Problem p) : Node{p}, args(a) {}
  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& x) const {
    Frag<T> out = x;
    for (int i = 0; i < kFrag; ++i)
      if (!f.inside[i]) out[i] = T(args.value);
    return out;
  }
};

// ------------------------------------------------------------------------------------------------
// epic's custom nodes (templates/nodes/epic_nodes/*.hpp; semantics as their headers document them).

// epic_nodes::Sm90Coordinate<Axis>: each element's row (0) or column (1) index, as float; elements
// outside the problem get their would-be index.
template <int Axis>
struct Coordinate : Node {
  struct Arguments {};
  Coordinate(Arguments const&, Problem p) : Node{p} {}
  Frag<float> visit(Fragment const& f) const {
    Frag<float> out;
    for (int i = 0; i < kFrag; ++i) out[i] = float(Axis == 0 ? f.m[i] : f.n[i]);
    return out;
  }
};

// epic_nodes::Sm90PeriodicRowBroadcast<Element>: ptr[col % period] as float, every column (past N too:
// the index wraps, so it never leaves the vector). As the node does it: where no column of the tile
// wraps (arith::periodic_tile_start), the tile's start in the vector plus each column's offset in the
// tile; else, where the period is at least the tile's width, one remainder per tile (of its middle
// column, so that columns on both sides of it wrap), every column's index from it by
// arith::periodic_index; narrower periods divide per element.
template <class Element>
struct PeriodicRowBroadcast : Node {
  struct Arguments {
    Element const* ptr = nullptr;
    int period = 1;
  };
  Arguments args;
  int n0 = 0, start = -1, ref = 0, ref_mod = 0;
  bool wraps = false;
  PeriodicRowBroadcast(Arguments const& a, Problem p) : Node{p}, args(a) {}
  void begin(Tile const& t) {
    n0 = t.n0;
    start = arith::periodic_tile_start(t.n0, t.tile_n, args.period);
    ref = t.n0 + t.tile_n / 2;
    ref_mod = ref % args.period;
    wraps = args.period >= t.tile_n;
  }
  Frag<float> visit(Fragment const& f) const {
    Frag<float> out;
    for (int i = 0; i < kFrag; ++i)
      out[i] = float(args.ptr[start >= 0 ? start + (f.n[i] - n0)
                              : wraps ? arith::periodic_index(ref_mod, f.n[i] - ref, args.period)
                                      : f.n[i] % args.period]);
    return out;
  }
};

// epic_nodes::Sm90RowLsePartial<TileShape>: per row and column tile, the log-sum-exp of the tile's
// valid columns, one float at ptr[n_tile * Mpad + m], computed online from (max, sum exp(x - max));
// rows past M (and rows whose valid x are all -inf) get -inf. Computed as the node does, with its
// own arithmetic (arith::lse_*): each of the 4 lanes that share a row (column pairs 2l, 2l + 1 of every
// 8 columns) keeps a max and two sums (even, odd columns) per row, folding a fragment's elements of the
// row in at once (new max, one rescale, the terms); at the tile's end the lanes merge by an XOR butterfly.
template <class TileShape>
struct RowLsePartial : Node {
  static constexpr int kLanes = 4;
  struct Arguments {
    float* ptr = nullptr;
  };
  Arguments args;
  std::vector<float> mx, s0, s1;    // per (row of the tile, lane)
  Tile tile{};
  RowLsePartial(Arguments const& a, Problem p) : Node{p}, args(a) {}
  void begin(Tile const& t) {
    mx.assign(size_t(t.tile_m) * kLanes, -INFINITY);
    s0.assign(mx.size(), 0.0f);
    s1.assign(mx.size(), 0.0f);
    tile = t;
  }
  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& in) {
    float x[kFrag];
    for (int i = 0; i < kFrag; ++i)      // masked (ragged) elements become -inf
      x[i] = f.inside[i] ? convert<float>(float(in[i])) : -INFINITY;
    for (int i = 0; i < kFrag; i += 2) {  // elements i (even column), i + 1 (odd column): one row
      const size_t k = size_t(f.m[i] - tile.m0) * kLanes + size_t((f.n[i] - tile.n0) / 2 % kLanes);
      const float old = mx[k];
      mx[k] = fmaxf(fmaxf(mx[k], x[i]), x[i + 1]);
      const float c = arith::lse_rescale(old, mx[k]);
      s0[k] *= c;
      s1[k] *= c;
      s0[k] += arith::lse_term(x[i], arith::lse_pivot(mx[k]));
      s1[k] += arith::lse_term(x[i + 1], arith::lse_pivot(mx[k]));
    }
    return in;
  }
  void end(Tile const& t) {
    if (args.ptr == nullptr) return;
    size_t mpad = size_t(ceil_div(problem.M, t.tile_m)) * t.tile_m;
    for (int r = 0; r < t.tile_m; ++r) {
      float m[kLanes], s[kLanes];
      for (int l = 0; l < kLanes; ++l) {
        m[l] = mx[size_t(r) * kLanes + l];
        s[l] = s0[size_t(r) * kLanes + l] + s1[size_t(r) * kLanes + l];
      }
      for (int mask = 1; mask < kLanes; mask *= 2) {
        float m2[kLanes], s2[kLanes];
        std::copy(m, m + kLanes, m2);
        std::copy(s, s + kLanes, s2);
        for (int l = 0; l < kLanes; ++l) arith::lse_merge(m[l], s[l], m2[l ^ mask], s2[l ^ mask]);
      }
      args.ptr[t.n_index * mpad + t.m0 + r] = arith::lse_value(m[0], s[0]);
    }
  }
};

// epic_nodes::Sm90RowFold: counts each tile in its row block; the tile that completes a block (on
// the host, the block's last column tile) runs the folded combine, Tail::row, for every row of the
// block, its threads as warps of lanes (shuffles emulated), as many as a pingpong epilogue has (128,
// 256 for 256-row tiles): 128 / TileM lanes per row. The counters argument (null: the library's own)
// is not used; this node keeps its own, which start at 0 each launch, as the library's do.
template <class TileShape, class Tail>
struct RowFold : Node {
  struct Arguments {
    int* counters = nullptr;
    void* ptrs[Tail::kNumPtrs > 0 ? Tail::kNumPtrs : 1] = {};
    float scalars[Tail::kNumScalars > 0 ? Tail::kNumScalars : 1] = {};
  };
  Arguments args;
  std::vector<int> count;    // tiles done per row block
  RowFold(Arguments const& a, Problem p) : Node{p}, args(a), count(size_t(ceil_div(p.M, TileShape::M)), 0) {}
  template <class T>
  Frag<T> visit(Fragment const&, Frag<T> const& in) { return in; }
  void end(Tile const& t) {
    const int tiles_n = ceil_div(problem.N, t.tile_n);
    if (++count[t.m_index] != tiles_n) return;
    count[t.m_index] = 0;
    constexpr int Threads = TileShape::M <= 128 ? 128 : 256;
    constexpr int Lanes = Threads / TileShape::M;
    const long long rows_padded = (long long)ceil_div(problem.M, t.tile_m) * t.tile_m;
    const int M = problem.M;
    launch(dim3(1), dim3(Threads), 0, nullptr, [&] {
      const int thread = int(cuda_builtins::threadIdx.x);
      for (int r = thread / Lanes; r < t.tile_m; r += Threads / Lanes)
        Tail::template row<Lanes>(t.m0 + r, thread % Lanes, M, tiles_n, rows_padded, args.ptrs, args.scalars);
    });
  }
};

// epic_nodes::Sm90PackedInt4Store: column pairs (2k, 2k + 1) of a row, rounded to integers, packed
// into one byte (low nibble = even column) at ptr[m * (N / 2) + n / 2]; in-bounds pairs only.
struct PackedInt4Store : Node {
  struct Arguments {
    uint8_t* ptr = nullptr;
  };
  Arguments args;
  PackedInt4Store(Arguments const& a, Problem p) : Node{p}, args(a) {}
  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& in) const {
    if (args.ptr == nullptr) return in;
    for (int i = 0; i + 1 < kFrag; i += 2) {
      if (!f.inside[i]) continue;
      args.ptr[size_t(f.m[i]) * (problem.N / 2) + f.n[i] / 2] = arith::pack_int4(float(in[i]), float(in[i + 1]));
    }
    return in;
  }
};


// epic_nodes::Sm90HalfWidthPairStore<Element>: column pair (2k, 2k + 1) of a row carries one value
// (element 2k), stored as Element at ptr[m * (N / 2) + n / 2]; in-bounds pairs only. The device
// exchanges values within each lane quad and stores with stmatrix and TMA; the values and where
// they land are these.
template <class Element>
struct HalfWidthPairStore : Node {
  struct Arguments {
    Element* ptr = nullptr;
  };
  Arguments args;
  HalfWidthPairStore(Arguments const& a, Problem p) : Node{p}, args(a) {}
  template <class T>
  Frag<T> visit(Fragment const& f, Frag<T> const& in) const {
    if (args.ptr == nullptr) return in;
    for (int i = 0; i + 1 < kFrag; i += 2) {
      if (!f.inside[i]) continue;
      args.ptr[size_t(f.m[i]) * (problem.N / 2) + f.n[i] / 2] = convert<Element>(float(in[i]));
    }
    return in;
  }
};

// epic_nodes::Sm90BlockScale<Block, ElementScale, Pow2, ScaleLayout, Output>: the root, quantizing its
// child x in 1 x Block row segments: s = max(amax of |x| over the segment's valid elements, floor) /
// qmax (rounded up to a power of two if Pow2); the scale stored as ElementScale (layout 0: [m *
// ceil(N / Block) + g], 1: [g * round_up(M, 4) + m]); q = x / s clamped to [-qmax, qmax] (Output 1:
// [-8, 7]), rounded half to even for integer outputs (NaN -> 0) and kept NaN for float ones. Output 0:
// q is what the collective stores as D; Output 1: pairs packed into int4 bytes at ptr_q; Output 2: a
// half-width value (on both columns of a pair) stored once per pair as ElementQ at ptr_q.
// Split blocks (tile N = Block / 2, the GPU's 1x2 cluster pair): the halves of each (row, block)
// statistic, kept across the launch's two passes. A tile merges its half with the other tile's, as
// detail::exchange_halves does on the GPU (merge(left, right); a right half past N counts as absent);
// in the first pass the half after it is not known yet (identity), in the second it is.
struct SplitHalves {
  std::map<long long, float> half;
  template <int Block, class Merge>
  void exchange(Tile const& t, Problem p, std::vector<float>& stat, float identity, Merge const& merge) {
    const int g = t.n0 / Block;
    const bool right = t.n0 % Block != 0;
    const long long segs = ceil_div(p.N, Block);
    for (int r = 0; r < t.tile_m; ++r) {
      const long long key = ((long long)(t.m0 + r) * segs + g) * 2;
      half[key + right] = stat[size_t(r)];
      if (g * Block + t.tile_n >= p.N) continue;                       // no right half
      auto other = half.find(key + !right);
      const float o = other == half.end() ? identity : other->second;
      stat[size_t(r)] = right ? merge(o, stat[size_t(r)]) : merge(stat[size_t(r)], o);
    }
  }
};

template <int Block, class ElementScale, bool Pow2, int ScaleLayout, int Output, class ElementQ = uint8_t>
struct BlockScale : Node {
  struct Arguments {
    ElementScale* ptr_scale = nullptr;
    float qmax = 0.f;
    float floor = 0.f;
    uint8_t* ptr_q = nullptr;
  };
  static constexpr int passes = 2;
  Arguments args;
  SplitHalves halves;
  BlockScale(Arguments const& a, Problem p) : Node{p}, args(a) {}

  template <class T>
  Frag<float> visit(Fragment const&, Frag<T> const& in) const { return convert<float>(in); }

  template <class ElementD>
  void reduce(Tile const& t, std::vector<Fragment> const& frags, std::vector<Frag<float>>& results) {
    constexpr bool integer = Output == 1 || std::is_integral_v<std::conditional_t<Output == 2, ElementQ, ElementD>>;
    int segments = std::max(1, t.tile_n / Block);     // split blocks: one half segment per tile
    std::vector<float> amax(size_t(t.tile_m) * segments, 0.0f), scale(amax.size());
    auto slot = [&](Fragment const& f, int i) { return size_t(f.m[i] - t.m0) * segments + (f.n[i] - t.n0) / Block; };
    for (size_t v = 0; v < frags.size(); ++v)
      for (int i = 0; i < kFrag; ++i)
        amax[slot(frags[v], i)] = arith::amax_fold(amax[slot(frags[v], i)], results[v][i], frags[v].inside[i]);
    if (t.tile_n < Block) halves.exchange<Block>(t, problem, amax, 0.f, [](float a, float b) { return std::fmax(a, b); });
    for (size_t k = 0; k < amax.size(); ++k) {
      scale[k] = arith::block_scale_of<Pow2>(amax[k], args.floor, args.qmax);
      int m = t.m0 + int(k) / segments, g = t.n0 / Block + int(k) % segments;
      if (args.ptr_scale != nullptr && m < problem.M && g * Block < problem.N && t.n0 % Block == 0) {
        size_t segs_n = size_t(ceil_div(problem.N, Block)), m_pad4 = size_t(ceil_div(problem.M, 4)) * 4;
        size_t at = ScaleLayout == 0 ? size_t(m) * segs_n + g : size_t(g) * m_pad4 + m;
        args.ptr_scale[at] = convert<ElementScale>(scale[k]);
      }
    }
    float lo = Output == 1 ? -8.f : -args.qmax, hi = Output == 1 ? 7.f : args.qmax;
    for (size_t v = 0; v < frags.size(); ++v)
      for (int i = 0; i < kFrag; ++i) {
        const float s = scale[slot(frags[v], i)];   // by slot: the GPU decides per thread, alike where it matters
        results[v][i] = arith::use_reciprocal<Pow2, integer>(s)
                            ? arith::quantize_rcp(results[v][i], arith::reciprocal(s), lo, hi, integer)
                            : arith::quantize_div(results[v][i], s, lo, hi, integer);
      }
    if constexpr (Output == 1) {
      PackedInt4Store pack(typename PackedInt4Store::Arguments{args.ptr_q}, problem);
      for (size_t v = 0; v < frags.size(); ++v) pack.visit(frags[v], results[v]);
    }
    if constexpr (Output == 2) {     // one ElementQ per column pair, from its even column
      for (size_t v = 0; v < frags.size(); ++v)
        for (int i = 0; i + 1 < kFrag; i += 2)
          if (args.ptr_q != nullptr && frags[v].inside[i])
            reinterpret_cast<ElementQ*>(args.ptr_q)[size_t(frags[v].m[i]) * (problem.N / 2) + frags[v].n[i] / 2] =
                convert<ElementQ>(results[v][i]);
    }
  }
};

// epic_nodes::Sm90BlockReduceScale<Block, Fn, Divide, ElementScale>: the root, scaling its first child y
// by s = Fn::finalize(stat) of each 1 x Block row segment, stat = Fn::merge of Fn::pre(z) over the
// segment's valid elements of its second child z (from Fn::identity()); D = y * s (Divide: y / s); s
// stored as ElementScale at [m * ceil(N / Block) + g] when ptr_scale is given. Masked: a third child,
// per element 0 (D = y) or 1 (scaled).
template <int Block, class Fn, bool Divide, class ElementScale, bool Masked = false>
struct BlockReduceScale : Node {
  struct Arguments {
    ElementScale* ptr_scale = nullptr;
  };
  static constexpr int passes = 2;
  SplitHalves halves;
  Arguments args;
  std::vector<float> stat;
  std::vector<char> scaled;    // Masked: per element of the tile, whether the scale applies
  Tile tile{};
  BlockReduceScale(Arguments const& a, Problem p) : Node{p}, args(a) {}

  size_t slot(int m, int n) const { return size_t(m - tile.m0) * std::max(1, tile.tile_n / Block) + (n - tile.n0) / Block; }

  void begin(Tile const& t) {
    tile = t;
    stat.assign(size_t(t.tile_m) * std::max(1, t.tile_n / Block), Fn::identity());
    scaled.assign(size_t(t.tile_m) * t.tile_n, 1);
  }

  template <class Y, class Z, class Mask>
  Frag<float> visit(Fragment const& f, Frag<Y> const& y, Frag<Z> const& z, Frag<Mask> const& mask) {
    static_assert(Masked, "a third child needs Masked");
    for (int i = 0; i < kFrag; ++i)
      scaled[size_t(f.m[i] - tile.m0) * tile.tile_n + (f.n[i] - tile.n0)] = float(mask[i]) != 0.0f;
    return visit(f, y, z);
  }

  template <class Y, class Z>
  Frag<float> visit(Fragment const& f, Frag<Y> const& y, Frag<Z> const& z) {
    for (int i = 0; i < kFrag; ++i)
      if (f.inside[i]) Fn::merge(stat[slot(f.m[i], f.n[i])], Fn::pre(float(z[i])));
    return convert<float>(y);
  }

  template <class ElementD>
  void reduce(Tile const& t, std::vector<Fragment> const& frags, std::vector<Frag<float>>& results) {
    std::vector<float> scale(stat.size());
    int segments = std::max(1, t.tile_n / Block);
    if (t.tile_n < Block) halves.exchange<Block>(t, problem, stat, Fn::identity(), [](float a, float b) { Fn::merge(a, b); return a; });
    for (size_t k = 0; k < stat.size(); ++k) {
      scale[k] = Fn::finalize(stat[k]);
      int m = t.m0 + int(k) / segments, g = t.n0 / Block + int(k) % segments;
      if (args.ptr_scale != nullptr && m < problem.M && g * Block < problem.N && t.n0 % Block == 0)
        args.ptr_scale[size_t(m) * size_t(ceil_div(problem.N, Block)) + g] = convert<ElementScale>(scale[k]);
    }
    for (size_t v = 0; v < frags.size(); ++v)
      for (int i = 0; i < kFrag; ++i) {
        bool on = scaled[size_t(frags[v].m[i] - t.m0) * t.tile_n + (frags[v].n[i] - t.n0)];
        float s = on ? scale[slot(frags[v].m[i], frags[v].n[i])] : 1.0f;    // y * 1, y / 1: y
        results[v][i] = arith::apply_scale<Divide>(results[v][i], s);
      }
  }
};

}  // namespace hostsim
