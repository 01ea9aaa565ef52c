"""The typed IR: a DAG of Values per GEMM kernel, tensors with symbolic shapes, and the program.

Values are immutable once built; passes build new kernels (see epic/passes). Every value knows
its dtype, its shape kind (tile/row/col/block/scalar), its producer op and operands, and the
source span that created it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from ..diagnostics import Span
from ..dtypes import F32, DType
from ..shapes import Dim, Kind, Shape
from .typing import infer

_ids = itertools.count()


class Value:
    __slots__ = ("op", "args", "attrs", "dtype", "shape", "span", "name", "id", "origin")

    def __init__(self, op: str, args: tuple["Value", ...], attrs: dict, dtype: DType, shape: Shape,
                 span: Span | None = None, name: str | None = None, origin: int | None = None):
        self.op = op
        self.args = tuple(args)
        self.attrs = dict(attrs)
        self.dtype = dtype
        self.shape = shape
        self.span = span
        self.name = name
        self.id = next(_ids)
        self.origin = origin   # which inlined call made it (values of one call form one op of the source)

    @property
    def kind(self) -> Kind:
        return self.shape.kind

    def key(self) -> tuple:
        """Structural identity, for common-subexpression elimination."""
        return (self.op, tuple(a.id for a in self.args), _freeze(self.attrs), self.dtype.name, self.shape)

    def __repr__(self) -> str:
        return f"Value(%{self.id} {self.op} {self.shape.kind.value} {self.dtype})"


def _freeze(attrs: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in attrs.items()))


def make(op: str, args: tuple = (), attrs: dict | None = None, span: Span | None = None, name: str | None = None,
         origin: int | None = None) -> Value:
    """The typed constructor every stage builds values with: the primitive's type rule decides the
    dtype and shape (raises primitives.TypeRuleError when the operands do not fit)."""
    attrs = dict(attrs or {})
    dtype, shape = infer(op, tuple(args), attrs)
    return Value(op, tuple(args), attrs, dtype, shape, span, name, origin)


def const(value: float | int, dtype: DType = F32, span: Span | None = None, name: str | None = None,
          origin: int | None = None) -> Value:
    return make("const", (), {"value": value, "dtype": dtype}, span, name, origin)


@dataclass
class Tensor:
    """A global tensor: a program input, a runtime scalar, or something a kernel stores."""
    name: str
    dtype: DType
    dims: tuple[Dim, ...]
    role: str                     # input | scalar | out | tmp | buffer, derived (made by passes)
    span: Span | None = None
    default: float | None = None  # scalars only
    producer: str | None = None   # kernel that stores it
    layout: str = "row"           # row-major, or "kmajor" for GEMM B operands ([K, N] with K contiguous);
                                  # how a gemm reads it (.T, A or B): epic/ir/operands.py
    block: int | None = None      # tensors of BLOCK values: the block size
    tiles_axis: str | None = None # per-tile partials: "n" -> [dims[0], tiles along N], "m" -> [tiles along M, dims[0]]
    # role "derived" (made by passes, computed from weights before the kernels run): (vectors, matrix),
    # the f32 row vector (product of the input row vectors; none: ones) @ matrix
    derived: tuple[tuple[str, ...], str] | None = None

    @property
    def is_scalar(self) -> bool:
        return not self.dims

    def describe(self) -> str:
        if not self.dims:
            return str(self.dtype)
        if self.tiles_axis:    # sizes depend on the tile configuration chosen by the plan
            rows, width = self.dims
            dims = [str(rows), f"ceil({width}/tile_n)"] if self.tiles_axis == "n" else \
                [f"ceil({rows}/tile_m)", str(width)]
            return f"{self.dtype}[{', '.join(dims)}]"
        return f"{self.dtype}[{', '.join(str(d) for d in self.dims)}]"


@dataclass
class Store:
    tensor: str
    value: Value
    span: Span | None = None


@dataclass
class GemmKernel:
    name: str
    a: str                        # tensor names of the operands
    b: str
    rows: Dim                     # M
    k: Dim
    n: Dim
    values: list[Value]           # topological order
    stores: list[Store]
    options: dict = field(default_factory=dict)
    span: Span | None = None
    kind: str = "gemm"
    acc: DType = F32              # the accumulator: f32; i32 for i8 x i8; f16 with `accumulate=f16`
    a_t: bool = False             # the operand is the transpose of tensor `a` (written `a.T`)
    b_t: bool = False             # likewise for `b`

    def users(self) -> dict[int, list[Value]]:
        out: dict[int, list[Value]] = {v.id: [] for v in self.values}
        for v in self.values:
            for a in v.args:
                out.setdefault(a.id, []).append(v)
        return out

    def with_values(self, values: list[Value], stores: list[Store]) -> "GemmKernel":
        return replace(self, values=values, stores=stores)


@dataclass
class CombineKernel:
    """Finishes whole-row (axis "row") or whole-column reductions of a gemm from per-tile partials,
    then computes the vector math that follows them. One thread per row (or column)."""
    name: str
    source: str                   # the gemm whose partials it reads
    axis: str
    rows: Dim
    n: Dim
    values: list[Value]
    stores: list[Store]
    kind: str = "combine"
    span: Span | None = None
    options: dict = field(default_factory=dict)

    def users(self) -> dict[int, list[Value]]:
        return GemmKernel.users(self)

    def with_values(self, values: list[Value], stores: list[Store]) -> "CombineKernel":
        return replace(self, values=values, stores=stores)


@dataclass
class TailKernel(CombineKernel):
    """A gemm's whole epilogue run after it, one CTA per row (a configuration's combine=tail, made at
    plan time by epic/plan/tail.py): its values read the gemm's stored accumulator back as a tile,
    reduce whole rows in place of per-tile partials, and compute the row combine kernel's math.
    `source`: the gemm whose accumulator it reads; `axis`: "row"."""
    kind: str = "tail"


@dataclass
class Program:
    name: str
    tensors: dict[str, Tensor]
    kernels: list                 # GemmKernel, and CombineKernel after the split pass (TailKernel in a plan)
    dims: list[str]

    def inputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role in ("input", "scalar")]

    def outputs(self) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role == "out"]

    def kernel(self, name: str):
        return next(k for k in self.kernels if k.name == name)

    def replace_kernels(self, kernels: list, tensors: dict[str, Tensor] | None = None) -> "Program":
        return Program(self.name, dict(tensors if tensors is not None else self.tensors), list(kernels),
                       list(self.dims))


def topo_order(roots: list[Value]) -> list[Value]:
    """Values reachable from roots, operands before users, in a stable order."""
    seen: dict[int, Value] = {}
    order: list[Value] = []
    stack: list[tuple[Value, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        v, expanded = stack.pop()
        if expanded:
            if v.id not in seen:
                seen[v.id] = v
                order.append(v)
            continue
        if v.id in seen:
            continue
        stack.append((v, True))
        for a in reversed(v.args):
            if a.id not in seen:
                stack.append((a, False))
    return order

