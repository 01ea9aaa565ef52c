"""The byte ledger (the seed article's 字节账): global-memory bytes each kernel reads and writes,
against the same program run op by op without fusion.

Model, so that every row can be checked by hand from the shapes:
- each tensor a kernel touches is counted once (operand re-reads that L2 serves are not counted);
- fused: a gemm reads A, B and every tensor its epilogue loads, and writes its stores (per-tile
  partials included); a combine kernel reads partials and vectors and writes its stores;
- op by op: each gemm writes its accumulator in the activation dtype (A's dtype, bf16 for fp8 A);
  then every operation of the source program is one kernel that reads its tensor operands and
  writes its result. A call of a prelude or user definition (rmsnorm, swiglu, silu, ...) counts as
  one operation, like torch's F.rms_norm or F.silu; each operator written in the file (+, *, row_sum,
  ...) counts as one. Intermediate tiles are held in the activation dtype, row/column statistics in
  f32, stored values in their declared dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes, sizes as sizes_mod
from ..ir import primitives as P
from ..ir.core import Program, Value
from ..passes.defer_row_scale import SUFFIX
from ..shapes import Kind
from . import config as config_mod, gpus, launch, tile_grid
from .planner import Plan, folds


def _is_source(v: Value) -> bool:
    return P.family(v.op) is P.Family.SOURCE


def _reads_tensor(v: Value) -> bool:
    return P.prim(v.op).reads == "tensor"


@dataclass
class Row:
    kernel: str
    kind: str
    reads: list[tuple[str, str, int]]    # (name, "dtype[shape]", bytes)
    writes: list[tuple[str, str, int]]

    @property
    def read_bytes(self) -> int:
        return sum(b for *_, b in self.reads)

    @property
    def write_bytes(self) -> int:
        return sum(b for *_, b in self.writes)


def picked(kernel) -> set[str]:
    """Partial buffers a combine kernel with a launch of its own reads one entry per row of (the tile
    of a picked column, split-reductions' pick), not whole (folded into its gemm, it merges them all)."""
    return {v.attrs["buffer"] for v in kernel.values if "pick" in v.attrs}


def fused_rows(plan: Plan) -> list[Row]:
    rows = []
    folded = folds(plan.program, plan.configs)
    for step in plan.steps:
        k = step.kernel
        one_per_row = picked(k) if k.kind == "combine" and k.name not in folded else set()

        def entry(name):
            b = plan.buffers[name]
            shape = f"{b.torch_dtype}[{', '.join(map(str, b.shape))}]"
            if name in one_per_row:       # [tiles, M padded]: one entry of each row
                return (name, shape + " (one entry per row)", b.nbytes // max(1, b.shape[0]))
            return (name, shape, b.nbytes)
        rows.append(Row(k.name, k.kind, [entry(n) for n in step.reads],
                        [entry(n) for n in step.writes]))
    return rows


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def unfused_rows(source: Program, sizes: dict[str, int]) -> list[Row]:
    rows: list[Row] = []
    ev = lambda d: sizes_mod.evaluate(d, sizes)  # noqa: E731
    for k in source.kernels:
        a = source.tensors[k.a]
        act = a.dtype if a.dtype.bits == 16 else dtypes.BF16
        m, n = ev(k.rows), ev(k.n)

        def elems(v: Value) -> tuple[int, ...]:
            w = int(n * v.shape.width) if v.shape.has_columns else 0
            return {Kind.TILE: (m, w), Kind.ROW: (w,), Kind.COL: (m,), Kind.SCALAR: (),
                    Kind.BLOCK: (m, -(-w // (v.shape.block or 1)))}[v.kind]

        def held(v: Value):
            """(dtype, shape) of a value as op by op would keep it in memory."""
            if _reads_tensor(v):
                t = source.tensors[v.attrs["tensor"]]
                return t.dtype, tuple(ev(d) for d in t.dims)
            if v.kind in (Kind.COL, Kind.ROW) and not P.is_accumulator(v.op):
                return dtypes.F32, elems(v)
            return act, elems(v)

        def entry(name, dt, shape):
            return (name, f"{dt}[{', '.join(map(str, shape))}]", (_count(shape) * dt.bits + 7) // 8)

        kb = source.tensors[k.b]
        rows.append(Row(f"{k.name} (gemm)", "gemm",
                        [entry(k.a, a.dtype, tuple(ev(d) for d in a.dims)),
                         entry(k.b, kb.dtype, tuple(ev(d) for d in kb.dims))],
                        [entry("acc", act, (m, n))]))
        stored = {s.value.id: source.tensors[s.tensor] for s in k.stores}
        groups: dict[object, list[Value]] = {}
        for v in k.values:
            if not _is_source(v):
                groups.setdefault(("call", v.origin) if v.origin is not None else ("op", v.id), []).append(v)
        users = k.users()
        for members in groups.values():
            ids = {v.id for v in members}
            inputs = {x.id: x for v in members for x in v.args if x.id not in ids and x.kind is not Kind.SCALAR
                      and (not _is_source(x) or _reads_tensor(x) or P.is_accumulator(x.op))}
            outputs = [v for v in members if v.id in stored or any(u.id not in ids for u in users.get(v.id, []))]
            reads = []
            for x in inputs.values():
                dt, shape = held(x)
                reads.append(entry(x.attrs["tensor"] if _reads_tensor(x) else (x.name or x.op), dt, shape))
            writes = []
            for v in outputs:
                dt, shape = held(v)
                if v.id in stored:
                    t = stored[v.id]
                    dt, shape = t.dtype, tuple(ev(d) for d in t.dims)
                writes.append(entry(stored[v.id].name if v.id in stored else (v.name or v.op), dt, shape))
            label = members[-1].name or members[-1].op
            if members[0].origin is not None:
                label = _call_label(members)
            rows.append(Row(f"  {label}", "op", reads, writes))
    return rows


def _call_label(members: list[Value]) -> str:
    span = members[0].span
    if span is None:
        return members[-1].op
    text = span.source.line(span.line)[span.column - 1:]
    name = text.split("(")[0].strip()
    return f"{name}(...)" if name.isidentifier() else members[-1].op


def _mib(b: int) -> str:
    if b >= 1 << 20:
        return f"{b / (1 << 20):.2f} MiB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KiB"
    return f"{b} B"


def _combine_desc(k) -> str:
    if k.kind == "tail":
        rows = any(P.family(v.op) is P.Family.REDUCE for v in k.values)
        blocks = any(P.family(v.op) is P.Family.BLOCK for v in k.values)
        what = " and ".join(w for w, has in (("the row statistics and the row math", rows),
                                               ("the 1xB block statistics", blocks)) if has)
        return f"tail of {k.source} (combine=tail): {k.source}'s epilogue on its stored accumulator, {what}, a CTA per row"
    if k.axis == "all":
        return f"combine of {k.source}'s per-row/column statistics into whole-tensor ones"
    return f"combine of {k.source}'s per-tile partials ({k.axis}s)"


def render(plan: Plan, source: Program) -> str:
    sizes = ", ".join(f"{k}={v}" for k, v in plan.sizes.items())
    out = [f"plan for {plan.program.name} at {sizes}, for {gpus.LABELS[plan.gpu]}", ""]
    out.append("kernels (in launch order):")
    folded = folds(plan.program, plan.configs)
    previous = None          # the kernel launched before this one in the call
    one_gemm = launch.has_one_gemm(plan.program)
    for i, step in enumerate(plan.steps, 1):
        k = step.kernel
        cfg = f"  [{step.config}]" if step.config else ""
        desc = f"gemm {k.a} @ {k.b}" if k.kind == "gemm" else _combine_desc(k)
        if k.name in folded:
            desc += f", folded into {folded[k.name]} (combine=fold: its last CTA per row block runs it, no launch)"
        out.append(f"  {i}. {k.name}: {desc}{cfg}")
        if k.kind == "gemm" and step.config is not None:
            rows = sizes_mod.evaluate(k.rows, plan.sizes)
            how = launch.describe(launch.gemm_flags(previous is not None, rows, step.config, one_gemm),
                                  previous, k.b)
            if how:
                out.append(f"       {how}")
            if not step.config.vendor:
                n = sizes_mod.evaluate(k.n, plan.sizes)
                out.append(f"       {tile_grid.rounds(step.config, rows, n).describe()}")
                split = tile_grid.last_round_split(step.config, rows, n, sizes_mod.evaluate(k.k, plan.sizes))
                if split:
                    out.append(f"       {split}")
                if step.config.a_rows:
                    out.append(f"       loads {step.config.a_rows} of each tile's {step.config.tile_m} rows of {k.a} "
                               f"(a_rows={step.config.a_rows}: calls of at most {step.config.a_rows} rows)")
        if k.name not in folded:
            previous = k.name
        if k.kind == "gemm":
            partial = [s for s in k.stores if s.value.kind is Kind.PARTIAL]
            work = [s.tensor for s in k.stores if s not in partial]
            parts = [s.value.attrs["fn"] for s in partial]
            scaled = [v.attrs["tensor"] for v in k.values if _reads_tensor(v) and v.attrs["tensor"] == k.a + SUFFIX]
            if scaled:
                out.append(f"       epilogue multiplies acc by {', '.join(scaled)}[row]")
            derived = [v.attrs["tensor"] for v in k.values if _reads_tensor(v)
                       and plan.program.tensors[v.attrs["tensor"]].role == "derived"]
            if derived:
                out.append(f"       epilogue adds {', '.join(d + '[col]' for d in derived)} (row vectors @ {k.b}, deferred), "
                           "scaled by per-row shifts where they need a row statistic")
            out.append(f"       writes {', '.join(work) or 'nothing else'}"
                       + (f"; per-tile partials ({', '.join(parts)})" if parts else ""))
        else:
            tiles = [s.tensor for s in k.stores if s.value.kind is Kind.TILE]
            if tiles and k.kind == "combine":
                back = sorted({v.attrs["tensor"] for v in k.values if _reads_tensor(v) and v.kind is Kind.TILE
                               and plan.program.tensors[v.attrs["tensor"]].producer == k.source})
                quantized = any(plan.program.tensors[t].dtype.name not in ("f32", "bf16", "f16") for t in tiles)
                verb, how = ("quantizes", "unquantized") if quantized else ("finishes", "unscaled")
                out.append(f"       then, a warp per row, {verb} {', '.join(tiles)} from {', '.join(back)} "
                           f"({how}, stored by {k.source}): the row statistic is known only here")
            out.append(f"       writes {', '.join(s.tensor for s in k.stores)}")
    out.append("")
    out.append("buffers:")
    for b in plan.buffers.values():
        if b.role in ("scalar",):
            continue
        out.append(f"  {b.name:<28} {b.role:<7} {b.torch_dtype}[{', '.join(map(str, b.shape))}]".ljust(64)
                   + f" {b.nbytes:>14,} B  written by {b.writer or 'caller'}; read by {', '.join(b.readers) or '-'}")
        if b.layout not in ("row-major", "scalar"):     # why its shape is not the math's, or how to pass it
            out.append(f"  {'':<28} {b.layout}")
    fused = fused_rows(plan)
    unfused = unfused_rows(source, plan.sizes)
    out.append("")
    out.append("byte ledger, fused (this plan):")
    out.extend(_table(fused))
    out.append("")
    out.append("byte ledger, op by op without fusion (see epic/plan/ledger.py for the model):")
    out.extend(_table(unfused))
    f_total = sum(r.read_bytes + r.write_bytes for r in fused)
    u_total = sum(r.read_bytes + r.write_bytes for r in unfused)
    out.append("")
    out.append(f"total fused      {f_total:>16,} B  ({_mib(f_total)}) in {len(fused)} kernels")
    out.append(f"total op by op   {u_total:>16,} B  ({_mib(u_total)}) in {len(unfused)} kernels")
    out.append(f"fused / op by op {f_total / u_total:>16.3f}")
    return "\n".join(out)


def _table(rows: list[Row]) -> list[str]:
    out = [f"  {'kernel':<26} {'read':>16} {'written':>16}   detail"]
    for r in rows:
        detail = "; ".join(f"{n} {s}" for n, s, _ in r.reads) + " -> " + "; ".join(f"{n} {s}" for n, s, _ in r.writes)
        out.append(f"  {r.kernel:<26} {r.read_bytes:>16,} {r.write_bytes:>16,}   {detail}")
    out.append(f"  {'total':<26} {sum(r.read_bytes for r in rows):>16,} {sum(r.write_bytes for r in rows):>16,}")
    return out


def totals(plan: Plan, source: Program) -> tuple[int, int]:
    f = sum(r.read_bytes + r.write_bytes for r in fused_rows(plan))
    u = sum(r.read_bytes + r.write_bytes for r in unfused_rows(source, plan.sizes))
    return f, u
