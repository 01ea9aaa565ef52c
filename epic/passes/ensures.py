"""What a pass can promise about the program it returns (its `ensures`), as checks the pass
manager runs after it when EPIC_VERIFY is set. Each check returns a list of problems."""
from __future__ import annotations

from ..checks import row_finish
from ..checks.locality import reductions_feeding
from ..ir import primitives as P
from ..ir.core import Program, topo_order
from ..shapes import Kind

ENSURES: dict[str, object] = {}


def _ensure(name: str):
    def register(fn):
        ENSURES[name] = fn
        return fn
    return register


def check(program: Program, names: tuple[str, ...]) -> list[str]:
    return [f"ensures {n}: {p}" for n in names for p in ENSURES[n](program)]


@_ensure("canonical")
def _canonical(program: Program) -> list[str]:
    from . import simplify      # the rules themselves say what canonical means
    return [f"kernel {k.name}: rule {rule} still applies to %{k.values.index(v)} {v.op}"
            for k in program.kernels for v, rule in simplify.applicable(k)]


@_ensure("no-duplicates")
def _no_duplicates(program: Program) -> list[str]:
    out = []
    for k in program.kernels:
        keys: dict[tuple, int] = {}
        for i, v in enumerate(k.values):
            if v.key() in keys:
                out.append(f"kernel {k.name}: %{i} {v.op} repeats %{keys[v.key()]}")
            keys[v.key()] = i
    return out


@_ensure("no-dead-values")
def _no_dead_values(program: Program) -> list[str]:
    out = []
    for k in program.kernels:
        live = {v.id for v in topo_order([s.value for s in k.stores])}
        out += [f"kernel {k.name}: %{i} {v.op} feeds no store" for i, v in enumerate(k.values) if v.id not in live]
    return out


@_ensure("row-scales-deferred")
def _row_scales_deferred(program: Program) -> list[str]:
    """No tile that a later gemm multiplies still needs a whole-row statistic, except quantizing stores
    the row combine kernel finishes; and no deferred scale crossed a store or cast that is not linear
    (the deferred value's store and its outermost cast, the only one the deferral looks through, round
    only as f32/bf16 do)."""
    from .defer_row_scale import SUFFIX
    a_operands = {k.a for k in program.kernels if k.kind == "gemm"}
    unscalable = row_finish.unscalable_reads(program)
    out = []
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        dep = reductions_feeding(k)
        finished = {id(s) for s in row_finish.finished_stores(k, program.tensors, dep, unscalable)}
        out += [f"kernel {k.name}: {s.tensor} is an A operand and still depends on a reduction"
                for s in k.stores if s.tensor in a_operands and s.value.id in dep and s.value.kind is Kind.TILE
                and id(s) not in finished]
        for s in k.stores:
            if s.tensor + SUFFIX not in program.tensors:
                continue
            if not row_finish.commutes_with_scale(program.tensors[s.tensor].dtype):
                out.append(f"kernel {k.name}: the row scale of {s.tensor} was moved across its "
                           f"{program.tensors[s.tensor].dtype} store")
            v = s.value         # the deferral pulls the scale out through the outermost cast only
            if P.family(v.op) is P.Family.CAST and not row_finish.commutes_with_scale(v.dtype):
                out.append(f"kernel {k.name}: the row scale of {s.tensor} was moved across a cast to {v.dtype}")
    return out


@_ensure("tile-local-gemms")
def _tile_local(program: Program) -> list[str]:
    """Gemm epilogues hold no whole-row/column reduction and store no vectors (combine kernels do)."""
    out = []
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        out += [f"kernel {k.name}: %{i} is a whole-{v.attrs['axis']} reduction" for i, v in enumerate(k.values)
                if P.family(v.op) is P.Family.REDUCE]
        out += [f"kernel {k.name}: stores the vector {s.tensor}" for s in k.stores
                if s.value.kind in (Kind.COL, Kind.ROW)]
    return out


@_ensure("block-scales-hoisted")
def _block_scales_hoisted(program: Program) -> list[str]:
    from .hoist_block_scale import unhoisted
    return unhoisted(program)


@_ensure("block-quants-made")
def _block_quants_made(program: Program) -> list[str]:
    from .block_quant import unrecognised
    return unrecognised(program)
