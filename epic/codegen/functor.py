"""Element-wise IR expressions -> C++ bodies of Sm90Compute functors and combine kernels.

A functor receives each input as cutlass::Array<float, FragmentSize> and walks the fragment in
column pairs (2k, 2k+1) -- adjacent output columns of one row on Hopper (pinned by a GPU test) --
so pairwise maps (even/odd/interleave) stay in registers. A full-width value is two C variables
per pair (`_0` even column, `_1` odd column); a half-width value (after even/odd) is one.
"""
from __future__ import annotations

import math

from .. import dtypes
from ..diagnostics import Diagnostic, EpicError
from ..ir.core import Value
from ..shapes import Kind

_BINARY = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
           "min": "fminf({a}, {b})", "max": "fmaxf({a}, {b})",
           "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
           "gt": "({a} > {b})", "ge": "({a} >= {b})"}
_UNARY = {"neg": "(-{x})", "abs": "fabsf({x})", "exp": "__expf({x})", "log": "logf({x})", "sqrt": "sqrtf({x})",
          "rsqrt": "rsqrtf({x})", "tanh": "epic_tanh({x})", "erf": "erff({x})", "round": "rintf({x})",
          "sin": "epic_sin({x})", "cos": "epic_cos({x})"}

# Device helpers, each printed into a generated file only when its code calls it (so that
# adding one does not change, and rebuild, every cached kernel).
HELPERS = {
    "epic_reduce_2pi": r"""
// sin/cos of large angles (RoPE: position * frequency): Cody-Waite reduction by 2*pi, then the fast
// intrinsic; absolute error ~1e-7 for |x| < 1e5, far below bf16 output precision.
__device__ __forceinline__ float epic_reduce_2pi(float x) {
  float k = rintf(x * 0.15915494309189535f);
  x = fmaf(-k, 6.28318548202514648f, x);
  return fmaf(-k, -1.7484556e-07f, x);
}""",
    "epic_sin": r"""
__device__ __forceinline__ float epic_sin(float x) { return __sinf(epic_reduce_2pi(x)); }""",
    "epic_cos": r"""
__device__ __forceinline__ float epic_cos(float x) { return __cosf(epic_reduce_2pi(x)); }""",
    "epic_tanh": r"""
// tanh from one fast exponential: 1 - 2 / (exp(2|x|) + 1) keeps ~1e-7 absolute error near +-1 (so
// 1 + tanh(x) stays accurate in GELU's tail, unlike tanh.approx), and a short series near 0.
__device__ __forceinline__ float epic_tanh(float x) {
  float a = fabsf(x);
  float t = a < 0.004f ? a * (1.f - a * a * (1.f / 3.f)) : 1.f - 2.f / (__expf(2.f * a) + 1.f);
  return copysignf(t, x);
}""",
}
_NEEDS = {"epic_sin": ["epic_reduce_2pi"], "epic_cos": ["epic_reduce_2pi"]}


def helpers_for(code: str) -> str:
    """The helper definitions `code` calls, in dependency order."""
    used = [name for name in HELPERS if name + "(" in code]
    for name in list(used):
        used = _NEEDS.get(name, []) + used
    return "".join(HELPERS[name] for name in dict.fromkeys(n for n in HELPERS if n in used))


def unsupported(message: str, span=None, hint: str | None = None) -> EpicError:
    return EpicError(Diagnostic("E702", message, span, hint))


def literal(x: float) -> str:
    """An exact C++ float literal (hex float, so no digits are lost)."""
    x = float(x)
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    if math.isnan(x):
        return "NAN"
    return f"{float.hex(x)}f" if x != int(x) or abs(x) >= 2**24 else f"{int(x)}.0f"


# the 16/8-bit float types as CUTLASS (in gemm kernels) and as CUDA's headers (in combine kernels) name them
_FLOAT_TYPES = {"cutlass": {"bf16": "cutlass::bfloat16_t", "f16": "cutlass::half_t", "e4m3": "cutlass::float_e4m3_t",
                            "e5m2": "cutlass::float_e5m2_t"},
                "cuda": {"bf16": "__nv_bfloat16", "f16": "__half", "e4m3": "__nv_fp8_e4m3", "e5m2": "__nv_fp8_e5m2"}}


def cast_expr(x: str, dt: dtypes.DType, flavor: str = "cutlass") -> str:
    """Round a float to dtype dt and back, with the language's semantics (saturating fp8/int)."""
    if dt is dtypes.F32:
        return x
    if dt.name in ("bf16", "f16"):
        return f"float({_FLOAT_TYPES[flavor][dt.name]}({x}))"
    if dt in (dtypes.E4M3, dtypes.E5M2):
        t = _FLOAT_TYPES[flavor][dt.name]
        return f"float({t}(fminf(fmaxf({x}, {literal(dt.min_finite)}), {literal(dt.max_finite)})))"
    if dt.is_int:
        return f"fminf(fmaxf(rintf({x}), {literal(dt.min_finite)}), {literal(dt.max_finite)})"
    raise unsupported(f"cast to {dt}")


