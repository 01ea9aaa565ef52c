"""Reverse mode over one gemm's epilogue: from the cotangents of its stored values to those of its
leaves (the accumulator and the tensors it loads), each primitive's `vjp` rule applied in reverse
topological order.

The backward kernel recomputes the forward's tile-local values (it runs the same gemm again); a
row or column statistic is not tile-local, so the forward stores it and the backward loads it
(`Primal`). Cotangents keep their broadcast shape where that is exact (a column-vector cotangent of a
tile means the same value along the row) and are summed back where an operand was broadcast
(`unbroadcast`: a row vector's gradient is the column sum of its tile cotangent).
"""
from __future__ import annotations

from typing import Callable

from ..diagnostics import error
from ..dtypes import BOOL, F32, DType
from ..ir import primitives as P
from ..ir.core import GemmKernel, Value, make
from ..shapes import Kind, Shape
from .builder import RuleBuilder


def is_statistic(v: Value) -> bool:
    """A value the backward cannot recompute inside one tile: the forward saves it. (A block
    statistic is tile-local: recomputed.)"""
    return P.family(v.op) is P.Family.REDUCE


class Primal:
    """The forward values of one kernel as the backward kernel sees them: tile-local values are
    recomputed (the same Value objects where nothing below them changes), statistics are loads of
    the tensors `saved_name(v)` names. Which statistics were asked for is `used`."""

    def __init__(self, kernel: GemmKernel, saved_name: Callable[[Value], str], rebase: tuple | None = None,
                 inline: DType | None = None):
        """rebase: (rows, n, the saved accumulator's load, tensors) to build the values in another gemm
        (pattern D: the gemm producing the incoming gradient), whose tile is [rows, n]. inline: the
        statistics are computed here, not loaded (the gradient computed in the forward, policy "fused"),
        from the accumulator rounded to this dtype (what a row combine kernel reads back)."""
        self.kernel = kernel
        self.rebase = rebase
        self.inline = inline
        self.inlined: set[int] = set()        # ids of the statistics computed in place
        self._saved_name = saved_name
        self._memo: dict[int, Value] = {}
        self.used: dict[str, Value] = {}      # saved tensor name -> the forward statistic

    def __call__(self, v: Value) -> Value:
        if v.id in self._memo:
            return self._memo[v.id]
        # operands first, without recursion (epilogues can be deep)
        stack = [v]
        while stack:
            top = stack[-1]
            if top.id in self._memo:
                stack.pop()
                continue
            pending = [a for a in top.args if a.id not in self._memo] \
                if self.inline is not None or not is_statistic(top) else []
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self._memo[top.id] = self._build(top)
        return self._memo[v.id]

    def _build(self, v: Value) -> Value:
        k = self.kernel
        if self.inline is not None and P.is_accumulator(v.op):
            return make("cast", (v,), {"to": self.inline}, v.span)
        if is_statistic(v) and self.inline is None:
            name = self._saved_name(v)
            self.used[name] = v
            shape = v.shape if self.rebase is None else shape_in(v.shape.dims(k.rows, k.n), *self.rebase[:2])
            return make("load", (), {"tensor": name, "dtype": F32, "shape": shape}, v.span, name)
        if self.rebase is not None:
            rows, n, acc, tensors = self.rebase
            if P.is_accumulator(v.op):
                return acc
            if P.is_load(v):
                return make("load", (), dict(v.attrs, shape=shape_in(tensors[v.attrs["tensor"]].dims, rows, n)),
                            v.span, v.name)
        args = tuple(self._memo[a.id] for a in v.args)
        out = v if all(x is a for x, a in zip(args, v.args)) else make(v.op, args, v.attrs, v.span, v.name)
        if is_statistic(v):
            self.inlined.add(out.id)
        return out


def shape_in(dims: tuple, rows, n) -> Shape:
    """The shape a tensor of these dims has when loaded by a gemm with accumulator [rows, n]."""
    if not dims:
        return Shape(Kind.SCALAR)
    if len(dims) == 1:
        return Shape(Kind.COL) if dims[0] == rows else Shape(Kind.ROW, dims[0].ratio(n))
    return Shape(Kind.TILE, dims[1].ratio(n))


