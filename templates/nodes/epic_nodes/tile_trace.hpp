// epic_trace: when each warp group of each CTA reached each phase of each tile, in SM clock cycles
// (kernel option trace=tiles; bench/tile_trace.py reads and summarizes it). Where a persistent kernel's
// time goes between tiles is what Nsight Compute's totals do not say: how long a warp group waits for
// its turn on the tensor cores, for its first operands, for its epilogue's turn.
//
// TracedMainloop and TracedEpilogue wrap the mainloop and epilogue collectives; CUTLASS's kernel calls
// them as it calls the collectives they wrap, and one thread per warp group stores a clock64() reading
// into a __device__ buffer at each phase boundary. The buffer lives in the kernel's library;
// epic_trace_clear() zeroes it and epic_trace_read() copies it out (a CTA index or tile past the
// buffer's size is not recorded; a reading of 0 is a phase not reached).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <cuda_runtime.h>

namespace epic_trace {

constexpr int kCtas = 264;        // CTAs recorded (a persistent grid has one per SM)
constexpr int kTiles = 128;       // tiles recorded per warp group
// a consumer warp group's phases of one tile
enum Event : int {
  kMmaBegin = 0,     // mma() entered: its turn on the tensor cores
  kData = 1,         // its first k-block's operands are in shared memory
  kIssued = 2,       // mma() returned: every k-block issued (the other warp group's cue)
  kRetired = 3,      // mma_tail() returned: every k-block retired, its stages released
  kEpiBegin = 4,     // the epilogue's store() entered: its turn
  kEpiStored = 5,    // store() returned
  kEpiEnd = 6,       // store_tail() returned: its TMA stores have read shared memory (pingpong)
  kWgEvents = 7
};
// the producer's loads of one tile (in the order the CTA runs its tiles): load() entered, the tile's first
// stage found free (its first TMA load follows at once), load() returned (its last TMA load issued)
enum LoadEvent : int { kLoadBegin = 0, kLoadFree = 1, kLoadEnd = 2, kLoadEvents = 3 };
// per CTA: the SM it ran on, globaltimer (ns) and clock64 read together at its first tile and again at
// each epilogue's end (the last one stays: when the CTA finished), tiles seen per consumer warp group,
// tiles the producer loaded
enum CtaWord : int {
  kSmid = 0, kGlobalNs = 1, kClock = 2, kTiles0 = 3, kTiles1 = 4, kLoads = 5, kLastNs = 6, kLastClock = 7,
  kCtaWords = 8
};

struct Buffer {
  unsigned long long wg[kCtas][2][kTiles][kWgEvents];
  unsigned long long load[kCtas][2 * kTiles][kLoadEvents];
  unsigned long long cta[kCtas][kCtaWords];
};

__device__ Buffer g_buffer;

#if defined(__CUDA_ARCH__)
CUTLASS_DEVICE int cta_index() {
  return int(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

// thread 0 of a consumer warp group (warp groups 1 and 2: CUTLASS's Consumer0 and Consumer1)
CUTLASS_DEVICE void consumer_event(int tile, int event) {
  int const t = int(threadIdx.x);
  int const wg = t / 128 - 1;
  int const c = cta_index();
  if (t % 128 != 0 || wg < 0 || wg > 1 || c >= kCtas || tile >= kTiles) return;
  unsigned long long const now = clock64();
  g_buffer.wg[c][wg][tile][event] = now;
  if (event == kMmaBegin && tile == 0 && wg == 0) {
    unsigned long long ns;
    unsigned smid;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    g_buffer.cta[c][kSmid] = smid;
    g_buffer.cta[c][kGlobalNs] = ns;
    g_buffer.cta[c][kClock] = now;
  }
  if (event == kRetired) g_buffer.cta[c][kTiles0 + wg] = (unsigned long long)(tile + 1);
  if (event == kEpiStored) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    g_buffer.cta[c][kLastNs] = ns;
    g_buffer.cta[c][kLastClock] = now;
  }
}

// thread 0 of the CTA: the producer warp's first lane
CUTLASS_DEVICE void load_event(int tile, int event) {
  int const c = cta_index();
  if (threadIdx.x != 0 || c >= kCtas || tile >= 2 * kTiles) return;
  g_buffer.load[c][tile][event] = clock64();
  if (event == kLoadEnd) g_buffer.cta[c][kLoads] = (unsigned long long)(tile + 1);
}
#else
inline void consumer_event(int, int) {}
inline void load_event(int, int) {}
#endif

template <class Base>
struct TracedMainloop : Base {
  int tile_ = 0;        // this thread's tiles so far: a consumer's mma() turns, the producer's load() calls

  // CUTLASS's load(params, pipeline, first stage, inputs, tile, k-block iterator, k-block count, ...).
  // The first stage's empty barrier is polled (a read: no arrival, no expected bytes) before Base::load's
  // own wait, which then passes at once: when it turns is when the tile's first TMA load can go.
  template <class MainloopParams, class Pipeline, class State, class Inputs, class Tile, class KIterator,
            class... Rest>
  CUTLASS_DEVICE void load(MainloopParams const& params, Pipeline pipeline, State write, Inputs const& inputs,
                           Tile const& tile, KIterator k_iter, int k_tiles, Rest&&... rest) {
    load_event(tile_, kLoadBegin);
    if (k_tiles > 0) {
      while (pipeline.producer_try_acquire(write).get() != cutlass::BarrierStatus::WaitDone) {
      }
    }
    load_event(tile_, kLoadFree);
    Base::load(params, pipeline, write, inputs, tile, k_iter, k_tiles, std::forward<Rest>(rest)...);
    load_event(tile_, kLoadEnd);
    ++tile_;
  }

  template <class Pipeline, class State, class Accumulators, class... Rest>
  CUTLASS_DEVICE void mma(Pipeline pipeline, State read, Accumulators& accum, int k_tiles, Rest&&... rest) {
    consumer_event(tile_, kMmaBegin);
    if (k_tiles > 0) {
      pipeline.consumer_wait(read);      // the first stage's phase; Base::mma's own wait then passes at once
    }
    consumer_event(tile_, kData);
    Base::mma(pipeline, read, accum, k_tiles, std::forward<Rest>(rest)...);
    consumer_event(tile_, kIssued);
  }

  template <class... Args>
  CUTLASS_DEVICE void mma_tail(Args&&... args) {
    Base::mma_tail(std::forward<Args>(args)...);
    consumer_event(tile_, kRetired);
    ++tile_;
  }
};

template <class Base>
struct TracedEpilogue : Base {
  using Base::Base;
  int tile_ = 0;

  template <class... Args>
  CUTLASS_DEVICE auto store(Args&&... args) {
    consumer_event(tile_, kEpiBegin);
    auto states = Base::store(std::forward<Args>(args)...);
    consumer_event(tile_, kEpiStored);
    ++tile_;
    return states;
  }

  template <class... Args>
  CUTLASS_DEVICE auto store_tail(Args&&... args) {
    auto states = Base::store_tail(std::forward<Args>(args)...);
    consumer_event(tile_ - 1, kEpiEnd);
    return states;
  }
};

}  // namespace epic_trace

// the buffer's shape, then its contents (bench/tile_trace.py)
EPIC_API int epic_trace_layout(int* out) {
  int const layout[6] = {epic_trace::kCtas, epic_trace::kTiles, epic_trace::kWgEvents, epic_trace::kLoadEvents,
                         epic_trace::kCtaWords, int(sizeof(epic_trace::Buffer))};
  for (int i = 0; i < 6; ++i) out[i] = layout[i];
  return 0;
}

EPIC_API int epic_trace_clear() {
  void* p = nullptr;
  if (cudaGetSymbolAddress(&p, epic_trace::g_buffer) != cudaSuccess) { (void)cudaGetLastError(); return -1; }
  if (cudaMemset(p, 0, sizeof(epic_trace::Buffer)) != cudaSuccess) { (void)cudaGetLastError(); return -1; }
  return 0;
}

EPIC_API int epic_trace_read(void* dst, size_t bytes) {
  if (dst == nullptr || bytes < sizeof(epic_trace::Buffer)) return -2;
  if (cudaMemcpyFromSymbol(dst, epic_trace::g_buffer, sizeof(epic_trace::Buffer)) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return 0;
}
