// epic custom sm90 EVT nodes: the scalar arithmetic of the nodes (not a node itself).
//
// Plain functions of floats, free of cute and CUTLASS types, called by the node headers on each
// fragment element or register slot. The host simulator (tests/hostsim/hostsim.hpp) compiles this
// file with g++ and its emulations of the nodes call these same functions, so the CPU suite runs the
// arithmetic the GPU runs: a wrong line here fails a CPU test. Under nvcc the functions are device
// functions, inlined, as when they were written inline in the nodes; under a host compiler they are
// plain inline functions (the host simulator supplies __expf, __fdiv_rn and __float2int_rn).
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

#if defined(__CUDACC__)
#define EPIC_ARITH __forceinline__ __device__
#define EPIC_ARITH_HD __forceinline__ __host__ __device__
#else
#define EPIC_ARITH inline
#define EPIC_ARITH_HD inline
#endif

namespace epic_nodes {
namespace detail {

// ---- online log-sum-exp (Sm90RowLsePartial): a state (max, sum of exp(x - max)), stored as one value

// Factor that rescales a running sum when its max moves from old_max to new_max: 1 when it did not
// move (so -inf to -inf never computes -inf - -inf).
EPIC_ARITH float
lse_rescale(float old_max, float new_max) {
  return (old_max == new_max) ? 1.f : __expf(old_max - new_max);
}

// What a row's terms are taken against: its max, or 0 while the max is still -inf (every element
// so far masked). One test per row, none per element: with it a masked (-inf) element's term
// exp(-inf - pivot) is 0 whatever the max is, and an all-masked row never computes -inf - -inf.
EPIC_ARITH float
lse_pivot(float max) {
  return (max == -INFINITY) ? 0.f : max;
}

// One element's term against its row's pivot (lse_pivot of the row's max): exp(x - pivot).
EPIC_ARITH float
lse_term(float x, float pivot) {
  return __expf(x - pivot);
}

// Online log-sum-exp merge of (m1, s1) and (m2, s2): m = max, s = s1*exp(m1-m) + s2*exp(m2-m).
// A side whose max equals the merged max keeps its sum unscaled, so -inf with -inf gives (-inf, 0)
// (no -inf - -inf). Symmetric bit for bit: merge(a, b) == merge(b, a).
EPIC_ARITH void
lse_merge(float& m1, float& s1, float m2, float s2) {
  float m = fmaxf(m1, m2);
  float a = (m1 == m) ? s1 : s1 * __expf(m1 - m);
  float b = (m2 == m) ? s2 : s2 * __expf(m2 - m);
  m1 = m;
  s1 = a + b;
}

// The log-sum-exp of a state: m + log(s); -inf for an empty one (m = -inf, s = 0).
EPIC_ARITH float
lse_value(float m, float s) {
  return (m == -INFINITY) ? -INFINITY : m + logf(s);
}

// ---- 1 x Block quantization (Sm90BlockScale) and scaling (Sm90BlockReduceScale)

// Smallest power of two >= s, exactly (bit manipulation, no log2f/exp2f rounding): what
// exp2f(ceilf(log2f(s))) means mathematically. 0, negative, inf and NaN pass through.
EPIC_ARITH_HD float
pow2_ceil(float s) {
  uint32_t bits;
  memcpy(&bits, &s, 4);
  uint32_t e = (bits >> 23) & 0xffu;
  uint32_t mant = bits & 0x7fffffu;
  if ((bits >> 31) || e == 0xffu || bits == 0) {
    return s;
  }
  if (e == 0) {  // subnormal: 2^ceil(log2(mant)) * 2^-149
    int p = 0;
    while ((1u << p) < mant) { ++p; }
    int exp2 = p - 149;
    if (exp2 >= -126) { bits = uint32_t(exp2 + 127) << 23; }
    else              { bits = 1u << p; }
  } else if (mant != 0) {
    bits = (e + 1) << 23;  // e == 0xfe rounds up to +inf
  }
  memcpy(&s, &bits, 4);
  return s;
}

// A segment's running amax with one more element (an element outside the problem adds 0).
EPIC_ARITH float
amax_fold(float amax, float x, bool valid) {
  return fmaxf(amax, valid ? fabsf(x) : 0.f);
}

// The scale of a segment: max(amax, floor) / qmax (IEEE division), rounded up to a power of two if Pow2.
template <bool Pow2>
EPIC_ARITH float
block_scale_of(float amax, float floor, float qmax) {
  float s = __fdiv_rn(fmaxf(amax, floor), qmax);
  return Pow2 ? pow2_ceil(s) : s;
}

// Whether q may be x * (1 / s) for this scale instead of x / s: bit-exact for a power of two whose
// reciprocal is a normal float; for float outputs close enough (see block_scale.hpp); integer outputs
// of other scales divide. A thread multiplies only if all its slots may.
template <bool Pow2, bool IntegerOut>
EPIC_ARITH bool
use_reciprocal(float s) {
  return (Pow2 || !IntegerOut) && (!Pow2 || (s >= 0x1p-126f && s <= 0x1p126f));
}

EPIC_ARITH float
reciprocal(float s) {
  return 1.f / s;
}

// clamp to [lo, hi]; integers round half to even and take NaN to 0, floats keep NaN. Written as
// selects: an early return for NaN may compile to a branch per element.
EPIC_ARITH float
saturate(float q, float lo, float hi, bool integer) {
  float c = fminf(fmaxf(q, lo), hi);     // NaN -> lo (fmaxf returns the number)
  if (integer) {
    c = rintf(c);
  }
  return q != q ? (integer ? 0.f : q) : c;
}

// q of one element: by the reciprocal (rcp = 1 / s) or by the IEEE division x / s.
EPIC_ARITH float
quantize_rcp(float x, float rcp, float lo, float hi, bool integer) {
  return saturate(x * rcp, lo, hi, integer);
}
EPIC_ARITH float
quantize_div(float x, float s, float lo, float hi, bool integer) {
  return saturate(__fdiv_rn(x, s), lo, hi, integer);
}

// y scaled by a segment's statistic s: y * s, or the IEEE division y / s.
template <bool Divide>
EPIC_ARITH float
apply_scale(float y, float s) {
  return Divide ? __fdiv_rn(y, s) : y * s;
}

// ---- per-head vectors (Sm90PeriodicRowBroadcast)

// Where a tile of tile_n columns starting at column tile_n0 reads a vector repeated every `period`
// columns, if none of its columns wraps: tile_n0 % period, and column tile_n0 + d reads index start + d.
// -1 when the tile crosses a period's end (the general path, periodic_index, then).
EPIC_ARITH int
periodic_tile_start(int tile_n0, int tile_n, int period) {
  int start = tile_n0 % period;
  return start + tile_n <= period ? start : -1;
}

// The index into a vector repeated every `period` columns of column ref + distance, given ref_mod =
// ref % period and |distance| < period: one conditional add or subtract (selects, no division).
EPIC_ARITH int
periodic_index(int ref_mod, int distance, int period) {
  int at = ref_mod + distance;
  at += at < 0 ? period : 0;
  at -= at >= period ? period : 0;
  return at;
}

// ---- packed int4 (Sm90PackedInt4Store, Sm90BlockScale's Output 1)

// Two integer-valued floats as one byte: round to nearest even, two's complement nibbles, low nibble
// = the even column; a value outside [-8, 7] keeps only its low 4 bits.
EPIC_ARITH uint8_t
pack_int4(float even, float odd) {
  uint32_t lo = uint32_t(__float2int_rn(even)) & 0xfu;
  uint32_t hi = uint32_t(__float2int_rn(odd)) & 0xfu;
  return uint8_t(lo | (hi << 4));
}

} // namespace detail
} // namespace epic_nodes
