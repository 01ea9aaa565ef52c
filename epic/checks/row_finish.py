"""Quantizing stores that need a whole-row statistic: finished after the row is known.

Dynamic per-token quantization (`tmp q: i8 = a / s` with `s = row_amax(a) / 127`) needs every column
of a row before any element can be stored. A per-row scale cannot be moved across such a store:
rounding to 8 or 4 bits and saturating is not linear (`i8(r * a) != r * i8(a)`), and the row-scale
deferral would store `i8(a * 127)`, saturated wherever |a| > 1. Instead, the plan does what
users do by hand: the gemm stores the unquantized tile-local value (in its own dtype, so nothing is
rounded that the source does not round) and the row partials; the row combine kernel merges the
statistic and, one warp per row, reads that value back and writes the quantized tile (and the scale).

A scale commutes with a store only when the store is the identity up to rounding on f32's whole
range: f32 and bf16. f16 overflows to inf at 65504, fp8 and integers saturate and round coarsely.
"""
from __future__ import annotations

from ..ir import primitives as P
from ..ir.core import Store, Tensor, Value, topo_order
from ..shapes import Kind

# Stores (and casts) that a per-row scale may cross: identity up to rounding over f32's range.
SCALE_COMMUTES = ("f32", "bf16")


def commutes_with_scale(dtype) -> bool:
    return dtype.name in SCALE_COMMUTES


def nonlinear_crossing(s: Store, t: Tensor, dep: dict) -> Value | Store | None:
    """What a row scale in `s.value` would have to cross to be moved past the store: the store itself
    when its dtype rounds coarsely or saturates, else the first such cast among the values computed
    from the reduction; None when the scale could cross everything."""
    if not commutes_with_scale(t.dtype):
        return s
    for v in topo_order([s.value]):
        if v.id in dep and P.family(v.op) is P.Family.CAST and not commutes_with_scale(v.dtype):
            return v
    return None


def _finishable(s: Store, dep: dict) -> bool:
    """The part of the value computed from the reductions can run one element at a time in a row
    combine kernel: element-wise math on tiles, row constants, column vectors and scalars, reading
    row reductions only. (Pairwise maps, block statistics and column reductions stay in the gemm, which
    cannot finish them: the locality check reports those.)"""
    for v in topo_order([s.value]):
        if v.id not in dep:
            if v.kind is Kind.BLOCK:
                return False
            continue
        fam = P.family(v.op)
        if fam is P.Family.REDUCE:
            if v.attrs["axis"] != "row" or v.kind is Kind.SCALAR or v.args[0].id in dep:
                return False        # a column or whole-tensor statistic, or one of a finished value
        elif fam in (P.Family.PAIR, P.Family.BLOCK) or v.kind is Kind.BLOCK:
            return False
    return True


def unscalable_reads(program) -> frozenset[str]:
    """Tensors a gemm reads in a way a deferred row scale cannot follow: transposed (`.T`: the scale
    would be a column scale there), as the B operand, or loaded as a tile by an epilogue."""
    out = set()
    for c in program.kernels:
        if c.kind != "gemm":
            continue
        if getattr(c, "a_t", False):
            out.add(c.a)
        out.add(c.b)
        out |= {v.attrs["tensor"] for v in c.values if P.is_load(v) and v.kind is Kind.TILE}
    return frozenset(out)


def finished_after_row(k, s: Store, t: Tensor, dep: dict, unscalable: frozenset = frozenset()) -> bool:
    """Whether store s of gemm k is a tile store that the row combine kernel finishes: a quantizing
    one (no scale may cross it), an output (the caller expects the finished value, e.g. RMSNorm's
    normalized rows, so the scale cannot be deferred into a consumer either), or a tile a later gemm
    reads where a deferred scale cannot follow (`unscalable_reads`: cross entropy's dlogits, read
    transposed by the weight-gradient gemm)."""
    return (s.value.kind is Kind.TILE and s.value.id in dep and _finishable(s, dep)
            and (nonlinear_crossing(s, t, dep) is not None or t.role == "out" or t.name in unscalable))


def finished_stores(k, tensors: dict, dep: dict, unscalable: frozenset = frozenset()) -> list[Store]:
    return [s for s in k.stores if finished_after_row(k, s, tensors[s.tensor], dep, unscalable)]


def left_in_gemm(k, tensors: dict, dep: dict, unscalable: frozenset = frozenset()) -> set[int]:
    """Ids of the values the gemm itself must compute once the finished stores are taken out (what
    the locality check and the split pass hold to tile locality)."""
    finished = {id(s) for s in finished_stores(k, tensors, dep, unscalable)}
    roots = [s.value for s in k.stores if id(s) not in finished]
    return {v.id for v in topo_order(roots)}


def frontier(s: Store, dep: dict) -> list[Value]:
    """The tile-local tiles the finished store needs: the values not computed from a reduction whose
    users are (what the gemm stores for the combine kernel to read back). A comparison is recomputed
    from its operands (a bool is not a storable type), and so is element-wise math on what the combine
    kernel reads itself (column indices, tensors, vectors: cross entropy's `select(col == label, ..)`
    costs no buffer)."""
    out: dict[int, Value] = {}
    seen: set[int] = set()
    stack = [s.value]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        if P.family(v.op) is P.Family.REDUCE:
            continue                  # merged from the partials: its operand is not read back
        if v.id in dep or (v.kind is Kind.TILE and v.dtype.name == "bool") or _recomputable(v):
            stack.extend(v.args)
        elif v.kind is Kind.TILE and not P.prim(v.op).reads:     # a tensor the combine kernel can read itself
            out[v.id] = v
    order = {v.id: i for i, v in enumerate(topo_order([s.value]))}
    return sorted(out.values(), key=lambda v: order[v.id])


def _recomputable(v: Value) -> bool:
    """v is element-wise math on what the row combine kernel reads or knows itself (literals, tensor
    loads, the column index), so it need not be stored for it."""
    for x in topo_order([v]):
        p = P.prim(x.op)
        if x.kind is Kind.BLOCK or (x.kind in (Kind.TILE, Kind.ROW) and x.shape.width != 1) \
                or p.family in (P.Family.PAIR, P.Family.BLOCK):
            return False
        if p.family is P.Family.SOURCE and not (P.is_literal(x) or (p.reads == "tensor" and "period" not in x.attrs)
                                                or p.keyword == "col"):
            return False
    return True
