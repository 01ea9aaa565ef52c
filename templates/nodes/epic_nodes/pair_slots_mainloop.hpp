// epic_mainloop::PairSlots<Mainloop, Words>: CUTLASS's sm90 mainloop collective whose pipeline storage
// begins with Words 64-bit words that the pipeline's constructor zeroes. The kernel's shared storage
// begins with the mainloop's pipeline storage (CUTLASS 4.2's pingpong kernel: SharedStorage::pipelines,
// then PipelineStorage::mainloop, both first members), so the words sit at the start of the CTA's
// dynamic shared memory, where the split-block epilogue nodes find them (epic_nodes/pair_exchange.hpp,
// pair_words): the other CTA of a 1x2 cluster stores its half of each block statistic there.
//
// Why here: the kernel constructs the mainloop pipeline before the cluster's start barrier (arrive,
// then wait before any work), and the epilogue collective only after its arrive. Zeroed here, with a
// cluster-scope fence before that arrive, the words are zero before the other CTA can write one.
#pragma once

#include <cstdint>

namespace epic_mainloop {

template <class Pipeline, int Words>
struct PipelineWithPairSlots : Pipeline {
  struct SharedStorage {
    uint64_t pair_words[Words];                 // first: at offset 0 of the kernel's shared memory
    typename Pipeline::SharedStorage pipeline;
  };
  static_assert(offsetof(SharedStorage, pair_words) == 0, "epic_mainloop::PairSlots: the words must come first");

  template <class ClusterShape>
  CUTLASS_DEVICE
  PipelineWithPairSlots(SharedStorage& storage, typename Pipeline::Params params, ClusterShape cluster_shape)
      : Pipeline(storage.pipeline, params, cluster_shape) {
    for (int i = int(threadIdx.x); i < Words; i += int(blockDim.x)) {
      storage.pair_words[i] = 0;
    }
    asm volatile("fence.acq_rel.cluster;" ::: "memory");   // the zeros before this CTA's cluster arrive
  }
};

template <class Mainloop, int Words>
struct PairSlots : Mainloop {
  using MainloopPipeline = PipelineWithPairSlots<typename Mainloop::MainloopPipeline, Words>;
  using PipelineStorage = typename MainloopPipeline::SharedStorage;
};

}  // namespace epic_mainloop
