"""Element-wise IR expressions -> C++ bodies of Sm90Compute functors and combine kernels.

The C++ of each primitive comes from its record (epic/ir/primitives.py); this module only walks the
expression DAG. A functor receives each input as cutlass::Array<float, FragmentSize> and walks the
fragment in column pairs (2k, 2k+1) -- adjacent output columns of one row on Hopper (pinned by a GPU
test) -- so pairwise maps (even/odd/interleave) stay in registers. A full-width value is two C
variables per pair (`_0` even column, `_1` odd column); a half-width value (after even/odd) is one.
"""
from __future__ import annotations

from .. import dtypes
from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import Value
from ..shapes import Kind
from .cxx import literal

# Families whose values a functor computes (everything else is a node of its own: a leaf or a sink).
FUNCTOR_FAMILIES = (P.Family.ELEMENTWISE, P.Family.COMPARE, P.Family.SELECT, P.Family.CAST, P.Family.PAIR)

# Helpers of code generation itself (not of a primitive): moving 16-bit values in and out of the
# 32-bit and 8-bit containers that width-changing loads and stores use (codegen/nodes/packed.py).
# A float container holds the bits of two 16-bit values (low half = even column); bf16 -> f32 is
# the bits shifted up, so unpacking is exact.
CODEGEN_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "epic_sat": (r"""
// saturating stores and casts (docs/LANGUAGE.md): fp8 clamps to its finite range and keeps NaN;
// integers round half to even, clamp, and take NaN to 0 (as cvt.rni.sat does)
__device__ __forceinline__ float epic_sat(float x, float lo, float hi) { return x != x ? x : fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ float epic_sat_int(float x, float lo, float hi) {
  return x != x ? 0.f : fminf(fmaxf(rintf(x), lo), hi);
}""", ()),
    "epic_e8m0": (r"""
// e8m0 (docs/LANGUAGE.md): |x| rounded up to a power of two in [2^-127, 2^127], NaN kept -- what
// __nv_fp8_e8m0 (cvt.rp.satfinite) stores; written out so that kernels and the host agree bit for bit
__device__ __forceinline__ float epic_e8m0(float x) {
  uint32_t u = epic_bits(x) & 0x7fffffffu;
  if (u > 0x7f800000u) return x;
  if (u <= 0x00400000u) return epic_from_bits(0x00400000u);
  uint32_t e = (u >> 23) + ((u & 0x7fffffu) != 0u);
  return epic_from_bits((e < 254u ? e : 254u) << 23);
}""", ("epic_bits",)),
    "epic_e2m1": (r"""
// e2m1 (docs/LANGUAGE.md): the 4-bit code (sign << 3 | magnitude code) of x rounded to nearest even,
// saturated to +-6, NaN -> +6 (as __nv_cvt_float_to_fp4); and the value of that code
__device__ __forceinline__ uint32_t epic_e2m1_bits(float x) {
  if (x != x) return 7u;
  float a = fabsf(x);
  uint32_t c = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
             : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.f ? 6u : 7u;
  return ((epic_bits(x) >> 28) & 8u) | c;
}
__device__ __forceinline__ float epic_e2m1_code(float x) { return float(epic_e2m1_bits(x)); }
__device__ __forceinline__ float epic_e2m1(float x) {
  uint32_t c = epic_e2m1_bits(x), a = c & 7u;
  float m = a < 2u ? 0.5f * float(a) : float(1u << ((a >> 1) - 1u)) * (1.f + 0.5f * float(a & 1u));
  return (c & 8u) ? -m : m;
}""", ("epic_bits",)),
    "epic_bits": (r"""
__device__ __forceinline__ uint32_t epic_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float epic_from_bits(uint32_t u) { return __uint_as_float(u); }""", ()),
    "epic_bf16_lo": (r"""
__device__ __forceinline__ float epic_bf16_lo(float c) { return epic_from_bits(epic_bits(c) << 16); }
__device__ __forceinline__ float epic_bf16_hi(float c) { return epic_from_bits(epic_bits(c) & 0xffff0000u); }""",
                     ("epic_bits",)),
    "epic_f16_lo": (r"""
__device__ __forceinline__ float epic_f16_lo(float c) { return float(cutlass::half_t::bitcast(uint16_t(epic_bits(c) & 0xffffu))); }
__device__ __forceinline__ float epic_f16_hi(float c) { return float(cutlass::half_t::bitcast(uint16_t(epic_bits(c) >> 16))); }""",
                    ("epic_bits",)),
    "epic_pack2": (r"""
// two 16-bit values (rounded to T) as the bits of one float: lo = the even column
template <class T> __device__ __forceinline__ float epic_pack2(float lo, float hi) {
  return epic_from_bits(uint32_t(T(lo).raw()) | (uint32_t(T(hi).raw()) << 16));
}""", ("epic_bits",)),
    "epic_byte": (r"""
// byte `which` (0 = low) of a value rounded to the 16-bit type T, as a float 0..255 (exact in uint8)
template <class T> __device__ __forceinline__ float epic_byte(float v, int which) {
  return float((uint32_t(T(v).raw()) >> (8 * which)) & 0xffu);
}
// half-word `which` of a float's bits, as a float 0..65535 (exact in uint16)
__device__ __forceinline__ float epic_half_word(float v, int which) {
  return float((epic_bits(v) >> (16 * which)) & 0xffffu);
}""", ("epic_bits",)),
}


