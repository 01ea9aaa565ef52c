"""Tile locality: an epilogue sees one output tile.

A reduction over a whole row (row_sum, row_mean, row_lse, ...) or column (col_*) is not known in
any single tile. Its result may be stored (a combine kernel finishes it from per-tile partials),
and vector math on it may follow (it runs in the combine kernel), but feeding it back into the
tile inside the same epilogue is impossible. Run after the rewrite passes, which move legal
cases (a row scale in front of a later GEMM) out of the way, and a quantizing tile store that needs a
row statistic is finished by the row combine kernel (row_finish.py); what remains is an E301/E302. A
whole-tensor reduction (all_max(acc)) may be stored and scalar math on it may follow, but no tile or
vector of the same gemm may use it: E303.
"""
from __future__ import annotations

from ..diagnostics import Diagnostic
from ..ir import primitives as P
from ..ir.core import GemmKernel, Program, Value
from ..shapes import Kind
from . import row_finish


def _is_reduce(v: Value) -> bool:
    return P.family(v.op) is P.Family.REDUCE


def reductions_feeding(k: GemmKernel) -> dict[int, Value]:
    """For each value of kernel k, the first whole-row/column reduction it depends on (if any)."""
    dep: dict[int, Value] = {}
    for v in k.values:
        if _is_reduce(v):
            dep[v.id] = v
            continue
        for a in v.args:
            if a.id in dep:
                dep[v.id] = dep[a.id]
                break
    return dep


def whole_reductions_feeding(k: GemmKernel) -> dict[int, Value]:
    """For each value of kernel k computed from a whole-tensor reduction (not the reduction itself),
    the first such reduction."""
    dep: dict[int, Value] = {}
    for v in k.values:
        for a in v.args:
            if _is_reduce(a) and a.kind is Kind.SCALAR:
                dep[v.id] = a
                break
            if a.id in dep:
                dep[v.id] = dep[a.id]
                break
    return dep


def describe_reduction(r: Value, k: GemmKernel) -> str:
    a = r.attrs
    if r.kind is Kind.SCALAR:
        doc = P.reduction(a["fn"]).doc
        if _is_reduce(r.args[0]):
            return f"all_{a['fn']} ({doc} over the whole [{k.rows}, {k.n}] result)"
        x = r.args[0]
        return f"{a['axis']}_{a['fn']} of a {x.shape.describe()} ({doc} over all its {x.shape.dims(k.rows, k.n)[0]} values)"
    axis_dim = k.n * r.args[0].shape.width if a["axis"] == "row" else k.rows
    what = f"{a['axis']}_{a['fn']}"
    return (f"{what} ({P.reduction(a['fn']).doc} over all {axis_dim} "
            f"{'columns of each row' if a['axis'] == 'row' else 'rows of each column'})")


def check(program: Program) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    unscalable = row_finish.unscalable_reads(program)
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        dep = reductions_feeding(k)
        users = k.users()
        whole = _whole_misuse(k, users)
        if whole:
            out.append(whole)
            continue
        in_gemm = row_finish.left_in_gemm(k, program.tensors, dep, unscalable)
        for v in k.values:
            if v.id not in dep or _is_reduce(v) or v.kind not in (Kind.TILE, Kind.BLOCK) or v.id not in in_gemm:
                continue        # (a quantizing store the row combine kernel finishes is legal)
            r = dep[v.id]
            code = "E301" if r.attrs["axis"] == "row" else "E302"
            name = _nearest_name(v, users, k)
            across = "a tile holds at most 256 columns of a row" if code == "E301" else \
                "a tile holds at most 256 rows of a column"
            msg = (f"'{name}' needs {describe_reduction(r, k)} inside the same epilogue; "
                   f"the epilogue sees one output tile and {across}")
            hint = ("an output (out x: ...) computed element-wise from the statistic is finished after the row is "
                    "known, and a tile that is the A operand of a later gemm (tmp x: bf16 = ...) gets its row scale "
                    "deferred into that gemm; a pairwise map, a block or column statistic after the row statistic "
                    "is neither: apply it in a later gemm, or store the statistic (out r: f32[M] = ...) and apply it "
                    "where it is consumed") if code == "E301" else \
                ("store the column statistic (out s: f32[N] = col_...) and apply it in a later kernel")
            notes = [(r.span, f"the {r.attrs['axis']} reduction is here")] if r.span else []
            out.append(Diagnostic(code, msg, v.span, hint, notes))
            break   # one locality error per kernel: later ones are usually the same cause
    return out


def _whole_misuse(k: GemmKernel, users: dict) -> Diagnostic | None:
    """A tile or vector computed from a whole-tensor reduction: every row would need every other row."""
    whole = whole_reductions_feeding(k)
    for v in k.values:
        if v.id not in whole or v.kind is Kind.SCALAR or _is_reduce(v):
            continue
        r = whole[v.id]
        name = _nearest_name(v, users, k)
        notes = [(r.span, "the whole-tensor reduction is here")] if r.span else []
        return Diagnostic("E303", f"'{name}' needs {describe_reduction(r, k)} inside the same gemm; it is known only "
                          "after every tile and every row or column is combined", v.span,
                          "store the statistic (out a: f32 = all_...(...)) or keep it (tmp a: f32 = ...) and use "
                          "it in a later gemm, which reads it as a scalar", notes)
    return None


def _nearest_name(v: Value, users: dict, k: GemmKernel) -> str:
    """The value's own name, else the name of the first named value or store that uses it."""
    if v.name:
        return v.name
    frontier = [v]
    seen = set()
    while frontier:
        x = frontier.pop(0)
        if x.id in seen:
            continue
        seen.add(x.id)
        if x.name:
            return x.name
        for s in k.stores:
            if s.value is x:
                return s.tensor
        frontier.extend(users.get(x.id, []))
    return f"%{k.values.index(v)}"
