"""What a primitive's derivative rule (`vjp` in epic/ir/primitives.py) builds its cotangents with.

A rule sees the forward value being differentiated (`b.v`), its operands and result as the backward
kernel recomputes them (`b.x(i)`, `b.y`: a forward row statistic is a load of the tensor the forward
saved, everything tile-local is recomputed) and the cotangent g of the result. `None` stands for a
zero cotangent everywhere, so rules need not build `0 * x`.
"""
from __future__ import annotations

from typing import Callable

from ..diagnostics import error
from ..dtypes import F32
from ..ir import primitives as P
from ..ir.core import Value, const, make
from ..shapes import Kind

# casts whose derivative is taken as the identity, as torch's .to() does: rounding to these keeps the value
# up to a relative 2**-8 and never saturates below f16's 65504
SMOOTH_CASTS = ("f32", "bf16", "f16")


class RuleBuilder:
    def __init__(self, v: Value, primal: Callable[[Value], Value], kernel, straight_through: bool):
        self.v = v
        self._primal = primal
        self.kernel = kernel
        self.straight_through = straight_through

    # ---- the forward values, as the backward recomputes or loads them
    def x(self, i: int) -> Value:
        return self._primal(self.v.args[i])

    @property
    def y(self) -> Value:
        return self._primal(self.v)

    # ---- building
    def op(self, name: str, *args: Value, **attrs) -> Value:
        return make(name, args, attrs, self.v.span)

    def c(self, number: float) -> Value:
        return const(float(number), F32, self.v.span)

    def add(self, a: Value, b: Value) -> Value:
        return self.op("add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return self.op("sub", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.op("mul", a, b)

    def div(self, a: Value, b: Value) -> Value:
        return self.op("div", a, b)

    def neg(self, a: Value) -> Value:
        return self.op("neg", a)

    def cmp(self, name: str, a: Value, b: Value) -> Value:
        return self.op(name, a, b)

    def where(self, cond: Value, a: Value | None, b: Value | None = None) -> Value:
        """select(cond, a, b) with None as zero."""
        return self.op("select", cond, a if a is not None else self.c(0.0), b if b is not None else self.c(0.0))

    # ---- pieces of rules that need to know more than one record
    def reduction_vjp(self, g: Value) -> Value:
        return P.reduction(self.v.attrs["fn"]).vjp(self, g)

    def reduced_width(self) -> Value:
        """How many elements a row or column reduction of this value's operand reduces (mean's divisor)."""
        x = self.v.args[0]
        k = self.kernel
        if self.v.attrs["axis"] == "row":
            width = x.shape.dims(k.rows, k.n)[-1] if x.kind in (Kind.TILE, Kind.ROW) else None
        else:
            width = k.rows if x.kind in (Kind.TILE, Kind.COL) else None
        if width is None:
            raise error("E903", f"the derivative of {self.v.attrs['axis']}_mean of a {x.shape.describe()} is not "
                        "derived yet", self.v.span)
        return self.op("dim", dim=width)

    def through_rounding(self, g: Value) -> Value:
        """A cast's derivative: the identity for f32/bf16/f16 (torch's .to()); a quantizing cast (fp8,
        integers, e8m0, e2m1) has none, unless straight-through is asked for."""
        to = self.v.attrs["to"]
        if to.name in SMOOTH_CASTS or self.straight_through:
            return g
        raise not_differentiable(self.v, f"the cast to {to}")


def not_differentiable(v: Value, what: str):
    return error("E901", f"{what} has no derivative: a gradient would have to flow through it", v.span,
                 "leave the inputs before it out of --wrt, or pass straight_through=True (--straight-through) to "
                 "take its derivative as 1")
