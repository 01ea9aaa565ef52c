"""Syntax tree of a .epi file: what the parser saw, with source spans, before any meaning."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import Span


# ---- expressions
@dataclass
class Num:
    text: str
    span: Span

    @property
    def value(self) -> float:
        return float(self.text)

    @property
    def is_int(self) -> bool:
        return self.text.isdigit()


@dataclass
class Name:
    id: str
    span: Span


@dataclass
class Call:
    func: str
    args: list
    kwargs: dict[str, object]
    span: Span
    kwarg_spans: dict[str, Span] = field(default_factory=dict)


@dataclass
class BinOp:
    op: str          # the primitive: add sub mul div eq ne lt le gt ge
    lhs: object
    rhs: object
    span: Span


@dataclass
class Pow:
    base: object
    exponent: object  # an integer literal (checked when lowered)
    span: Span


@dataclass
class Neg:
    operand: object
    span: Span


Expr = Num | Name | Call | BinOp | Pow | Neg


# ---- types and dimensions
@dataclass
class DimAtom:
    text: str          # a name or an integer
    span: Span


@dataclass
class DimExpr:
    first: DimAtom
    rest: list[tuple[str, DimAtom]]   # ("*" | "/", atom)
    span: Span


@dataclass
class TypeSpec:
    dtype: str
    dims: list[DimExpr] | None
    span: Span
    dtype_span: Span


# ---- statements
@dataclass
class Let:
    name: str
    expr: Expr
    span: Span


@dataclass
class Store:
    role: str          # "out" (returned to the caller) | "tmp" (read by a later GEMM only)
    name: str
    type: TypeSpec
    expr: Expr
    span: Span


@dataclass
class InDecl:
    name: str
    type: TypeSpec
    default: float | None
    span: Span


@dataclass
class Operand:
    name: str
    type: TypeSpec | None
    span: Span
    transposed: bool = False    # written `name.T`


@dataclass
class Gemm:
    name: str
    a: Operand
    b: Operand
    options: dict[str, tuple[str, Span]]
    body: list
    span: Span


# what a definition's parameter may be declared as (`def row_pick(x, label: col)`)
PARAM_KINDS = ("tile", "row", "col", "scalar", "block")


@dataclass
class Param:
    name: str
    default: Expr | None
    span: Span
    kind: str | None = None     # one of PARAM_KINDS: the argument must have that shape kind


@dataclass
class Def:
    name: str
    params: list[Param]
    lets: list[Let]
    result: Expr
    span: Span


@dataclass
class Use:
    path: str
    span: Span


@dataclass
class Module:
    source: object
    items: list
