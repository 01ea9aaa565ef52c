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

def helpers_for(code: str) -> str:
    """The device helper definitions (records' cxx_helpers, epic/ir/primitives.py) that `code` calls,
    each after the helpers it needs."""
    order: list[str] = []

    def need(name: str) -> None:
        if name not in order:
            for dep in P.HELPERS[name][1]:
                need(dep)
            order.append(name)

    for name in P.HELPERS:
        if name + "(" in code:
            need(name)
    return "".join(P.HELPERS[name][0] for name in order)


def _type(dt: dtypes.DType, flavor: str) -> str:
    return dt.cutlass if flavor == "cutlass" else dt.cuda


def cast_expr(x: str, dt: dtypes.DType, flavor: str = "cutlass") -> str:
    """Round a float to dtype dt and back, with the language's semantics (saturating fp8/int)."""
    if dt is dtypes.F32:
        return x
    if dt.is_int:
        return f"fminf(fmaxf(rintf({x}), {literal(dt.min_finite)}), {literal(dt.max_finite)})"
    if dt.max_finite is not None:
        return f"float({_type(dt, flavor)}(fminf(fmaxf({x}, {literal(dt.min_finite)}), {literal(dt.max_finite)})))"
    return f"float({_type(dt, flavor)}({x}))"


def store_expr(x: str, dt: dtypes.DType) -> str:
    """The value a store of dtype dt must hold, in float, before the node converts it (the
    converter then rounds to nearest; for fp8/int the clamp here makes it saturate)."""
    if dt.max_finite is not None:
        if dt.is_int:
            return f"fminf(fmaxf(rintf({x}), {literal(dt.min_finite)}), {literal(dt.max_finite)})"
        return f"fminf(fmaxf({x}, {literal(dt.min_finite)}), {literal(dt.max_finite)})"
    return x


# Stores whose precision (at most 8 mantissa bits) is far coarser than fast division's 2 ulp error.
FAST_STORES = (dtypes.BF16, dtypes.E4M3, dtypes.E5M2, dtypes.I8, dtypes.I4)


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
        """How many C variables carry v per column pair: 2 if it has a value per column, else 1."""
        if not self.pairwise:
            return 1
        return 1 if v.shape.has_columns and v.shape.width.denominator == 2 else 2

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
            return (parts[p.pair_part],) if len(parts) == 2 else parts
        a, b = (self.names[x.id] for x in v.args)
        if len(a) != 1 or len(b) != 1:
            raise error("E702", "interleave of full-width values (a tile twice as wide as the accumulator) is "
                        "not supported by code generation yet", v.span)
        return (a[0], b[0])

    def _spread(self, x: Value, like: Value) -> tuple[str, ...]:
        """x's variables repeated to the width of `like` (constants and row-constant values repeat)."""
        parts = self.names[x.id]
        n = self._width(like)
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
