"""What the row combine kernel can finish after a backward reduction across tiles (used by pattern D
across a row sum, derive.py, and by policy "fused", fused.py): the rule of epic/checks/row_finish.py,
applied to the values a derivation is about to emit."""
from __future__ import annotations

from ..ir import primitives as P
from ..ir.core import Value
from ..shapes import Kind


def crosses(v: Value) -> bool:
    """A backward reduction across tiles (a row, column or whole-tensor sum)."""
    return P.family(v.op) is P.Family.REDUCE


def finished_by_row_combine(order: list[Value], requests: list[tuple[str, Value]]) -> bool:
    """Whether what depends on a backward reduction across tiles can be finished by the row combine
    kernel (epic/checks/row_finish.py): row sums only, element-wise math after them (no pairwise map,
    block value or further reduction), and tile results (a tile stored for another gemm, or returned)."""
    after: dict[int, bool] = {}               # value id -> it depends on a reduction across tiles
    blocks: dict[int, bool] = {}              # value id -> a block value is among its operands' operands
    for v in order:
        blocks[v.id] = v.kind is Kind.BLOCK or any(blocks[x.id] for x in v.args)
        if any(crosses(x) and x.attrs.get("axis") != "row" for x in v.args):
            return False                      # a column or whole-tensor sum that other values need
        crossed = any(after[x.id] or crosses(x) for x in v.args)
        if crossed and (crosses(v) or P.family(v.op) in (P.Family.PAIR, P.Family.BLOCK) or v.kind is Kind.BLOCK):
            return False
        after[v.id] = crossed
    # a tile (finished row by row) or a per-row vector (computed by the combine) after a row sum
    return all(not after[v.id] or (v.kind in (Kind.TILE, Kind.COL) and not blocks[v.id]) for _, v in requests)
