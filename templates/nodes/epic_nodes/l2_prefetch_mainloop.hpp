// epic_mainloop::L2PrefetchMainloop<Mainloop, TileN, TileK>: CUTLASS's sm90 mainloop collective,
// whose kernel-start hook (prefetch_tma_descriptors, run by one thread of each CTA before the producer's
// griddepcontrol.wait) also asks L2 for the B operand of the CTA's first tile, as many K steps as the
// pipeline has stages. A gemm launched as a programmatic dependent becomes resident while the kernel
// before it finishes; at decode sizes its B (a weight matrix, one pass over which is the gemm's cost)
// then starts arriving from DRAM during that kernel's tail instead of after it. Only B: A is what the
// previous kernel writes. An L2 prefetch is a hint, and L2 is where the GPU's memory is coherent, so a
// line prefetched before the previous kernel writes it is never read stale.
//
// The first tile is assumed to be the CTA's linear index along N, which is what the persistent
// scheduler gives where the grid has one row of tiles (M <= the tile's M); the launch asks for the
// prefetch only there (epic/plan/launch.py). Each prefetch is one cp.async.bulk.prefetch of a
// contiguous run: B's rows of one column block when B is K-major (a weight W[N, K] passed as W.t()),
// else its columns' rows, clipped to the matrix (TMA's 16-byte strides keep every run 16-byte aligned).
#pragma once

#include <cstdint>

namespace epic_mainloop {

template <class Mainloop, int TileN, int TileK>
struct L2PrefetchMainloop : Mainloop {
  using Base = Mainloop;
  struct Params : Base::Params {
    char const* ptr_b = nullptr;
    long long stride_n = 0, stride_k = 0;   // elements
    int n = 0, k = 0;
    bool prefetch = false;                  // set by the launch (its flag 2)
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& shape, typename Base::Arguments const& args,
                                        void* workspace) {
    Params p;
    static_cast<typename Base::Params&>(p) = Base::to_underlying_arguments(shape, args, workspace);
    auto mnkl = cute::append<4>(shape, 1);
    p.ptr_b = reinterpret_cast<char const*>(args.ptr_B);
    p.stride_n = static_cast<long long>(cute::get<0>(args.dB));
    p.stride_k = static_cast<long long>(cute::get<1>(args.dB));
    p.n = int(cute::get<1>(mnkl));
    p.k = int(cute::get<2>(mnkl));
    return p;
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
#if defined(__CUDA_ARCH__)
    if (!p.prefetch) return;
    constexpr int kStages = Base::DispatchPolicy::Stages;
    long long const cta = blockIdx.x + (long long)gridDim.x * blockIdx.y;
    long long const n0 = cta * TileN;
    if (n0 >= p.n) return;
    int const cols = p.n - n0 < TileN ? int(p.n - n0) : TileN;
    int const depth = kStages * TileK < p.k ? kStages * TileK : p.k;
    using ElementB = cute::remove_cvref_t<decltype(*typename Base::Arguments{}.ptr_B)>;
    constexpr int kBytes = int(cute::sizeof_bits_v<ElementB> / 8);
    if constexpr (kBytes == 0) return;     // sub-byte B: not prefetched
    bool const k_major = p.stride_k == 1;
    int const runs = k_major ? cols : depth;
    // the instruction takes whole 16-byte units: a run's ragged end (a row of K or N elements whose
    // bytes are not a multiple of 16, its stride padded) is left to the mainloop's own loads
    unsigned const run_bytes = (unsigned(k_major ? depth : cols) * kBytes) & ~15u;
    if (run_bytes == 0) return;
    long long const step = (k_major ? p.stride_n : p.stride_k) * kBytes;
    char const* first = p.ptr_b + (k_major ? n0 * p.stride_n : n0) * kBytes;
    for (int r = 0; r < runs; ++r) {
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(first + r * step), "r"(run_bytes) : "memory");
    }
#endif
  }
};

}  // namespace epic_mainloop
