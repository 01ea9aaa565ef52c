"""Symbolic dimensions and the shape kinds a value can have inside one GEMM epilogue.

A dimension is a monomial `coef * name1 * name2 ...` (coef a Fraction): enough for `D`, `2*F`,
`N/2` and literal sizes. It stays symbolic here; epic/sizes.py gives it a value at given sizes. Inside a GEMM whose accumulator is [M, N], every value has a kind:

  TILE   [M, w*N]   one element per output element (w = 1, or 1/2 and 2 after pairwise maps)
  ROW    [w*N]      a row vector: one value per column, broadcast down the rows (bias, gamma)
  COL    [M]        a column vector: one value per row, broadcast along the row (row scale, label)
  BLOCK  [M, w*N/B] one value per 1xB block of a row (quantization scales)
  SCALAR []         one value (a literal, a runtime argument, a dimension size)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Dim:
    coef: Fraction
    names: tuple[str, ...] = ()

    @staticmethod
    def of(name: str) -> "Dim":
        return Dim(Fraction(1), (name,))

    @staticmethod
    def const(n: int | Fraction) -> "Dim":
        return Dim(Fraction(n), ())

    def __mul__(self, other: "Dim | int | Fraction") -> "Dim":
        if not isinstance(other, Dim):
            return Dim(self.coef * Fraction(other), self.names)
        return Dim(self.coef * other.coef, tuple(sorted(self.names + other.names)))

    def __truediv__(self, other: "Dim | int | Fraction") -> "Dim":
        if isinstance(other, Dim):
            if other.names:
                raise ValueError("division by a named dimension")
            other = other.coef
        return Dim(self.coef / Fraction(other), self.names)

    def ratio(self, other: "Dim") -> Fraction | None:
        """self / other when both name the same symbols, else None."""
        if self.names != other.names or other.coef == 0:
            return None
        return self.coef / other.coef

    def __str__(self) -> str:
        parts = list(self.names)
        c = self.coef
        if c.denominator != 1:
            num = "*".join(([str(c.numerator)] if c.numerator != 1 else []) + parts) or "1"
            return f"{num}/{c.denominator}"
        if c != 1 or not parts:
            parts.insert(0, str(c.numerator))
        return "*".join(parts)


class Kind(enum.Enum):
    TILE = "tile"
    ROW = "row"
    COL = "col"
    BLOCK = "block"
    SCALAR = "scalar"
    PARTIAL = "partial"   # per-tile partial results of a reduction (made by the split-reductions pass)


@dataclass(frozen=True)
class Shape:
    kind: Kind
    width: Fraction = Fraction(1)   # in units of the kernel's N (TILE, ROW, BLOCK)
    block: int | None = None        # BLOCK only

    @property
    def has_columns(self) -> bool:
        return self.kind in (Kind.TILE, Kind.ROW, Kind.BLOCK)

    @property
    def has_rows(self) -> bool:
        return self.kind in (Kind.TILE, Kind.COL, Kind.BLOCK)

    def dims(self, rows: Dim, n: Dim) -> tuple[Dim, ...]:
        """The tensor dimensions this value has when stored, for a kernel of N = n."""
        if self.kind is Kind.SCALAR:
            return ()
        if self.kind is Kind.COL:
            return (rows,)
        w = n * self.width
        if self.kind is Kind.ROW:
            return (w,)
        if self.kind is Kind.BLOCK:
            return (rows, w / self.block)
        return (rows, w)

    def describe(self, rows: Dim | None = None, n: Dim | None = None) -> str:
        names = {Kind.TILE: "tile", Kind.ROW: "row vector", Kind.COL: "column vector",
                 Kind.BLOCK: f"block value (1x{self.block})", Kind.SCALAR: "scalar",
                 Kind.PARTIAL: "per-tile partials"}
        s = names[self.kind]
        if rows is not None and n is not None and self.kind is not Kind.SCALAR:
            s += " [" + ", ".join(str(d) for d in self.dims(rows, n)) + "]"
        return s


SCALAR = Shape(Kind.SCALAR, Fraction(0))
COL = Shape(Kind.COL, Fraction(0))
TILE = Shape(Kind.TILE)
ROW = Shape(Kind.ROW)


def broadcast(a: Shape, b: Shape) -> Shape | str:
    """Shape of an element-wise op on a and b, or a string saying why they do not combine."""
    if a.kind is Kind.SCALAR:
        return b
    if b.kind is Kind.SCALAR:
        return a
    if a.has_columns and b.has_columns and a.width != b.width:
        return f"widths differ ({_w(a.width)} vs {_w(b.width)} of N)"
    if a.kind is Kind.BLOCK and b.kind is Kind.BLOCK and a.block != b.block:
        return f"block sizes differ ({a.block} vs {b.block})"
    kinds = {a.kind, b.kind}
    width = a.width if a.has_columns else b.width
    if kinds == {Kind.COL}:
        return COL
    if kinds == {Kind.ROW}:
        return Shape(Kind.ROW, width)
    if kinds <= {Kind.BLOCK, Kind.COL}:
        blk = a if a.kind is Kind.BLOCK else b
        return Shape(Kind.BLOCK, blk.width, blk.block)
    return Shape(Kind.TILE, width)


def _w(w: Fraction) -> str:
    return str(w) if w.denominator != 1 else str(w.numerator)
