// Decode tail probe (bench/decode_tail_probe.py): residual + RMSNorm's whole epilogue as a kernel of its
// own after a gemm that stores only its accumulator, one CTA per row. Hand-written for one program
// (samples/residual_rmsnorm.epi) to measure whether this plan beats the fused epilogue plus its row
// combine kernel at M = 64 before code generation is written for it.
//   resid = acc + z;  hg = resid * gamma;  r = rsqrt(mean(resid^2) + eps)    (resid in f32, as epic's IR)
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

namespace {
constexpr int V = 8;         // columns a thread takes per chunk: one 16-byte move of bf16
constexpr int MAXC = 4;      // chunks a thread holds: N <= THREADS * V * MAXC

template <typename T> struct Acc8;
template <> struct Acc8<float> {
  static __device__ __forceinline__ void load(const float* p, float (&x)[V]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
};
template <> struct Acc8<__nv_bfloat16> {
  static __device__ __forceinline__ void load(const __nv_bfloat16* p, float (&x)[V]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&u);
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = __bfloat162float(h[e]);
  }
};

template <int THREADS, bool EARLY, typename AccT>
__global__ void __launch_bounds__(THREADS) tail_kernel(
    const AccT* __restrict__ acc, const __nv_bfloat16* __restrict__ z, const __nv_bfloat16* __restrict__ gamma,
    __nv_bfloat16* __restrict__ resid, __nv_bfloat16* __restrict__ hg, float* __restrict__ r, int N, float eps) {
  const long long row = (long long)blockIdx.x * N;
  const int tid = threadIdx.x;
  uint4 zr[MAXC], gr[MAXC];
  auto inputs = [&]() {
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
      const int j = (c * THREADS + tid) * V;
      if (j < N) {
        zr[c] = *reinterpret_cast<const uint4*>(z + row + j);
        gr[c] = *reinterpret_cast<const uint4*>(gamma + j);
      }
    }
  };
  if (EARLY) inputs();      // z and gamma are the call's inputs: no kernel of the call writes them
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!EARLY) inputs();
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int j = (c * THREADS + tid) * V;
    if (j < N) {
      float a[V];
      Acc8<AccT>::load(acc + row + j, a);
      const __nv_bfloat16* zz = reinterpret_cast<const __nv_bfloat16*>(&zr[c]);
      const __nv_bfloat16* gg = reinterpret_cast<const __nv_bfloat16*>(&gr[c]);
      alignas(16) __nv_bfloat16 o1[V], o2[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float h = a[e] + __bfloat162float(zz[e]);
        ss += h * h;
        o1[e] = __float2bfloat16(h);
        o2[e] = __float2bfloat16(h * __bfloat162float(gg[e]));
      }
      *reinterpret_cast<uint4*>(resid + row + j) = *reinterpret_cast<const uint4*>(o1);
      *reinterpret_cast<uint4*>(hg + row + j) = *reinterpret_cast<const uint4*>(o2);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float warp_sums[THREADS / 32];
  if ((tid & 31) == 0) warp_sums[tid >> 5] = ss;
  __syncthreads();
  if (tid == 0) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) t += warp_sums[w];
    r[blockIdx.x] = rsqrtf(t / float(N) + eps);
  }
}

template <int THREADS, bool EARLY, typename AccT>
int launch(const void* acc, const void* z, const void* gamma, void* resid, void* hg, void* r, int M, int N,
           float eps, cudaStream_t stream, int pdl) {
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(M);
  config.blockDim = dim3(THREADS);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return int(cudaLaunchKernelEx(&config, tail_kernel<THREADS, EARLY, AccT>, static_cast<const AccT*>(acc),
                                static_cast<const __nv_bfloat16*>(z), static_cast<const __nv_bfloat16*>(gamma),
                                static_cast<__nv_bfloat16*>(resid), static_cast<__nv_bfloat16*>(hg),
                                static_cast<float*>(r), N, eps));
}
}  // namespace

// acc_f32: the accumulator as f32 (else bf16); threads: 256 or 512; early: z and gamma loaded before
// the wait for the gemm; pdl: launched as the gemm's programmatic dependent. Returns a cudaError_t.
extern "C" __attribute__((visibility("default"))) int tail_launch(
    const void* acc, int acc_f32, int threads, int early, const void* z, const void* gamma, void* resid, void* hg,
    void* r, int M, int N, float eps, void* stream, int pdl) {
  if (N % V != 0 || N > 512 * V * MAXC || (threads == 256 && N > 256 * V * MAXC)) return -1;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define EPIC_TAIL(T, E, A) if (threads == T && early == E && acc_f32 == (A)) \
    return launch<T, E != 0, std::conditional_t<A, float, __nv_bfloat16>>(acc, z, gamma, resid, hg, r, M, N, eps, s, pdl);
  EPIC_TAIL(256, 0, 1) EPIC_TAIL(256, 1, 1) EPIC_TAIL(512, 0, 1) EPIC_TAIL(512, 1, 1)
  EPIC_TAIL(256, 0, 0) EPIC_TAIL(256, 1, 0) EPIC_TAIL(512, 0, 0) EPIC_TAIL(512, 1, 0)
#undef EPIC_TAIL
  return -2;
}