def helpers_for(code: str) -> str:
    """The device helper definitions that `code` calls (the records' cxx_helpers,
    epic/ir/primitives.py, and code generation's own), each after the helpers it needs."""
    table = {**P.HELPERS, **CODEGEN_HELPERS}
    aliases = {"epic_bf16_hi": "epic_bf16_lo", "epic_f16_hi": "epic_f16_lo", "epic_from_bits": "epic_bits",
               "epic_half_word": "epic_byte", "epic_sat_int": "epic_sat", "epic_e2m1_code": "epic_e2m1"}
    order: list[str] = []

    def need(name: str) -> None:
        if name not in order:
            for dep in table[name][1]:
                need(dep)
            order.append(name)

    for name in [*table, *aliases]:
        if name + "(" in code or name + "<" in code:
            need(aliases.get(name, name))
    return "".join(table[name][0] for name in order)


def _type(dt: dtypes.DType, flavor: str) -> str:
    return dt.cutlass if flavor == "cutlass" else dt.cuda


def cast_expr(x: str, dt: dtypes.DType, flavor: str = "cutlass") -> str:
    """Round a float to dtype dt and back, with the language's semantics (saturating fp8/int)."""
    if dt is dtypes.F32:
        return x
    if dt in (dtypes.E8M0, dtypes.E2M1):
        return f"epic_{dt.name}({x})"
    if dt.is_int or dt.max_finite is None:
        return store_expr(x, dt) if dt.is_int else f"float({_type(dt, flavor)}({x}))"
    return f"float({_type(dt, flavor)}({store_expr(x, dt)}))"


def store_expr(x: str, dt: dtypes.DType) -> str:
    """The value a store of dtype dt must hold, in float, before the node converts it (the
    converter then rounds to nearest): integers round half to even and saturate, NaN becomes 0;
    fp8 saturates and keeps NaN; e8m0 is the power of two it holds, e2m1 its 4-bit code (the packed
    store's nibble)."""
    if dt is dtypes.E8M0:
        return f"epic_e8m0({x})"
    if dt is dtypes.E2M1:
        return f"epic_e2m1_code({x})"
    if dt.max_finite is None:
        return x
    lo, hi = literal(dt.min_finite), literal(dt.max_finite)
    if dt.is_int:
        return f"epic_sat_int({x}, {lo}, {hi})"
    return f"epic_sat({x}, {lo}, {hi})"


# Stores whose precision (at most 8 mantissa bits) is far coarser than fast division's 2 ulp error.
FAST_STORES = (dtypes.BF16, dtypes.E4M3, dtypes.E5M2, dtypes.I8, dtypes.I4, dtypes.E2M1)


