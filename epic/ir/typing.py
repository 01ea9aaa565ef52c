"""Type and shape of a value: the primitive's record decides (epic/ir/primitives.py), here is the
one entry point every stage uses, and the rule for what can be stored."""
from __future__ import annotations

from .. import dtypes
from ..dtypes import DType
from ..shapes import Kind, Shape
from .primitives import PRIMITIVES, TypeRuleError

__all__ = ["TypeRuleError", "infer", "check_storable"]


def infer(op: str, args: tuple, attrs: dict) -> tuple[DType, Shape]:
    p = PRIMITIVES.get(op)
    if p is None:
        raise TypeRuleError("E211", f"no primitive named '{op}'")
    if len(args) != p.arity:
        raise TypeRuleError("E203", f"{op} takes {p.arity} operand(s), got {len(args)}")
    return p.rule(tuple(args), attrs)


def check_storable(dtype: DType, shape: Shape) -> None:
    if dtype not in dtypes.STORABLE:
        raise TypeRuleError("E205", f"cannot store a {dtype} value", "cast it to a number type first")
    if shape.kind is Kind.SCALAR:
        raise TypeRuleError("E206", "cannot store a scalar: outputs are tiles, row or column vectors, or block values",
                            "store a column vector of it, e.g. multiply by a row statistic, or compute it on the host")
    if dtype is dtypes.I4 and shape.kind is not Kind.TILE:
        raise TypeRuleError("E205", "int4 values are stored packed two per row-adjacent pair: only tiles can be i4")
