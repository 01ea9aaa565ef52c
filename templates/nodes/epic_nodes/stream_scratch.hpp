// epic_nodes::stream_scratch(device, stream, purpose, bytes): zeroed device memory that a kernel uses
// to meet other CTAs of the same launch (a folded combine's row block counters, the slots in which two
// CTAs exchange halves of a block statistic) and leaves zeroed again when it ends.
//
// One buffer per (device, stream, purpose), owned by the library: the gemms of one stream use it one
// after another (a gemm launched as a programmatic dependent touches global memory only after its
// griddepcontrol.wait, when the kernel before it has finished), so one buffer serves every launch on
// that stream, and launches on two streams never share one. A buffer is never freed: a launch
// still in flight on the stream may use an older, smaller one when a larger one replaces it. nullptr
// where CUDA refuses the memory. The first call for a stream allocates (and waits for the zeroing, on
// a private stream, which is allowed while the caller's stream captures a CUDA graph).
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

namespace epic_nodes {

inline void* stream_scratch(int device, cudaStream_t stream, int purpose, size_t bytes) {
  struct Buffer { int device; cudaStream_t stream; int purpose; void* ptr; size_t bytes; };
  thread_local Buffer recent{-1, nullptr, -1, nullptr, 0};
  if (recent.ptr != nullptr && recent.device == device && recent.stream == stream && recent.purpose == purpose &&
      recent.bytes >= bytes) {
    return recent.ptr;
  }
  static std::mutex mutex;
  static std::vector<Buffer> buffers;
  std::lock_guard<std::mutex> lock(mutex);
  for (Buffer const& b : buffers) {
    if (b.device == device && b.stream == stream && b.purpose == purpose && b.bytes >= bytes) {
      recent = b;
      return b.ptr;
    }
  }
  size_t n = bytes <= (size_t(1) << 16) ? (size_t(1) << 16) : 2 * bytes;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  void* ptr = nullptr;
  cudaStream_t side = nullptr;
  bool ok = cudaMalloc(&ptr, n) == cudaSuccess &&
            cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMemsetAsync(ptr, 0, n, side) == cudaSuccess &&
            cudaStreamSynchronize(side) == cudaSuccess;
  if (side != nullptr) {
    cudaStreamDestroy(side);
  }
  if (!ok && ptr != nullptr) {       // allocated, but the side stream or the zeroing failed
    cudaFree(ptr);
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (!ok) {
    (void)cudaGetLastError();
    return nullptr;
  }
  buffers.push_back({device, stream, purpose, ptr, n});
  recent = buffers.back();
  return ptr;
}

} // namespace epic_nodes
