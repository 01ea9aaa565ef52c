"""What a pass can promise about the program it returns (its `ensures`), as checks the pass
manager runs after it when EPIC_VERIFY is set. Each check returns a list of problems."""
from __future__ import annotations

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
    """No tile that a later gemm multiplies still needs a whole-row statistic."""
    a_operands = {k.a for k in program.kernels if k.kind == "gemm"}
    out = []
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        dep = reductions_feeding(k)
        out += [f"kernel {k.name}: {s.tensor} is an A operand and still depends on a reduction"
                for s in k.stores if s.tensor in a_operands and s.value.id in dep and s.value.kind is Kind.TILE]
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