def store_expr(x: str, dt: dtypes.DType) -> str:
    """The value a store of dtype dt must hold, in float, before the node converts it (the
    converter then rounds to nearest; for fp8/int the clamp here makes it saturate)."""
    if dt.max_finite is not None:
        if dt.is_int:
            return f"fminf(fmaxf(rintf({x}), {literal(dt.min_finite)}), {literal(dt.max_finite)})"
        return f"fminf(fmaxf({x}, {literal(dt.min_finite)}), {literal(dt.max_finite)})"
    return x


class ExprWriter:
    """Writes straight-line C++ for the values of one expression DAG.

    `inputs` maps IR values to C expressions giving their element(s): for a pairwise functor a
    callable (value, half) -> expression of column 2k+half; for combine kernels a plain string.
    """

    def __init__(self, pairwise: bool, flavor: str = "cutlass", fast: bool = False):
        self.pairwise = pairwise
        self.flavor = flavor
        self.fast = fast      # results only feed a store of <= 8 mantissa bits: fast division is exact enough
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

    def _parts(self, v: Value) -> tuple[str, ...]:
        return self.names[v.id]

    def _width(self, v: Value) -> int:
        """How many C variables carry v per column pair: 2 if it has a value per column, else 1."""
        if not self.pairwise:
            return 1
        return 1 if v.shape.has_columns and v.shape.width.denominator == 2 else 2

    def emit(self, v: Value) -> tuple[str, ...]:
        if v.id in self.names:
            return self.names[v.id]
        for a in v.args:
            self.emit(a)
        op = v.op
        if op == "const":
            out = (literal(v.attrs["value"]),) * self._width(v)
        elif op in _UNARY or op == "powi":
            out = tuple(self._new(self._unary(v, x)) for x in self._spread(v.args[0], v))
        elif op in _BINARY:
            a, b = (self._spread(x, v) for x in v.args)
            form = "__fdividef({a}, {b})" if op == "div" and self.fast else _BINARY[op]
            out = tuple(self._new(form.format(a=x, b=y), op in ("eq", "ne", "lt", "le", "gt", "ge"))
                        for x, y in zip(a, b))
        elif op == "select":
            c, a, b = (self._spread(x, v) for x in v.args)
            out = tuple(self._new(f"({x} ? {y} : {z})") for x, y, z in zip(c, a, b))
        elif op == "cast":
            out = tuple(self._new(cast_expr(x, v.attrs["to"], self.flavor)) for x in self._spread(v.args[0], v))
        elif op in ("even", "odd"):
            parts = self._parts(v.args[0])
            out = (parts[0 if op == "even" else 1],) if len(parts) == 2 else parts
        elif op == "interleave":
            a, b = (self._parts(x) for x in v.args)
            if len(a) != 1 or len(b) != 1:
                raise unsupported("interleave of full-width values", v.span)
            out = (a[0], b[0])
        else:
            raise unsupported(f"'{op}' inside an element-wise expression", v.span)
        self.names[v.id] = out
        return out

    def _spread(self, x: Value, like: Value) -> tuple[str, ...]:
        """x's variables repeated to the width of `like` (constants and row-constant values repeat)."""
        parts = self._parts(x)
        n = self._width(like)
        if len(parts) == n:
            return parts
        if len(parts) == 1:
            return parts * n
        if x.kind in (Kind.COL, Kind.SCALAR):   # same value at both columns of a pair
            return parts[:1] * n
        raise unsupported("mixing values of different widths", like.span)

    def _unary(self, v: Value, x: str) -> str:
        if v.op == "powi":
            p = v.attrs["exp"]
            if p == 0:
                return "1.0f"
            prod = " * ".join([x] * abs(p))
            return f"({prod})" if p > 0 else f"(1.0f / ({prod}))"
        return _UNARY[v.op].format(x=x)


# Stores whose precision (at most 8 mantissa bits) is far coarser than fast division's 2 ulp error.
FAST_STORES = ("bf16", "e4m3", "e5m2", "i8", "i4")


def is_costly(v: Value) -> bool:
    """Ops worth computing once and sharing between outputs rather than recomputing."""
    return v.op in ("exp", "log", "tanh", "erf", "sin", "cos", "div", "sqrt", "rsqrt")

