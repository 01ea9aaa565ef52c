// epic_scheduler::DynamicPersistentScheduler (kernel option tile_order=dynamic): the grouped persistent
// scheduler's tiles, in the same order, handed out at run time: each cluster takes its first tile as
// the static scheduler would, then the next unclaimed one from a global counter, so a cluster that runs
// faster takes more tiles and the CTAs finish closer together (docs/PERFORMANCE.md, "A dynamic
// scheduler"). Tile w (a cluster's unit of work) is CUTLASS's linear index w * cluster size, decoded by
// epic_nodes/tile_decode.hpp exactly as the static scheduler decodes it.
//
// It runs on the scheduler-warp path that CUTLASS 4.2's sm90 warp-specialized kernels keep for a
// dynamic scheduler (IsSchedDynamicPersistent): warp 1 of the producer warp group asks for the next
// tile one tile ahead of the mainloop's loads (throttled by them) and every warp reads the answer from
// a pipeline of responses in shared memory. On sm90 there is no cluster launch control, so:
// - the cluster's first CTA (rank 0) asks: `atom.inc` on a counter of the library's per-stream scratch
//   (epic_nodes/stream_scratch.hpp). atom.inc wraps to 0 after `limit`: a launch makes exactly one
//   increment per tile beyond the grid's first round plus one per cluster (the one that finds no tile
//   left), so the counter is 0 again when the launch ends and no launch has to clear it;
// - it stores the answer into every CTA of the cluster and publishes it with a release arrive (cluster
//   scope) on that CTA's full barrier; each CTA's readers wait with acquire at cluster scope and
//   release the slot on the asking CTA's empty barrier, so that barrier counts the arrivals of the
//   whole cluster (the kernel passes one CTA's count: the sm100 kernels multiply by the cluster size,
//   the sm90 ones do not);
// - the throttle is each CTA's own (the kernel points it at rank 0: that count too is one CTA's).
// Without a counter (the scratch could not be allocated) the first CTA answers the static order.
#pragma once

#include <cstdint>

#include "cutlass/arch/barrier.h"
#include "cutlass/arch/grid_dependency_control.h"
#include "cutlass/pipeline/sm90_pipeline.hpp"
#include "epic_nodes/grouped_tile_scheduler.hpp"

namespace epic_scheduler {

struct DynamicPersistentScheduler {};   // the tag GemmUniversal takes

namespace dynamic_detail {

CUTLASS_DEVICE uint32_t cluster_size() {
  auto cs = cute::cluster_shape();
  return cs.x * cs.y * cs.z;
}

CUTLASS_DEVICE bool asks() {             // this CTA asks for the cluster's tiles
  return cute::block_rank_in_cluster() == 0;
}

}  // namespace dynamic_detail

// Responses from the first CTA of a cluster to every CTA of it (the interface of CUTLASS's
// PipelineCLCFetchAsync, which the kernel drives). A response is one word in each CTA's shared memory,
// stored remotely and published by a release arrive on that CTA's full barrier; readers wait with
// acquire at cluster scope, then release the slot on the asking CTA's empty barrier (cluster scope
// again: the next response overwrites the word).
template <int Stages_>
class ResponsePipeline {
 public:
  static constexpr uint32_t Stages = Stages_;
  using PipelineState = cutlass::PipelineState<Stages>;
  using Barrier = cutlass::arch::ClusterBarrier;
  struct SharedStorage {
    Barrier full_barrier_[Stages];
    Barrier empty_barrier_[Stages];
  };
  enum class ThreadCategory { NonParticipant, Producer, Consumer, ProducerConsumer };
  struct Params {
    uint32_t transaction_bytes = 0;      // (unused: a response is a store and an arrive, no transaction)
    ThreadCategory role = ThreadCategory::NonParticipant;
    uint32_t is_leader = 0;
    uint32_t num_consumers = 0;
    uint32_t producer_blockid = 0;
    uint32_t producer_arv_count = 0;
    uint32_t consumer_arv_count = 0;     // one CTA's readers: multiplied here by the cluster size
    int initializing_warp = 0;
  };

