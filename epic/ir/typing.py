"""Type and shape rules of the primitives: (op, operands, attrs) -> (dtype, shape), or why not.

One function serves the lowering (which turns a failure into a diagnostic at the user's span)
and every pass (which must only build well-typed values).
"""
from __future__ import annotations

from .. import dtypes
from ..dtypes import BOOL, F32, I32, DType
from ..shapes import COL, Kind, Shape, broadcast
from . import ops


class TypeRuleError(Exception):
    """Carries a diagnostic code and message; the caller adds the span."""

    def __init__(self, code: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint


def _numeric(v, what: str) -> None:
    if v.dtype is BOOL:
        raise TypeRuleError("E205", f"{what} needs a number, got a comparison result (bool)",
                            "use select(cond, a, b) to turn a condition into a value")


def infer(op: str, args: tuple, attrs: dict) -> tuple[DType, Shape]:
    cat = ops.category(op)
    if cat == "unary":
        (x,) = args
        _numeric(x, op)
        return (I32 if op in ("neg", "abs", "powi") and x.dtype.is_int else F32), x.shape
    if cat in ("binary", "compare"):
        a, b = args
        if cat == "binary":
            _numeric(a, op)
            _numeric(b, op)
        elif (a.dtype is BOOL) != (b.dtype is BOOL):
            raise TypeRuleError("E205", "comparison of a bool with a number")
        shape = broadcast(a.shape, b.shape)
        if isinstance(shape, str):
            raise TypeRuleError("E207", f"operands of {op} do not line up: {shape}",
                                "both sides must have the same width: after even/odd or swiglu a tile is "
                                "half as wide as the accumulator")
        if cat == "compare":
            return BOOL, shape
        if op == "div":
            return F32, shape
        return dtypes.promote(a.dtype, b.dtype), shape
    if cat == "select":
        c, a, b = args
        if c.dtype is not BOOL:
            raise TypeRuleError("E205", "the first argument of select must be a comparison",
                                "write select(x > 0, a, b)")
        _numeric(a, "select")
        _numeric(b, "select")
        shape = broadcast(c.shape, a.shape)
        if not isinstance(shape, str):
            shape = broadcast(shape, b.shape)
        if isinstance(shape, str):
            raise TypeRuleError("E207", f"operands of select do not line up: {shape}")
        return dtypes.promote(a.dtype, b.dtype), shape
    if cat == "cast":
        (x,) = args
        _numeric(x, "a cast")
        return attrs["to"], x.shape
    if cat == "pair":
        for x in args:
            _numeric(x, op)
        if op == "interleave":
            a, b = args
            shape = broadcast(a.shape, b.shape)
            if isinstance(shape, str):
                raise TypeRuleError("E207", f"operands of interleave do not line up: {shape}")
        else:
            shape = args[0].shape
        if not shape.has_columns or shape.kind is Kind.BLOCK:
            raise TypeRuleError("E206", f"{op} works on adjacent column pairs (2k, 2k+1), but its operand is a "
                                f"{shape.describe()}", "apply it to a tile or a row vector")
        if op == "interleave":
            return dtypes.promote(args[0].dtype, args[1].dtype), Shape(shape.kind, shape.width * 2)
        return args[0].dtype, Shape(shape.kind, shape.width / 2)
    if cat == "reduce":
        (x,) = args
        _numeric(x, f"{attrs['axis']}_{attrs['fn']}")
        if x.kind is not Kind.TILE:
            raise TypeRuleError("E206", f"{attrs['axis']}_{attrs['fn']} reduces a tile, but its operand is a "
                                f"{x.shape.describe()}",
                                "a row vector already has one value per column and a column vector one per row")
        if attrs["axis"] == "row":
            return F32, COL
        return F32, Shape(Kind.ROW, x.shape.width)
    if cat == "block":
        (x,) = args
        _numeric(x, f"block_{attrs['fn']}")
        if x.kind is not Kind.TILE:
            raise TypeRuleError("E206", f"block_{attrs['fn']} reduces 1x{attrs['block']} blocks of a tile's rows, "
                                f"but its operand is a {x.shape.describe()}")
        return F32, Shape(Kind.BLOCK, x.shape.width, attrs["block"])
    raise TypeRuleError("E211", f"no type rule for {op}")


def check_storable(dtype: DType, shape: Shape) -> None:
    if dtype not in dtypes.STORABLE:
        raise TypeRuleError("E205", f"cannot store a {dtype} value", "cast it to a number type first")
    if shape.kind is Kind.SCALAR:
        raise TypeRuleError("E206", "cannot store a scalar: outputs are tiles, row or column vectors, or block values",
                            "store a column vector of it, e.g. multiply by a row statistic, or compute it on the host")
    if dtype is dtypes.I4 and shape.kind is not Kind.TILE:
        raise TypeRuleError("E205", "int4 values are stored packed two per row-adjacent pair: only tiles can be i4")

