"""A stored tile as a sum of terms, for deferring LayerNorm-like row statistics (defer_row_scale).

t = a(row) * T + sum_j b_j(row) * R_j + c_j * R_j, where a and b_j are row-constant values that
need a row reduction (computed by the row combine kernel), T is tile-local and R_j is a product of
input row vectors (none: a row of ones). Then
    t @ W = a * (T @ W) + sum_j b_j (x) (R_j @ W) + c_j * (R_j @ W)
and R_j @ W depends on weights only (a derived tensor, computed once per weight tensor). LayerNorm:
(h - mu) * r * gamma + beta = r * (h * gamma) - (r * mu) * gamma + beta.

`expand` distributes * over + and - through the values that depend on a reduction; what is not a
product or a sum there (silu(r * h)) cannot be split, and it says why.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import trampoline
from ..ir import primitives as P
from ..ir.core import Value
from ..shapes import Kind

MAX_TERMS = 16          # distributing products of sums grows fast: beyond this, refuse


class NotAffine(Exception):
    def __init__(self, culprit: Value, why: str):
        self.culprit, self.why = culprit, why


@dataclass
class Term:
    sign: int
    coef: list          # (value, exponent): row-constant factors that need a reduction
    local: list         # (value, exponent): tile-local factors

    def times(self, other: "Term") -> "Term":
        return Term(self.sign * other.sign, self.coef + other.coef, self.local + other.local)

    def power(self, p: int) -> "Term":
        return Term(self.sign if p % 2 else 1, [(f, e * p) for f, e in self.coef],
                    [(f, e * p) for f, e in self.local])


def expand(v: Value, dep: dict) -> list[Term]:
    """v as a sum of terms (raises NotAffine); a chain of thousands of sums walks without recursion."""
    return trampoline.run(_expand(v, dep))


def _expand(v: Value, dep: dict):
    if v.id not in dep:
        return [Term(1, [], [(v, 1)])]
    if v.kind in (Kind.COL, Kind.SCALAR):
        return [Term(1, [(v, 1)], [])]
    if v.kind is Kind.ROW:
        raise NotAffine(v, "it is a per-column statistic; only a per-row scale commutes with the right "
                           "matrix product ((x * c[col]) @ W != c * (x @ W))")
    algebra = P.prim(v.op).algebra
    if algebra == "sum":
        left = yield _expand(v.args[0], dep)
        right = yield _expand(v.args[1], dep)
        if P.prim(v.op).operator == "-":       # a - b
            right = [Term(-t.sign, t.coef, t.local) for t in right]
        return _bounded(left + right, v)
    if algebra == "negation":
        return [Term(-t.sign, t.coef, t.local) for t in (yield _expand(v.args[0], dep))]
    if algebra == "product":
        out = [Term(1, [], [])]
        for a in v.args:
            terms = yield _expand(a, dep)
            out = _bounded([x.times(y) for x in out for y in terms], v)
        return out
    if algebra in ("quotient", "power"):
        base = yield _expand(v.args[1] if algebra == "quotient" else v.args[0], dep)
        if len(base) != 1:
            raise NotAffine(v, "it divides by (or raises to a power) a sum that carries the reduction")
        p = -1 if algebra == "quotient" else v.attrs["exp"]
        inv = base[0].power(p)
        if algebra == "power":
            return [inv]
        return [t.times(inv) for t in (yield _expand(v.args[0], dep))]
    raise NotAffine(v, f"the reduction reaches it through `{v.op}`, which is neither a product nor a sum; "
                       "(r * x) @ W = r * (x @ W) holds only when r multiplies the whole row")


def _bounded(terms: list[Term], v: Value) -> list[Term]:
    if len(terms) > MAX_TERMS:
        raise NotAffine(v, f"it expands into more than {MAX_TERMS} terms")
    return terms


def local_kind(t: Term) -> Kind:
    """The shape of a term's tile-local part: TILE, ROW, or COL/SCALAR (row-constant)."""
    kinds = {f.kind for f, _ in t.local}
    if Kind.TILE in kinds or Kind.BLOCK in kinds or {Kind.ROW, Kind.COL} <= kinds:
        return Kind.TILE
    if Kind.ROW in kinds:
        return Kind.ROW
    return Kind.COL if Kind.COL in kinds else Kind.SCALAR