  CUTLASS_DEVICE ResponsePipeline(SharedStorage& storage, Params const& params)
      : full_(&storage.full_barrier_[0]), empty_(&storage.empty_barrier_[0]) {
    asks_ = dynamic_detail::asks();
    if (cutlass::canonical_warp_idx_sync() == params.initializing_warp) {
      cutlass::arch::detail::initialize_barrier_array_pair_aligned<Barrier*, Barrier*, Stages>(
          full_, empty_, 1, params.consumer_arv_count * dynamic_detail::cluster_size());
    }
    cutlass::arch::fence_barrier_init();
  }

  // The asking CTA's scheduler warp: wait until every CTA has read the slot's last response.
  CUTLASS_DEVICE void producer_acquire(PipelineState state) {
    if (asks_) wait(&empty_[state.index()], state.phase());
  }

  CUTLASS_DEVICE void producer_commit(PipelineState) {}   // the scheduler's send() publishes

  // The asking CTA waits until every CTA has released every slot: none arrives on its barriers later.
  CUTLASS_DEVICE void producer_tail(PipelineState state) {
    if (!asks_) return;
    for (uint32_t i = 0; i < Stages; ++i) {
      wait(&empty_[state.index()], state.phase());
      ++state;
    }
  }

  CUTLASS_DEVICE void consumer_wait(PipelineState state) { wait(&full_[state.index()], state.phase()); }

  CUTLASS_DEVICE void consumer_release(PipelineState state) { arrive(&empty_[state.index()], 0u); }

  // Publishes the word just stored in CTA `rank`'s slot: a release arrive on that CTA's full barrier.
  CUTLASS_DEVICE void publish(PipelineState state, uint32_t rank) { arrive(&full_[state.index()], rank); }

 private:
  CUTLASS_DEVICE static void wait(Barrier* bar, uint32_t phase) {
    uint32_t const addr = cute::cast_smem_ptr_to_uint(bar);
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n\t.reg .pred p;\n\t"
          "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
          "selp.u32 %0, 1, 0, p;\n\t}"
          : "=r"(done) : "r"(addr), "r"(phase) : "memory");
    }
  }

  CUTLASS_DEVICE static void arrive(Barrier* bar, uint32_t rank) {
    uint32_t const addr = cute::cast_smem_ptr_to_uint(bar);
    asm volatile(
        "{\n\t.reg .b32 remote;\n\t"
        "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t}"
        : : "r"(addr), "r"(rank) : "memory");
  }

  Barrier* full_;
  Barrier* empty_;
  bool asks_ = true;
};

// The throttle between a CTA's mainloop loads and its scheduler warp, kept inside the CTA.
template <int Stages_>
class LocalThrottle : public cutlass::PipelineAsync<Stages_> {
  using Base = cutlass::PipelineAsync<Stages_>;

 public:
  using typename Base::Params;
  using typename Base::SharedStorage;
  CUTLASS_DEVICE LocalThrottle(SharedStorage& storage, Params params) : Base(storage, local(params)) {}

 private:
  CUTLASS_DEVICE static Params local(Params p) {
    p.dst_blockid = cute::block_rank_in_cluster();
    return p;
  }
};

class DynamicTileScheduler : public GroupedTileScheduler {
  using Base = GroupedTileScheduler;

 public:
  static constexpr bool IsDynamicPersistent = true;
  static constexpr int Stages = 4;
  using WorkTileInfo = Base::WorkTileInfo;
  using RasterOrder = Base::RasterOrder;
  using RasterOrderOptions = Base::RasterOrderOptions;
  struct CLCResponse {      // one answer: a unit of work w, or kNoTile (the kernel takes its size for a
    uint32_t w;             // transaction byte count that this scheduler's pipeline does not use)
  };
  static constexpr uint32_t kNoTile = 0xffffffffu;
  using Pipeline = ResponsePipeline<Stages>;
  using ThrottlePipeline = LocalThrottle<Stages>;

