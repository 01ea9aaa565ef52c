"""A tail kernel of the plan (epic/plan/tail.py) -> TailSpec: a CUDA kernel, one CTA per row.

Its values fall in four groups, computed in this order by every thread of the row's CTA:
  head    the row's constants: runtime scalars, column-vector loads, sizes, the row index;
  pass 1  over the row's columns (each thread VEC consecutive columns per step, as a row combine
          kernel's finish loop, codegen/combine.py): the values no reduction feeds, the tile stores
          of those, and each reduction's step on its operand;
  reduce  each reduction over the CTA in a fixed order (the warps' butterflies, then the warps' states
          merged in warp order), then the row math on the results; thread 0 stores column vectors;
  pass 2  over the columns again, only where a tile store needs a reduction (RMSNorm's normalized
          rows): the values it needs, recomputed from the tiles read again.
ABI: the combine kernels' (epic_launch(ptrs, sizes=[M, N, tile M, tile N], scalars, stream, ...)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import Program, TailKernel, topo_order
from ..passes.rewrite import make
from ..shapes import Kind
from . import functor as fn
from .combine import _copy, _vector_loop
from .cxx import identifier, literal
from .nodes import Pointer, Scalar

# A row's CTA moves STEP columns at once: 512 threads of 8 columns (16-byte loads of 16-bit tiles), or
# 256 of 16 where a tile read or store has 1-byte elements (a move is 16 bytes). Measured on residual +
# RMSNorm at M = 64, N = 4096 (bench/results/2026-12-07-h100-decode-tail-probe.json): 512 threads of 8
# columns 1.124 against 256 threads 1.141 of cuBLAS.
STEP = 4096


@dataclass
class TailSpec:
    name: str
    symbol: str
    source: str
    pointers: list[Pointer]
    scalars: list[Scalar]
    threads: int = STEP // 8
    early: list[str] = field(default_factory=list)      # before the wait for the gemm: the inputs' first step
    head: list[str] = field(default_factory=list)
    first: list[str] = field(default_factory=list)
    reduce: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)     # thread 0
    second: list[str] = field(default_factory=list)
    reductions: int = 0


def lower_tail(program: Program, k: TailKernel) -> TailSpec:
    spec = TailSpec(k.name, identifier(k.name), k.source, [], [])

    def ptr(role, tensor, dt) -> str:
        spec.pointers.append(Pointer(role, tensor, dt))
        return f"p{len(spec.pointers) - 1}"

    def scalar(name, dim=None) -> str:
        spec.scalars.append(Scalar(name, dim))
        return f"s[{len(spec.scalars) - 1}]"

    reds = [v for v in k.values if P.family(v.op) is P.Family.REDUCE]
    dep: set[int] = set()
    for v in k.values:
        if v in reds or any(a.id in dep for a in v.args):
            dep.add(v.id)
    column = {v.id for v in k.values if v.kind in (Kind.TILE, Kind.ROW)}
    width = scalar(str(k.n), k.n)
    writer = fn.ExprWriter(pairwise=False, flavor="cuda")
    pointer_of: dict[str, str] = {}

    def pointer(role, t) -> str:
        if (role, t.name) not in pointer_of:
            pointer_of[(role, t.name)] = ptr(role, t.name, t.dtype)
        return pointer_of[(role, t.name)]

    def put(v, tile_reads: dict) -> None:
        """Bind a leaf to its C++ (a tile read: a line of its own, vectorised by the loop) or emit v."""
        p = P.prim(v.op)
        if P.is_load(v):
            t = program.tensors[v.attrs["tensor"]]
            if v.kind is Kind.TILE:
                pp = pointer("tile", t)
                tile_reads[len(writer.lines)] = (pp, t.dtype)
                writer.lines.append(f"const float {pp}_at = float(static_cast<const {t.dtype.cuda}*>({pp})"
                                    "[(long long)m * W + n]);")
                writer.bind(v, (f"{pp}_at",))
            elif v.kind is Kind.ROW:       # read VEC columns at a time too (an entry without the row offset)
                pp = pointer("row", t)
                tile_reads[len(writer.lines)] = (pp, t.dtype, False)
                writer.lines.append(f"const float {pp}_at = float(static_cast<const {t.dtype.cuda}*>({pp})[n]);")
                writer.bind(v, (f"{pp}_at",))
            elif v.kind is Kind.COL:
                writer.bind(v, (f"float(static_cast<const {t.dtype.cuda}*>({pointer('col', t)})[m])",))
            elif t.producer:            # a whole-tensor statistic an earlier kernel stored
                writer.bind(v, (f"(*static_cast<const float*>({pointer('scalar', t)}))",))
            else:
                writer.bind(v, (scalar(t.name),))
        elif p.family is P.Family.SOURCE and "dim" in v.attrs:
            writer.bind(v, (scalar(str(v.attrs["dim"]), v.attrs["dim"]),))
        elif p.keyword == "row":
            writer.bind(v, ("float(m)",))
        elif p.keyword == "col":
            writer.bind(v, ("float(n)",))
        elif p.family is P.Family.SOURCE and not P.is_literal(v):
            raise error("E702", f"'{v.op}' in a tail kernel is not supported by code generation yet", v.span)
        else:
            writer.emit(v)

    # head: the row's constants
    for v in k.values:
        if v.id not in column and v.id not in dep:
            put(v, {})
    spec.head, writer.lines = writer.lines, []

    # pass 1: what no reduction feeds, and each reduction's steps
    reads: dict = {}
    for v in k.values:
        if v.id in column and v.id not in dep:
            put(v, reads)
    for i, r in enumerate(reds):
        red = P.reduction(r.attrs["fn"])
        x = r.args[0]
        if red.pre:
            (name,) = writer.emit(make(red.pre, (x,), {}, like=r))
        else:
            (name,) = writer.names[x.id]
        writer.lines.append(f"{{ float x = {name}; {red.cxx_merge.format(a=f'acc_{i}', x='x')} }}")
    first = [s for s in k.stores if s.value.kind is Kind.TILE and s.value.id not in dep]
    elements = [dt for _, dt, *_ in reads.values()] + [program.tensors[s.tensor].dtype for s in k.stores
                                                       if s.value.kind is Kind.TILE]
    vec = 16 if any(dt.bits == 8 for dt in elements) else 8
    spec.threads = STEP // vec
    early = _early(program, reads, vec, width, spec)
    spec.first = ([f"float acc_{i} = {literal(P.reduction(r.attrs['fn']).identity)};" for i, r in enumerate(reds)]
                  + ["{"] + _vector_loop(program, first, writer, width, reads, ptr, "threadIdx.x", "kThreads",
                                         vec, early) + ["}"])

    # the reductions over the CTA, then the row math
    writer.lines = []
    for i, r in enumerate(reds):
        red = P.reduction(r.attrs["fn"])
        step = red.cxx_merge.format(a=f"acc_{i}", x="x")
        result = red.cxx_finalize.format(a=f"acc_{i}")
        if red.by_width:
            result = f"({result} / {scalar(str(k.n), k.n)})"
        spec.reduce += [
            f"for (int o = 16; o > 0; o >>= 1) {{ float x = __shfl_xor_sync(0xffffffffu, acc_{i}, o); {step} }}",
            f"if ((threadIdx.x & 31) == 0) red_smem[{i}][threadIdx.x >> 5] = acc_{i};",
            "__syncthreads();",
            f"acc_{i} = {literal(red.identity)};",
            f"for (int w = 0; w < kWarps; ++w) {{ float x = red_smem[{i}][w]; {step} }}",
            f"const float red_{i} = {result};"]
        writer.bind(r, (f"red_{i}",))
    for v in k.values:
        if v.id not in column and v.id in dep and v not in reds:
            put(v, {})
    spec.reduce += writer.lines
    spec.reductions = len(reds)
    for s in k.stores:
        if s.value.kind is Kind.TILE:
            continue
        t = program.tensors[s.tensor]
        if s.value.kind is not Kind.COL or t.dtype.cuda is None:
            raise error("E702", f"storing '{t.name}' ({t.describe()}) from a tail kernel is not supported by code "
                        "generation yet", s.span)
        (x,) = writer.names[s.value.id]
        value = fn.store_expr(x, t.dtype)
        conv = f"static_cast<{t.dtype.cuda}>({value})" if t.dtype.is_int else f"{t.dtype.cuda}({value})"
        spec.stores.append(f"static_cast<{t.dtype.cuda}*>({ptr('out', t.name, t.dtype)})[m] = {conv};")

    # pass 2: tile stores that need a reduction, their column values recomputed
    second = [s for s in k.stores if s.value.kind is Kind.TILE and s.value.id in dep]
    if second:
        for v in k.values:
            if v.id in column and v.id not in dep:
                writer.names.pop(v.id, None)
        writer.lines, reads = [], {}
        for v in topo_order([s.value for s in second]):
            if v.id in column:
                put(v, reads)
        spec.second = ["{"] + _vector_loop(program, second, writer, width, reads, ptr, "threadIdx.x",
                                            "kThreads", vec) + ["}"]
    return spec


def _early(program: Program, reads: dict, vec: int, width: str, spec: TailSpec) -> dict[str, str]:
    """The pass-1 reads of the call's inputs, whose first step each thread loads before it waits for
    the gemm (spec.early; through L2, __ldcg): no kernel of the call writes an input, and the gemm lets
    this kernel start only after its own wait for the kernel before the call. pointer -> the array."""
    out = {}
    pointers = {f"p{i}": p for i, p in enumerate(spec.pointers)}
    for pp, dt, *row in reads.values():
        if program.tensors[pointers[pp].tensor].role != "input":
            continue
        at = "(long long)m * W0 + j0" if not row or row[0] else "j0"
        spec.early += [f"alignas(16) {dt.cuda} pre_{pp}[{vec}];",
                       f"if (early) {{ {_copy(f'pre_{pp}', f'static_cast<const {dt.cuda}*>({pp}) + {at}', dt, vec, '__ldcg')} }}"]
        out[pp] = f"pre_{pp}"
    if out:
        spec.early = [f"const long long W0 = (long long)({width}), j0 = (long long)threadIdx.x * {vec};",
                      f"const bool early = W0 % {vec} == 0 && j0 < W0;   // the vector loop's first step"] + spec.early
    return out
