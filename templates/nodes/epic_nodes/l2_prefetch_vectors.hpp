// epic_mainloop::L2PrefetchVectors<Mainloop, TileM, TileN, NumVectors>: the kernel-start hook of a
// mainloop collective (one thread of each CTA, before any wait) also asks L2 for the parts of the
// epilogue's vectors that the CTA's tiles read. CUTLASS's Sm90RowBroadcast and Sm90ColBroadcast (and
// epic's per-head vector) load them from global memory when the epilogue of a tile begins, after the
// mainloop: at decode sizes, where each CTA has one or two tiles and the other consumer warp group has
// no mainloop to hide it behind, that load's DRAM latency is on the critical path. Asked for at kernel
// start, the lines are in L2 by then. A hint: it loads nothing into the SM, and L2 is where the GPU's
// memory is coherent, so a line asked for before an earlier kernel writes it is never read stale.
//
// Only for a grid with one row of tiles (M <= the tile's M; the launch asks for it only there, flag
// 4, epic/plan/launch.py). CTA i asks for column blocks i, i + CTAs, ...: CUTLASS's scheduler deals
// them out in that order, or, with a 1x2 cluster, in another (CTA (x, y) of the cluster grid gets
// block 2x + y); L2 is shared, so what counts is that the CTAs together ask for every block. A vector
// is a row vector (one element per column: each block's slice), a column vector (one per row: its
// first M elements) or a per-head vector of `period` elements (all of it). Each request is one
// cp.async.bulk.prefetch of whole 16-byte units (epic refuses tensors that are not 16-byte aligned,
// and a column block's slice starts at a multiple of 16 bytes); a ragged end is left to the
// epilogue's own loads. vector_runs() is the arithmetic, tested on the host (tests/test_l2_prefetch_vectors.py).
#pragma once

#include <cstdint>

namespace epic_mainloop {

struct VectorPrefetch {
  char const* ptr = nullptr;
  long long elements = 0;     // the vector's length (row: N, column: M, per-head: the period)
  int bytes = 0;              // per element
  int kind = 0;               // 0 row vector, 1 column vector, 2 per-head vector
};

// Calls run(offset, bytes) for each byte run of vector x (offset from x.ptr) that CTA `cta` of `ctas`
// asks for, before rounding to 16-byte units.
template <int TileM, int TileN, class Run>
CUTLASS_HOST_DEVICE void vector_runs(VectorPrefetch const& x, long long cta, long long ctas, Run&& run) {
  if (x.ptr == nullptr || x.elements <= 0 || x.bytes <= 0) return;
  if (x.kind == 0) {
    for (long long n0 = cta * TileN; n0 < x.elements; n0 += ctas * TileN) {
      long long const cols = x.elements - n0 < TileN ? x.elements - n0 : TileN;
      run(n0 * x.bytes, cols * x.bytes);
    }
  } else if (x.kind == 1) {
    run(0LL, (x.elements < TileM ? x.elements : TileM) * x.bytes);
  } else {
    run(0LL, x.elements * x.bytes);
  }
}

template <class Mainloop, int TileM, int TileN, int NumVectors>
struct L2PrefetchVectors : Mainloop {
  using Base = Mainloop;
  struct Params : Base::Params {
    VectorPrefetch vectors[NumVectors];
    bool prefetch_vectors = false;          // set by the launch (its flag 4)
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(shape, args, workspace);
    return p;
  }

  CUTLASS_DEVICE static void prefetch_run(char const* first, long long bytes) {
    unsigned const whole = unsigned(bytes > (1 << 20) ? (1 << 20) : bytes) & ~15u;
    if (whole != 0) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(first), "r"(whole) : "memory");
    }
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
#if defined(__CUDA_ARCH__)
    if (!p.prefetch_vectors) return;
    long long const cta = blockIdx.x + (long long)gridDim.x * blockIdx.y;
    long long const ctas = (long long)gridDim.x * gridDim.y;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < NumVectors; ++v) {
      char const* base = p.vectors[v].ptr;
      vector_runs<TileM, TileN>(p.vectors[v], cta, ctas,
                                [&](long long offset, long long bytes) { prefetch_run(base + offset, bytes); });
    }
#endif
  }
};

}  // namespace epic_mainloop