  // data_ first: the scheduler finds the full barriers from the data pointer the kernel gives it
  class SharedStorage {
   public:
    CUTLASS_DEVICE typename Pipeline::SharedStorage& pipeline() { return pipeline_; }
    CUTLASS_DEVICE typename ThrottlePipeline::SharedStorage& throttle_pipeline() { return throttle_; }
    CUTLASS_DEVICE CLCResponse* data() { return data_; }

    alignas(16) CLCResponse data_[Stages];
    alignas(16) typename Pipeline::SharedStorage pipeline_;
    alignas(16) typename ThrottlePipeline::SharedStorage throttle_;
  };

  struct Arguments : Base::Arguments {
    uint32_t* counter = nullptr;     // zero before the first launch; each launch leaves it zero
  };

  struct Params : Base::Params {
    uint32_t* counter = nullptr;
    uint32_t clusters = 0;           // the tiles of the (padded) grid, in clusters
    uint32_t shift = 0;              // log2 of the cluster's size: tile w is linear index w << shift
  };

  CUTLASS_DEVICE explicit DynamicTileScheduler(Params const& params)
      : Base(params), counter_(params.counter), clusters_(params.clusters), shift_(params.shift) {
#if defined(__CUDA_ARCH__)
    uint32_t const ctas = gridDim.x * gridDim.y * gridDim.z;
    grid_clusters_ = ctas >> shift_;
    auto [m, n, l] = cute::block_id_in_cluster();
    bool const along_n = params.raster_order_ == RasterOrder::AlongN;
    cta_major_ = uint32_t(along_n ? n : m);
    minor_shift_ = params.divmod_cluster_shape_minor_.shift_right;   // FastDivmodU64Pow2: the logarithm
    // the static scheduler's first index: this cluster's first tile
    uint64_t const first = along_n ? uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x)
                                   : uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    w_ = uint32_t(first >> shift_);
    if (counter_ != nullptr && grid_clusters_ > clusters_) counter_ = nullptr;   // static answers
#endif
  }

  CUTLASS_DEVICE void set_data_ptr(CLCResponse* data) { data_ = data; }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) { return work(w_); }

  // The scheduler warp: the next tile's answer into slot `state` of every CTA (the asking CTA only).
  CUTLASS_DEVICE typename Pipeline::PipelineState advance_to_next_work(Pipeline& pipeline,
                                                                       typename Pipeline::PipelineState state) {
    if (dynamic_detail::asks()) {
      pipeline.producer_acquire(state);
      uint32_t next = kNoTile;
      if (cutlass::canonical_lane_idx() == 0) {
        if (counter_ != nullptr) {
          if (!waited_) {
            // a programmatic dependent: the kernel before it may still be using the counter
            cutlass::arch::wait_on_dependent_grids();
            waited_ = true;
          }
          next = grid_clusters_ + atomicInc(counter_, clusters_ - 1);   // wraps to 0 after clusters_ increments
        } else {
          next = w_ + grid_clusters_;      // the static order: this warp has read every answer so far
        }
        if (next >= clusters_) next = kNoTile;
      }
      next = __shfl_sync(0xffffffffu, next, 0);
      send(pipeline, state, next);
    }
    ++state;
    return state;
  }

  CUTLASS_DEVICE void store_invalid_response(typename Pipeline::PipelineState state) {
    // the kernel acquired the slot (a no-op outside the asking CTA); its commit is a no-op
    if (dynamic_detail::asks()) send(full_barriers(), state, kNoTile);
  }

  // Every warp: its next tile, from the slot `state` (then released).
  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo, TileSchedulerPipeline& pipeline, TileSchedulerPipelineState state) {
    pipeline.consumer_wait(state);
    uint32_t w;
    uint32_t const addr = cute::cast_smem_ptr_to_uint(&data_[state.index()]);
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w) : "r"(addr) : "memory");
    pipeline.consumer_release(state);
    w_ = w;
    return cute::make_tuple(w == kNoTile ? WorkTileInfo::invalid_work_tile() : work(w), true);
  }

  // The cooperative kernel's call for a warp group idle on a split tile (stream-K's): not reached here,
  // where every warp group works on every tile
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work) { return cute::make_tuple(work, true); }

  // Tile w's linear index in CUTLASS's order for the CTA `cta_major` places along the cluster's major
  // (walked) side: CUTLASS's index runs along the cluster's minor side first (whose place the decode
  // reads from the CTA's own coordinates), then its major side, then from cluster to cluster.
  CUTLASS_HOST_DEVICE static uint64_t linear_index(uint32_t w, uint32_t shift, uint32_t cta_major, uint32_t minor_shift) {
    return (uint64_t(w) << shift) | (uint64_t(cta_major) << minor_shift);
  }

  // Only a hint (when to let a programmatic dependent launch): true once fewer tiles than clusters remain
  // after this one.
  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo const&, uint32_t = 1) const {
    return w_ == kNoTile || w_ + grid_clusters_ >= clusters_;
  }

  template <class ProblemShapeMNKL, class TileShape, class ClusterShape>
  static Params to_underlying_arguments(ProblemShapeMNKL problem, TileShape tile, ClusterShape cluster,
                                        cutlass::KernelHardwareInfo const& hw_info, Arguments const& args,
                                        void* workspace = nullptr, const uint32_t epilogue_subtiles = 1,
                                        uint32_t accumulators = 1u) {
    Params params;
    static_cast<Base::Params&>(params) =
        Base::to_underlying_arguments(problem, tile, cluster, hw_info, args, workspace, epilogue_subtiles, accumulators);
    // log2 of the cluster's size (a power of two; FastDivmod's shift_right is not the logarithm)
    uint32_t const size = uint32_t(cute::size(cluster));
    params.shift = 0;
    while ((1u << params.shift) < size) ++params.shift;
    params.clusters = uint32_t(params.blocks_per_problem_ >> params.shift);
    params.counter = params.fast && params.blocks_per_problem_ < (uint64_t(1) << 31) ? args.counter : nullptr;
    return params;
  }

 private:
  CUTLASS_DEVICE WorkTileInfo work(uint32_t w) const {
    if (w >= clusters_) return WorkTileInfo::invalid_work_tile();
    return Base::get_current_work_for_linear_idx(linear_index(w, shift_, cta_major_, minor_shift_));
  }

  // Lane r stores the answer into CTA r's slot and publishes it on CTA r's full barrier.
  template <class Publisher>
  CUTLASS_DEVICE void send(Publisher&& pipeline, typename Pipeline::PipelineState state, uint32_t w) {
    uint32_t const lane = cutlass::canonical_lane_idx();
    if (lane < dynamic_detail::cluster_size()) {
      uint32_t const slot = cute::cast_smem_ptr_to_uint(&data_[state.index()]);
      asm volatile(
          "{\n\t.reg .b32 remote;\n\t"
          "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
          "st.shared::cluster.u32 [remote], %2;\n\t}"
          : : "r"(slot), "r"(lane), "r"(w) : "memory");
      pipeline.publish(state, lane);
    }
  }

  // The pipeline's publish() where the kernel does not pass the pipeline (its terminal response):
  // the same barriers, found from the storage that data_ begins
  struct FullBarriers {
    typename Pipeline::Barrier* full;
    CUTLASS_DEVICE void publish(typename Pipeline::PipelineState state, uint32_t rank) {
      uint32_t const addr = cute::cast_smem_ptr_to_uint(&full[state.index()]);
      asm volatile(
          "{\n\t.reg .b32 remote;\n\t"
          "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
          "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t}"
          : : "r"(addr), "r"(rank) : "memory");
    }
  };

  CUTLASS_DEVICE FullBarriers full_barriers() const {
    return {reinterpret_cast<SharedStorage*>(data_)->pipeline_.full_barrier_};
  }

  uint32_t* counter_ = nullptr;
  uint32_t clusters_ = 0, shift_ = 0, grid_clusters_ = 1, cta_major_ = 0, minor_shift_ = 0;
  uint32_t w_ = 0;
  bool waited_ = false;
  CLCResponse* data_ = nullptr;
};

}  // namespace epic_scheduler

namespace cutlass::gemm::kernel::detail {
template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<epic_scheduler::DynamicPersistentScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = epic_scheduler::DynamicTileScheduler;
};
}  // namespace cutlass::gemm::kernel::detail
