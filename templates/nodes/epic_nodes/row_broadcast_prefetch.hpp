// epic_nodes::Sm90RowBroadcastPrefetch<Stages, EpilogueTile, CtaTileShapeMNK, Element>: a leaf that
// yields, for each fragment element, ptr[col] as float: a row vector (one value per column, the same
// down every row: a bias, RMSNorm's gamma). Columns past N read 0.
//
//   using NodeBias = epic_nodes::Sm90RowBroadcastPrefetch<LoadDesc::Stages, typename LoadDesc::EpilogueTile,
//                                                         TileShape, cutlass::bfloat16_t>;
//   // Arguments: {ptr}
//
// Why not CUTLASS's Sm90RowBroadcast: its consumer warps copy the tile's slice from global memory into
// shared memory when the epilogue starts and then wait on a barrier, one exposed global round trip
// per tile; with one tile per CTA (decode sizes) nothing hides it. Here the epilogue's producer warp
// copies each subtile's slice with a bulk async copy (cp.async.bulk) into the epilogue load
// pipeline's stage, the way Sm90AuxLoad issues its TMA loads, so the slice has landed long before the
// mainloop ends; the consumer reads it from shared memory after its usual wait on that stage.
//
// A bulk copy needs a 16-byte aligned source and a multiple of 16 bytes: the vector's base (epic
// refuses tensors that are not 16-byte aligned) and N * sizeof(Element) % 16 == 0, checked on the host.
// Otherwise, and with Stages == 0 (aux_load=direct), the consumer reads global memory into registers
// when it starts each subtile.
#pragma once

#include "epic_nodes/detail.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"

namespace epic_nodes {

template <int Stages, class EpilogueTile, class CtaTileShapeMNK, class Element>
struct Sm90RowBroadcastPrefetch {
  static constexpr int EpiN = int(cute::size<1>(EpilogueTile{}));
  static constexpr int kBuffers = Stages > 0 ? Stages : 1;
  static_assert(EpiN * int(sizeof(Element)) % 16 == 0, "a subtile's slice must be a multiple of 16 bytes");

  struct SharedStorage {
    alignas(128) Element smem[kBuffers][Stages > 0 ? EpiN : 1];
  };
  struct Arguments {
    Element const* ptr = nullptr;
  };
  struct Params {
    Element const* ptr = nullptr;
    bool bulk = false;      // the producer copies the slices (else the consumer reads global memory)
  };

  template <class ProblemShape>
  static constexpr Params
  to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto n = int64_t(cute::get<1>(problem_shape));
    bool aligned = reinterpret_cast<uintptr_t>(args.ptr) % 16 == 0 && n * int64_t(sizeof(Element)) % 16 == 0;
    return {args.ptr, Stages > 0 && aligned};
  }

  template <class ProblemShape>
  static bool
  can_implement(ProblemShape const&, Arguments const& args) { return args.ptr != nullptr; }

  template <class ProblemShape>
  static size_t
  get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }

  template <class ProblemShape>
  static cutlass::Status
  initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                       cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90RowBroadcastPrefetch() {}
  CUTLASS_HOST_DEVICE Sm90RowBroadcastPrefetch(Params const& params, SharedStorage const& shared)
      : params(params), smem(const_cast<Element*>(&shared.smem[0][0])) {}

  Params params;
  Element* smem = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return params.bulk; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  // The producer warp: one bulk copy per subtile, of the columns of it that lie inside N, completing
  // on the stage's mbarrier (whose expected byte count it raises first, as Sm90AuxLoad does).
  struct ProducerLoadCallbacks : cutlass::epilogue::fusion::EmptyProducerLoadCallbacks {
    Element const* ptr;
    Element* smem;
    int tile_n0;   // the tile's first column
    int N;
    bool bulk;

    CUTLASS_DEVICE
    ProducerLoadCallbacks(Element const* ptr, Element* smem, int tile_n0, int N, bool bulk)
        : ptr(ptr), smem(smem), tile_n0(tile_n0), N(N), bulk(bulk) {}

    CUTLASS_DEVICE void
    step(uint64_t* full_mbarrier_ptr, int, int epi_n, int load_iteration, bool issue_tma_load) {
      if (!bulk || !issue_tma_load) {
        return;
      }
      int col = tile_n0 + epi_n * EpiN;
      int count = N - col < EpiN ? N - col : EpiN;
      if (count <= 0) {             // a subtile wholly past N: nothing to copy, nothing to expect
        return;
      }
      uint32_t bytes = uint32_t(count) * uint32_t(sizeof(Element));
      cutlass::arch::ClusterTransactionBarrier::expect_transaction(full_mbarrier_ptr, bytes);
      cute::SM90_BULK_COPY_G2S::copy(ptr + col, full_mbarrier_ptr, smem + (load_iteration % kBuffers) * EpiN,
                                     int32_t(bytes));
    }
  };

  template <class... Args>
  CUTLASS_DEVICE auto
  get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const& args) {
    using namespace cute;
    int tile_n0 = int(get<1>(args.tile_coord_mnkl)) * int(size<1>(CtaTileShapeMNK{}));
    return ProducerLoadCallbacks(params.ptr, smem, tile_n0, int(get<1>(args.problem_shape_mnkl)), params.bulk);
  }

  // The consumer: a subtile's values into registers once, when it starts (previsit runs after the
  // wait on the load stage), then visit hands them out.
  template <class CoordTensor, int kElems>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(CoordTensor tCcD, int base, int tile_n0, int N, Element const* smem, Params const& params)
        : tCcD(tCcD), base(base), tile_n0(tile_n0), N(N), smem(smem), params(params) {}

    CoordTensor tCcD;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to this thread's first element
    int base;          // absolute column of this thread's first element
    int tile_n0;
    int N;
    Element const* smem;
    Params const& params;
    float values[kElems];

    CUTLASS_DEVICE void
    previsit(int epi_m, int epi_n, int load_iteration, bool) {
      using namespace cute;
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      int const sub0 = tile_n0 + epi_n * EpiN;
      Element const* stage = smem + (load_iteration % kBuffers) * EpiN;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kElems; ++i) {
        int col = base + int(get<1>(tCcD_mn(i)));
        bool inside = col < N;
        if (params.bulk) {
          values[i] = inside ? float(stage[col - sub0]) : 0.f;   // col - sub0 in [0, EpiN)
        } else {
          values[i] = inside ? float(params.ptr[col]) : 0.f;
        }
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      cutlass::Array<float, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        out[i] = values[epi_v * FragmentSize + i];
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    using CoordTensor = decltype(args.tCcD);
    constexpr int kElems = int(decltype(size(take<0,3>(shape(args.tCcD))))::value);
    int base = int(get<1>(args.problem_shape_mnkl)) - int(get<1>(args.residue_tCcD));
    int tile_n0 = int(get<1>(args.tile_coord_mnkl)) * int(size<1>(CtaTileShapeMNK{}));
    return ConsumerStoreCallbacks<CoordTensor, kElems>(args.tCcD, base, tile_n0, int(get<1>(args.problem_shape_mnkl)),
                                                       smem, params);
  }
};

} // namespace epic_nodes
