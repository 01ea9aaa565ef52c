"""A tail kernel of the plan (epic/plan/tail.py) -> TailSpec: a CUDA kernel, one CTA per row.

Its values fall in four groups, computed in this order by every thread of the row's CTA:
  head    the row's constants: runtime scalars, column-vector loads, sizes, the row index;
  pass 1  over the row's columns, VEC consecutive ones per thread and step (the vector loop below):
          the values no row reduction feeds, their tile and block stores, and each row reduction's
          step on its operand;
  reduce  each row reduction over the CTA in a fixed order (the warps' butterflies, then the warps'
          states merged in warp order), then the row math on the results; thread 0 stores column vectors;
  pass 2  over the columns again, only where a store needs a row reduction (RMSNorm's normalized
          rows): the values it needs, recomputed from the tiles read again.
In the loop a value is VEC variables, one per column (ColumnWriter): half as many after even/odd, one
for a value constant along them (a scalar, a column vector, a 1xB block's value). A 1xB block reduction
merges its thread's columns, then the B / VEC lanes of its block in a butterfly under the block's lane
mask. A thread stops at its first step past the row's end; with blocks, at its block's first lane's, so
that a block's lanes shuffle together (its lanes past the end read 0 and neither reduce nor store).
ABI: the combine kernels' (epic_launch(ptrs, sizes=[M, N, tile M, tile N], scalars, stream, ...)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import Program, TailKernel, topo_order
from ..passes.rewrite import make
from ..plan import tail as tail_plan
from ..shapes import Kind
from . import functor as fn
from .combine import _copy, steps_in_flight
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


class ColumnWriter(fn.ExprWriter):
    """ExprWriter over a thread's vec consecutive columns: a value is one variable per column it has
    there (vec at the accumulator's width, vec / 2 after even/odd), and one for a value constant along
    them (scalars, column vectors, and 1xB block values: a block is whole lanes' columns)."""

    def __init__(self, vec: int):
        super().__init__(pairwise=True, flavor="cuda")
        self.vec = vec

    def _width(self, v) -> int:
        if not v.shape.has_columns or v.kind is Kind.BLOCK:
            return 1
        n = v.shape.width * self.vec
        if n.denominator != 1:
            raise error("E702", f"a value {v.shape.width} times as wide as the accumulator is not supported in a "
                        "tail kernel", v.span)
        return int(n)


@dataclass
class _Pass:
    """One pass over the row's columns: the arrays it loads (pointer -> (dtype, how: True a tile, False
    a row vector, else the C++ of a per-head vector's period)), the straight-line code of a step, what
    it stores, and its 1xB blocks' lanes (the most of any block it reduces)."""
    reads: dict = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    stores: list = field(default_factory=list)
    lanes: int = 1


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
    stepwise = {v.id for v in k.values if v.kind in (Kind.TILE, Kind.ROW, Kind.BLOCK)}
    vec = tail_plan.columns_per_thread(program, k.values, k.stores)
    spec.threads = STEP // vec
    width = scalar(str(k.n), k.n)
    writer = ColumnWriter(vec)
    pointer_of: dict[str, str] = {}

    def pointer(role, t) -> str:
        if (role, t.name) not in pointer_of:
            pointer_of[(role, t.name)] = ptr(role, t.name, t.dtype)
        return pointer_of[(role, t.name)]

    def put(v, step: _Pass | None) -> None:
        """Bind a leaf to its C++ or emit v (step: the pass whose loop computes it, None outside one)."""
        p = P.prim(v.op)
        if P.is_load(v):
            t = program.tensors[v.attrs["tensor"]]
            if v.kind in (Kind.TILE, Kind.ROW):     # loaded vec columns at a time by the loop
                pp = pointer("tile" if v.kind is Kind.TILE else "row", t)
                if "period" in v.attrs:     # a per-head vector: column n reads entry n % period
                    step.reads[pp] = (t.dtype, scalar(str(v.attrs["period"]), v.attrs["period"]))
                else:
                    step.reads[pp] = (t.dtype, v.kind is Kind.TILE)
                writer.bind(v, tuple(f"float(in_{pp}[q][{e}])" for e in range(vec)))
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
            writer.bind(v, tuple(f"float(j + {e})" for e in range(vec)))
        elif p.family is P.Family.SOURCE and not P.is_literal(v):
            raise error("E702", f"'{v.op}' in a tail kernel is not supported by code generation yet", v.span)
        elif p.family is P.Family.BLOCK and p.cxx is not None:    # element-wise on a tile and its block's value
            x, b = (writer.names[a.id] for a in v.args)
            writer.bind(v, tuple(writer._new(p.cxx.format(a, b[0])) for a in x))
        elif p.family is P.Family.BLOCK and "fn" in v.attrs:     # a 1xB block reduction
            step.lanes = max(step.lanes, v.attrs["block"] // vec)
            writer.bind(v, (_block_reduce(v, writer, vec),))
        elif p.family is P.Family.BLOCK:
            raise error("E702", f"'{v.op}' in a tail kernel is not supported by code generation yet", v.span)
        else:
            writer.emit(v)

    # head: the row's constants
    for v in k.values:
        if v.id not in stepwise and v.id not in dep:
            put(v, None)
    spec.head, writer.lines = writer.lines, []

    # pass 1: what no row reduction feeds, its stores, and each row reduction's steps
    first = _Pass(stores=[s for s in k.stores if s.value.kind in (Kind.TILE, Kind.BLOCK) and s.value.id not in dep])
    for v in k.values:
        if v.id in stepwise and v.id not in dep:
            put(v, first)
    for i, r in enumerate(reds):
        red = P.reduction(r.attrs["fn"])
        x = r.args[0]
        parts = writer.emit(make(red.pre, (x,), {}, like=r)) if red.pre else writer.names[x.id]
        writer.lines += [f"if (j + {e} < W) {{ float x = {part}; {red.cxx_merge.format(a=f'acc_{i}', x='x')} }}"
                         for e, part in enumerate(parts)]
    first.lines, writer.lines = writer.lines, []
    early = _early(program, first.reads, vec, width, spec)
    spec.first = ([f"float acc_{i} = {literal(P.reduction(r.attrs['fn']).identity)};" for i, r in enumerate(reds)]
                  + ["{"] + _loop(program, first, writer, width, ptr, vec, early) + ["}"])

    # the row reductions over the CTA, then the row math
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
        if v.id not in stepwise and v.id in dep and v not in reds:
            put(v, None)
    spec.reduce += writer.lines
    spec.reductions = len(reds)
    for s in k.stores:
        if s.value.kind in (Kind.TILE, Kind.BLOCK):
            continue
        t = program.tensors[s.tensor]
        if s.value.kind is not Kind.COL or t.dtype.cuda is None:
            raise error("E702", f"storing '{t.name}' ({t.describe()}) from a tail kernel is not supported by code "
                        "generation yet", s.span)
        (x,) = writer.names[s.value.id]
        spec.stores.append(f"static_cast<{t.dtype.cuda}*>({ptr('out', t.name, t.dtype)})[m] = {_converted(x, t.dtype)};")

    # pass 2: the stores that need a row reduction, their column values recomputed
    second = _Pass(stores=[s for s in k.stores if s.value.kind in (Kind.TILE, Kind.BLOCK) and s.value.id in dep])
    if second.stores:
        for v in k.values:
            if v.id in stepwise:
                writer.names.pop(v.id, None)
        writer.lines = []
        for v in topo_order([s.value for s in second.stores]):
            if v.id in stepwise:
                put(v, second)
        second.lines, writer.lines = writer.lines, []
        spec.second = ["{"] + _loop(program, second, writer, width, ptr, vec) + ["}"]
    return spec


def _block_reduce(v, writer: ColumnWriter, vec: int) -> str:
    """The C++ of a 1xB block reduction in the loop's step: the thread's columns of its block (those
    inside the row), then the butterfly over the block's B / vec lanes (neighbours in one warp:
    plan/tail.py refuses other blocks). Every lane of the block ends with the block's value."""
    red, block = P.reduction(v.attrs["fn"]), v.attrs["block"]
    x = v.args[0]
    parts = writer.emit(make(red.pre, (x,), {}, like=x)) if red.pre else writer.names[x.id]
    acc = f"blk{writer.count}"
    writer.count += 1
    step = red.cxx_merge.format(a=acc, x="x")
    writer.lines.append(f"float {acc} = {literal(red.identity)};")
    writer.lines += [f"if (j + {e} < W) {{ float x = {part}; {step} }}" for e, part in enumerate(parts)]
    if block // vec > 1:
        writer.lines.append(f"for (int o = {block // vec // 2}; o > 0; o >>= 1) {{ "
                            f"float x = __shfl_xor_sync(group, {acc}, o); {step} }}")
    return writer._new(red.cxx_finalize.format(a=acc))


def _converted(x: str, dt) -> str:
    value = fn.store_expr(x, dt)
    return f"static_cast<{dt.cuda}>({value})" if dt.is_int else f"{dt.cuda}({value})"


def _loop(program: Program, step: _Pass, writer: ColumnWriter, width: str, ptr, vec: int,
          early: dict | None = None) -> list[str]:
    """A pass over the row's columns: thread t takes columns j .. j + vec - 1 with j = (t + q *
    kThreads) * vec in step q of a round of `steps` (steps_in_flight: it loads a round's steps before
    it computes any), until its step starts past the row's end (with 1xB blocks: its block's first
    lane's step, so that a block's lanes shuffle together; its lanes past the end read 0 and neither
    reduce nor store). Where W is a multiple of vec (every row then starts vec-element aligned, and
    tensors are 16-byte aligned) a step's loads and stores are vector moves, else one column at a time.
    A tile store's value is written after its step's reads (a finished tile may be written over the one
    it reads: each element is read and written by one thread). early: pointer -> the array with the
    thread's first step of that read, loaded before the kernel's wait."""
    early = early or {}
    steps = steps_in_flight({pp: (pp, dt) for pp, (dt, _) in step.reads.items()}, vec)
    lines = [f"const long long W = (long long)({width});", f"const bool whole = W % {vec} == 0;"]
    lines += [f"const long long per_{pp} = (long long)({how});" for pp, (_, how) in step.reads.items()
              if isinstance(how, str)]
    g = step.lanes
    if g > 1:       # a block's lanes: neighbours in one warp, aligned to their number
        lines.append(f"const unsigned group = {'0xffffffffu' if g == 32 else f'((1u << {g}) - 1u) << ((threadIdx.x & 31u) & ~{g - 1}u)'};")
    lines.append(f"for (long long base = 0; base < W; base += (long long)kThreads * {vec} * {steps}) {{")
    at_step = f"base + ((long long)q * kThreads + threadIdx.x) * {vec}"
    lead = f"j - (long long)(threadIdx.x % {g}u) * {vec}" if g > 1 else "j"
    if step.reads:
        lines += [f"  alignas(16) {dt.cuda} in_{pp}[{steps}][{vec}];" for pp, (dt, _) in step.reads.items()]
        lines += ["  #pragma unroll", f"  for (int q = 0; q < {steps}; ++q) {{", f"    const long long j = {at_step};",
                  f"    if ({lead} >= W) break;"]
        for pp, (dt, how) in step.reads.items():
            base = f"static_cast<const {dt.cuda}*>({pp})"
            if isinstance(how, str):    # a per-head vector: whole vectors where the period is a multiple of vec
                vector, at, one = f"whole && per_{pp} % {vec} == 0 && j < W", f"j % per_{pp}", f"(j + e) % per_{pp}"
            else:
                vector, at = "whole && j < W", "(long long)m * W + j" if how else "j"
                one = f"{at} + e"
            load = _copy(f"in_{pp}[q]", f"{base} + ({at})", dt, vec)
            if pp in early:         # the first step's columns are in registers already
                load = f"if (q == 0 && base == 0 && early) {{ {_copy(f'in_{pp}[q]', early[pp], dt, vec)} }} else {{ {load} }}"
            lines += [f"    if ({vector}) {{ {load} }}",
                      f"    else {{ _Pragma(\"unroll\") for (int e = 0; e < {vec}; ++e) "
                      f"in_{pp}[q][e] = j + e < W ? {base}[{one}] : {dt.cuda}(0.0f); }}"]
        lines.append("  }")
    lines += ["  #pragma unroll", f"  for (int q = 0; q < {steps}; ++q) {{", f"    const long long j = {at_step};",
              f"    if ({lead} >= W) break;"]
    lines += [f"    {line}" for line in step.lines]
    for s in step.stores:
        t = program.tensors[s.tensor]
        out = ptr("out", t.name, t.dtype)
        dst = f"static_cast<{t.dtype.cuda}*>({out})"
        parts = writer.names[s.value.id]
        if s.value.kind is Kind.BLOCK:      # the block's first lane stores its value: [M, ceil(W / B)]
            block = s.value.shape.block
            lines.append(f"    if (threadIdx.x % {block // vec}u == 0 && j < W) "
                         f"{dst}[(long long)m * ((W + {block - 1}) / {block}) + j / {block}] = {_converted(parts[0], t.dtype)};")
            continue
        lines.append(f"    alignas(16) {t.dtype.cuda} out_{out}[{vec}];")
        lines += [f"    out_{out}[{e}] = {_converted(x, t.dtype)};" for e, x in enumerate(parts)]
        lines += [f"    if (whole && j < W) {{ {_copy(f'{dst} + (long long)m * W + j', f'out_{out}', t.dtype, vec)} }}",
                  f"    else {{ _Pragma(\"unroll\") for (int e = 0; e < {vec}; ++e) "
                  f"if (j + e < W) {dst}[(long long)m * W + j + e] = out_{out}[e]; }}"]
    return lines + ["  }", "}"]


def _early(program: Program, reads: dict, vec: int, width: str, spec: TailSpec) -> dict[str, str]:
    """The pass-1 reads of the call's inputs, whose first step each thread loads before it waits for
    the gemm (spec.early; through L2, __ldcg): no kernel of the call writes an input, and the gemm lets
    this kernel start only after its own wait for the kernel before the call. pointer -> the array."""
    out = {}
    pointers = {f"p{i}": p for i, p in enumerate(spec.pointers)}
    for pp, (dt, how) in reads.items():
        if program.tensors[pointers[pp].tensor].role != "input" or isinstance(how, str):
            continue
        at = "(long long)m * W0 + j0" if how else "j0"
        spec.early += [f"alignas(16) {dt.cuda} pre_{pp}[{vec}];",
                       f"if (early) {{ {_copy(f'pre_{pp}', f'static_cast<const {dt.cuda}*>({pp}) + {at}', dt, vec, '__ldcg')} }}"]
        out[pp] = f"pre_{pp}"
    if out:
        spec.early = [f"const long long W0 = (long long)({width}), j0 = (long long)threadIdx.x * {vec};",
                      f"const bool early = W0 % {vec} == 0 && j0 < W0;   // the vector loop's first step"] + spec.early
    return out
