// epic custom sm90 EVT nodes: the exchange of split blocks' halves between a 1x2 cluster's two CTAs
// (a tile half a block wide), for the segment nodes (block_scale.hpp, block_reduce_scale.hpp). Not a
// node itself; the kernel's mainloop must be epic_mainloop::PairSlots (pair_slots_mainloop.hpp).
#pragma once

#include <cstdint>
#include "cute/arch/cluster_sm90.hpp"
#include "epic_nodes/detail.hpp"

namespace epic_nodes {
namespace detail {

// Split segments: merges the other CTA's half of each (row, segment) statistic into fStat (already
// merged over the row's lanes), through distributed shared memory. The lane that owns a slot stores
// this half's value into the other CTA's word for its row -- the value's bits with the tile's tag above
// them, one 64-bit store, so a reader sees both or neither -- then polls its own CTA's word until the
// other half's tag is there. Both sides merge (left, right) in that order, so both hold the same bits;
// the other lanes of the row get the result through merge_row_lanes, holding `identity` meanwhile. No
// exchange for a right half that lies past N, none for rows past M (whose results are not stored).
// Needs both CTAs of a pair resident and on their tiles together, which a 1x2 cluster guarantees.
//
// The words (pair_words): 2 x TileM at the start of each CTA's shared memory, zeroed before the cluster
// starts (epic_mainloop::PairSlots), [consumer warp group][row of the tile]. Pingpong's two warp groups
// take turns on the epilogue, so a CTA's consecutive tiles use alternate words, and a CTA writes a
// word again (two tiles later) only after it has read the other CTA's half of the tile in between,
// which the other CTA stored after reading the word this write replaces: no value is overwritten
// unread. The tag (the tile's row block and segment, numbered from 1) tells this tile's value from a
// stale one of two tiles before. Through L2 (global words, the previous form) the same exchange cost
// a round trip to L2 and back (bench/results/2026-12-03-h200-ncu-decode-exchange-64.txt).
CUTLASS_DEVICE uint64_t* pair_words() {
  extern __shared__ __align__(16) char epic_dynamic_smem[];   // the kernel's dynamic shared memory
  return reinterpret_cast<uint64_t*>(epic_dynamic_smem);
}

CUTLASS_DEVICE void publish_half(uint64_t* local_word, uint32_t peer_rank, uint32_t tag, float value) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote) : "r"(cute::cast_smem_ptr_to_uint(local_word)), "r"(peer_rank));
  uint64_t w = (uint64_t(tag) << 32) | uint64_t(__float_as_uint(value));
  asm volatile("st.relaxed.cluster.shared::cluster.b64 [%0], %1;" :: "r"(remote), "l"(w) : "memory");
}

CUTLASS_DEVICE uint64_t read_half(uint64_t const* word) {
  uint64_t w;
  asm volatile("ld.acquire.cluster.shared::cta.b64 %0, [%1];" : "=l"(w) : "r"(cute::cast_smem_ptr_to_uint(word)) : "memory");
  return w;
}

// w: the word's first read. Polls until the other side's half of this tile (its tag) is there, returns
// the value. The other CTA stores within a tile's time; 2^24 polls (a second or more) mean the pairing
// broke (a bug in epic): the kernel stops with an error (cudaErrorLaunchFailure) instead of hanging.
CUTLASS_DEVICE float take_half(uint64_t const* word, uint64_t w, uint32_t tag) {
  for (uint32_t polls = 0; uint32_t(w >> 32) != tag; ++polls) {
    if (polls == (1u << 24)) {
      __trap();
    }
    w = read_half(word);
  }
  return __uint_as_float(uint32_t(w));
}

template <int Block, int TileM, int TileN, class Segs, class FSeg, class FStat, class Merge>
CUTLASS_DEVICE void
exchange_halves(Segs const& seg, FSeg const& fSeg, FStat&& fStat, float identity, Merge const& merge) {
  constexpr int RowLanes = decltype(size<1>(seg.lane_layout))::value;
  constexpr int Slots = decltype(size(fStat))::value;
  // pingpong: consumer warp groups 1 and 2 (0 is the producer's)
  uint64_t* words = pair_words() + (cutlass::canonical_warp_group_idx() == 2 ? TileM : 0);
  uint32_t const peer = cute::block_rank_in_cluster() ^ 1u;
  uint64_t const segments = uint64_t((seg.N + Block - 1) / Block);
  auto row_of = [&](int s) -> int {     // the slot's row in the tile, or -1: no exchange
    int code = int(fSeg(s));
    int m = seg.m0 + code % TileM;
    int g = seg.g0 + code / TileM;
    bool owned = s % RowLanes == seg.lane_n;
    return owned && m < seg.M && g * Block + TileN < seg.N ? code % TileM : -1;
  };
  // the tile's row block and segment (the two CTAs' tiles share both), never 0
  uint32_t const tag = uint32_t((uint64_t(seg.m0 / TileM) * segments + uint64_t(seg.g0)) % 0xffffffffull) + 1u;
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < Slots; ++s) {             // every owned half out first,
    if (int row = row_of(s); row >= 0) {
      publish_half(words + row, peer, tag, fStat(s));
    }
  }
  uint64_t first[Slots];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < Slots; ++s) {             // then every other half read at once,
    int row = row_of(s);
    first[s] = row >= 0 ? read_half(words + row) : 0;
  }
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < Slots; ++s) {             // then each waited for where it was not there yet
    if (int row = row_of(s); row >= 0) {
      float half = take_half(words + row, first[s], tag);
      fStat(s) = seg.right ? merge(half, fStat(s)) : merge(fStat(s), half);
    } else if (s % RowLanes != seg.lane_n) {
      fStat(s) = identity;
    }
  }
  merge_row_lanes(seg.lane_layout, fStat, merge);
}

}  // namespace detail
}  // namespace epic_nodes