class ExprWriter:
    """Writes straight-line C++ for the values of one expression DAG.

    Leaves are bound to C expressions first (`bind`); `emit` then writes every other value from
    its primitive's C++. In a pairwise functor a value is a tuple of variables, one per column of
    the pair it has; in combine kernels a single variable.
    """

    def __init__(self, pairwise: bool, flavor: str = "cutlass", fast: bool = False):
        self.pairwise = pairwise
        self.flavor = flavor
        self.fast = fast
        self.lines: list[str] = []
        self.names: dict[int, tuple[str, ...]] = {}
        self.count = 0

    def bind(self, v: Value, exprs: tuple[str, ...]) -> None:
        self.names[v.id] = exprs

    def _new(self, expr: str, boolean: bool = False) -> str:
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"{'bool' if boolean else 'float'} {name} = {expr};")
        return name

    def _width(self, v: Value) -> int:
        """How many C variables carry v per column pair of the accumulator: one per column it has
        there (1 after even/odd, 2 at the accumulator's width, 4 after interleave); 1 for values
        constant along the row."""
        if not self.pairwise or not v.shape.has_columns:
            return 1
        n = v.shape.width * 2
        if n.denominator != 1:
            raise error("E702", f"a value {v.shape.width} times as wide as the accumulator is not supported by "
                        "code generation yet", v.span)
        return int(n)

    def emit(self, root: Value) -> tuple[str, ...]:
        """Write root and every operand not yet written (operands first, without recursion)."""
        stack = [(root, False)]
        while stack:
            v, ready = stack.pop()
            if v.id in self.names:
                continue
            if not ready:
                stack.append((v, True))
                stack.extend((a, False) for a in v.args if a.id not in self.names)
                continue
            self.names[v.id] = self._one(v)
        return self.names[root.id]

    def _one(self, v: Value) -> tuple[str, ...]:
        p = P.prim(v.op)
        if P.is_literal(v):
            return (literal(v.attrs["value"]),) * self._width(v)
        if p.family is P.Family.CAST:
            return tuple(self._new(cast_expr(x, v.attrs["to"], self.flavor)) for x in self._spread(v.args[0], v))
        if p.family is P.Family.PAIR:
            return self._pair(v, p)
        if p.family not in FUNCTOR_FAMILIES or p.cxx is None:
            raise error("E702", f"'{v.op}' cannot be computed inside an element-wise expression", v.span)
        form = p.cxx_fast if self.fast and p.cxx_fast else p.cxx
        operands = list(zip(*(self._spread(a, v) for a in v.args)))
        boolean = p.family is P.Family.COMPARE
        if callable(form):
            return tuple(self._new(form(list(xs), v.attrs), boolean) for xs in operands)
        return tuple(self._new(form.format(*xs), boolean) for xs in operands)

    def _pair(self, v: Value, p: P.Primitive) -> tuple[str, ...]:
        if p.pair_part is not None:
            parts = self.names[v.args[0].id]
            if len(parts) < 2:
                raise error("E702", "a pairwise map of a value narrower than the accumulator's column pairs "
                            "is not supported by code generation yet", v.span)
            return parts[p.pair_part::2]
        n = max(len(self.names[x.id]) for x in v.args)
        a, b = (self._spread_to(x, n, v) for x in v.args)
        return tuple(x for pair in zip(a, b) for x in pair)

    def _spread(self, x: Value, like: Value) -> tuple[str, ...]:
        """x's variables repeated to the width of `like` (constants and row-constant values repeat)."""
        return self._spread_to(x, self._width(like), like)

    def _spread_to(self, x: Value, n: int, like: Value) -> tuple[str, ...]:
        parts = self.names[x.id]
        if len(parts) == n:
            return parts
        if len(parts) == 1:
            return parts * n
        if x.kind in (Kind.COL, Kind.SCALAR):   # same value at both columns of a pair
            return parts[:1] * n
        raise error("E702", "mixing values of different widths in one expression", like.span)


def is_costly(v: Value) -> bool:
    """Worth computing once and sharing between outputs rather than recomputing."""
    return P.prim(v.op).costly
