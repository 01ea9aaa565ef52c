// cutlass::OrderedSequenceBarrier<2, 2> on the SM's hardware named barriers (bar.sync / bar.arrive)
// instead of shared-memory mbarriers: the order in which CUTLASS's sm90 pingpong kernel lets its two
// consumer warp groups run their mainloops (stage 0) and their epilogues (stage 1). That kernel is its
// only user of <2, 2> (the load-order barriers are <1, 2>). Same sequence as CUTLASS's: group g waits on
// its own barrier of the current stage and arrives on the other group's; group 0 goes first.
//
// Each barrier counts both groups' 256 threads: group g's 128 bar.sync, the other's 128 bar.arrive.
// Group 1 arrives once on each of group 0's two barriers at construction, which is what lets group 0
// go first; after that the sequence alternates strictly, so a barrier never holds two arrivals of one
// group. The producer warp group (group_id not 0 or 1) touches none. CUTLASS's mbarriers stay in the
// kernel's shared storage, unused.
//
// Barrier ids: 8..11, the first past ReservedNamedBarriers (cutlass/arch/barrier.h); epic's epilogue
// nodes sync on CUTLASS's EpilogueBarrier (1) only.
#pragma once

#include "cutlass/pipeline/sm90_pipeline.hpp"

namespace cutlass {

template <>
class OrderedSequenceBarrier<2, 2> {
 public:
  static constexpr int SequenceDepth = 2;
  static constexpr int SequenceLength = 2;
  using SharedStorage = PipelineDetail::OrderedSequenceBarrierSharedStorage<2, 2>;

  struct Params {
    uint32_t group_id;
    uint32_t group_size;
    int initializing_warp = 0;
  };

  static constexpr int kFirstId = 8;    // ids 8 + 2 * stage + group
  static constexpr int kThreads = 256;  // both groups of 128 threads

  OrderedSequenceBarrier() = delete;
  OrderedSequenceBarrier(const OrderedSequenceBarrier&) = delete;
  OrderedSequenceBarrier& operator=(const OrderedSequenceBarrier&) = delete;

  CUTLASS_DEVICE
  OrderedSequenceBarrier(SharedStorage&, Params const& params) : group_(params.group_id) {
    if (group_ == 1) {            // group 0's first mainloop and first epilogue may start
      arrive_on(kFirstId + 0);
      arrive_on(kFirstId + 2);
    }
  }

  CUTLASS_DEVICE
  void wait() {
    asm volatile("bar.sync %0, %1;" :: "r"(kFirstId + 2 * stage_ + int(group_)), "n"(kThreads) : "memory");
  }

  CUTLASS_DEVICE
  void arrive() {
    arrive_on(kFirstId + 2 * stage_ + int(group_ ^ 1u));
    stage_ ^= 1;
  }

  CUTLASS_DEVICE
  void advance() { stage_ ^= 1; }

 private:
  CUTLASS_DEVICE
  static void arrive_on(int id) {
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "n"(kThreads) : "memory");
  }

  uint32_t group_;
  int stage_ = 0;
};

}  // namespace cutlass