def unbroadcast(c: Value, target: Value) -> Value:
    """The cotangent c of a value that `target` was broadcast into, summed back to target's shape."""
    want, have = target.kind, c.kind
    if have is want or have is Kind.SCALAR or want is Kind.TILE:
        return c
    span = target.span
    if have is Kind.TILE and want is Kind.BLOCK:
        return make("block_reduce", (c,), {"fn": "sum", "block": target.shape.block}, span)
    if have is Kind.TILE and want is Kind.COL:
        return make("reduce", (c,), {"axis": "row", "fn": "sum"}, span)
    if have is Kind.TILE and want is Kind.ROW:
        return make("reduce", (c,), {"axis": "col", "fn": "sum"}, span)
    if want is Kind.SCALAR and have in (Kind.TILE, Kind.COL, Kind.ROW):
        if have is Kind.TILE:
            c = make("reduce", (c,), {"axis": "row", "fn": "sum"}, span)
        return make("reduce", (c,), {"axis": "col" if c.kind is Kind.COL else "row", "fn": "sum"}, span)
    raise error("E903", f"the gradient of a {target.shape.describe()} that meets a {c.shape.describe()} is not "
                "derived yet", span, "keep it out of --wrt")


def _differentiable(v: Value) -> bool:
    return v.dtype is not BOOL and not v.dtype.is_int


def backprop(kernel: GemmKernel, seeds: dict[int, Value], primal: Primal, straight_through: bool,
             leaves: set[int]) -> dict[int, Value]:
    """Cotangents of the kernel's values given those of some of them (seeds), flowing only towards
    `leaves` (the accumulator and the loads whose gradients are wanted); the caller reads theirs."""
    live = set(leaves)
    for v in kernel.values:
        if any(a.id in live for a in v.args):
            live.add(v.id)
    cot: dict[int, Value] = dict(seeds)
    for v in reversed(kernel.values):
        g = cot.get(v.id)
        if g is None or not v.args or v.id not in live or not _differentiable(v):
            continue
        p = P.prim(v.op)
        if p.vjp is None:
            raise error("E903", f"'{v.op}' has no derivative rule", v.span)
        contributions = p.vjp(RuleBuilder(v, primal, kernel, straight_through), g)
        for a, c in zip(v.args, contributions):
            if c is None or a.id not in live or not _differentiable(a):
                continue
            c = unbroadcast(c, a)
            cot[a.id] = c if a.id not in cot else _sum(cot[a.id], c, v)
    return cot


def _sum(a: Value, b: Value, at: Value) -> Value:
    """a + b; interleave(x, 0) + interleave(0, y) (the cotangents of even(h) and odd(h)) is interleave(x, y)."""
    pair = P.prim(a.op).family is P.Family.PAIR and P.prim(b.op).family is P.Family.PAIR and \
        len(a.args) == len(b.args) == 2
    if pair and _zero(a.args[1]) and _zero(b.args[0]):
        return make(a.op, (a.args[0], b.args[1]), {}, at.span)
    if pair and _zero(a.args[0]) and _zero(b.args[1]):
        return make(a.op, (b.args[0], a.args[1]), {}, at.span)
    return make("add", (a, b), {}, at.span)


def _zero(v: Value) -> bool:
    return P.is_literal(v) and float(v.attrs["value"]) == 0.0


def as_tile(c: Value, like: Shape) -> Value:
    """A cotangent stored as a tile: a broadcast one (a column vector, a block value, a scalar) is
    spread over the columns by adding 0 * col (exact: col is a small integer)."""
    if c.kind is Kind.TILE:
        return c
    zero = make("mul", (make("const", (), {"value": 0, "dtype": P.I32}), make("col_index", (), {})), {})
    out = make("add", (c, zero), {})
    if out.kind is not Kind.TILE or out.shape.width != like.width:
        raise error("E903", f"a {c.shape.describe()} gradient of a {like.describe()} is not derived yet", c.span)
    return out
