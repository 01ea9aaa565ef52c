"""Type and shape of a value: the primitive's record decides (epic/ir/primitives.py), here is the
one entry point every stage uses, and the rule for what can be stored."""
from __future__ import annotations

from .. import dtypes
from ..dtypes import DType
from ..shapes import Kind, Shape
from .primitives import PRIMITIVES, Family, TypeRuleError, attribute_problem

__all__ = ["TypeRuleError", "infer", "check_storable", "depends_on_whole_reduce"]


def infer(op: str, args: tuple, attrs: dict) -> tuple[DType, Shape]:
    p = PRIMITIVES.get(op)
    if p is None:
        raise TypeRuleError("E211", f"no primitive named '{op}'")
    if len(args) != p.arity:
        raise TypeRuleError("E203", f"{op} takes {p.arity} operand(s), got {len(args)}")
    why = attribute_problem(op, attrs)
    if why:     # only epic itself builds attributes: a bug, not the user's program
        raise TypeRuleError("E599", f"internal: {why}")
    return p.rule(tuple(args), attrs)


def check_storable(dtype: DType, shape: Shape, whole_tensor: bool = False) -> None:
    """whole_tensor: the value depends on a whole-tensor reduction (all_max(acc), ...), so a scalar
    of it is something the kernels compute; any other scalar is known before the launch."""
    if dtype not in dtypes.STORABLE:
        raise TypeRuleError("E205", f"cannot store a {dtype} value", "cast it to a number type first")
    if shape.kind is Kind.SCALAR and not whole_tensor:
        raise TypeRuleError("E206", "cannot store a scalar that does not depend on the gemm: it is known before "
                            "the launch", "compute it on the host; a stored scalar comes from a whole-tensor "
                            "reduction, e.g. out a: f32 = all_amax(acc)")
    if shape.kind is Kind.SCALAR and dtype is not dtypes.F32:
        raise TypeRuleError("E205", f"a whole-tensor statistic is stored as f32, not {dtype}", "declare it f32")
    if dtype in dtypes.PACKED and shape.kind is not Kind.TILE:
        raise TypeRuleError("E205", f"{dtype} values are stored packed two per row-adjacent pair: only tiles can be "
                            f"{dtype}")


def depends_on_whole_reduce(v) -> bool:
    """Whether v is, or is computed from, a whole-tensor reduction (col_f of a column vector, ...)."""
    stack, seen = [v], set()
    while stack:
        x = stack.pop()
        if x.id in seen:
            continue
        seen.add(x.id)
        if PRIMITIVES[x.op].family is Family.REDUCE and x.kind is Kind.SCALAR:
            return True
        stack.extend(x.args)
    return False
