"""A combine kernel of the plan -> a resolved description of a small CUDA kernel (CombineSpec).

One warp per row (axis "row") or column (axis "col"): its lanes merge the per-tile partials that the
gemm's reduction nodes wrote (layout: epic/layouts.py) in a fixed order -- lane l takes tiles l,
l + 32, ..., then an XOR butterfly merges the lanes -- so the result is the same on every run, with
the reduction's own C++ merge and finalize (its record in epic/ir/primitives.py). A warp per row
keeps a long row of tiles (cross entropy over 128256 columns: 500 to 2000 tiles) from becoming a
sequential loop of one thread. Lane 0 then evaluates the vector math that follows and stores the
results. ABI: epic_launch(ptrs, sizes=[M, N, tile M, tile N], scalars, stream, ...).

Where there are many rows (kGroupFrom, a launch-time choice), a warp takes kRowsPerWarp consecutive
rows instead (`grouped`; not for a combine that finishes tile stores, whose lanes then share a
row's columns): lane l merges row l % R at tiles l / R, l / R + 32 / R, ..., kInFlight loads at
once for each of the kernel's reductions in one loop, and the butterfly runs over the lanes of a row.
The partials are tile-major, so a warp's load then reads R neighbouring rows' 4-byte entries of
32 / R tiles, where a warp per row reads one entry of each of 32 tiles, an eighth of a 32-byte sector
each. Measured on cross entropy's combine (668 tiles a row) at M = 1024-8192 on an H100
(bench/results/2026-12-06-h100-combine-rows-sweep.log): R = 2 with 16 loads of each reduction in
flight was the fastest or level at every M (at 8192 about 50 us after its wait for the gemm, against
65-75 us for R = 4 with 8 loads and 100 us for a warp per row); R = 8 (whole sectors, a quarter as
many warps as R = 2) was the slowest everywhere: the kernel is short of loads in flight, not of
sectors. Below 4096 rows grouping measured level with a warp per row, which kGroupFrom keeps there.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dtypes
from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import CombineKernel, Program
from ..shapes import Kind
from . import functor as fn
from .cxx import identifier, literal
from .nodes import Pointer, Scalar


@dataclass
class CombineSpec:
    name: str
    symbol: str
    axis: str
    pointers: list[Pointer]
    scalars: list[Scalar]
    merge: list[str]        # every lane: merge its tiles, then the butterfly
    body: list[str]         # lane 0 (every lane when `tile` is not empty): the vector math and the stores
    stores: list[str] = field(default_factory=list)   # with `tile`: the vector stores, lane 0 only
    tile: list[str] = field(default_factory=list)     # every lane: finished tile stores, columns lane, lane + 32, ...
    grouped: bool = False   # a warp merges rows_per_warp rows (columns) at once where there are many


def lower_combine(program: Program, k: CombineKernel, folded: bool = False) -> CombineSpec:
    """folded: the code for a gemm's last CTA of a row block (codegen/nodes/fold.py) instead of a
    kernel of its own: kLanes lanes (a power of two, at most 32) share a row instead of a warp, and
    the partials, written by other CTAs of the same launch, are read through L2 (__ldcg)."""
    if folded and k.axis != "row":
        raise ValueError("only a row combine kernel folds into its gemm")
    lanes, first = ("kLanes", "kLanes / 2") if folded else ("32", "16")
    pointers: list[Pointer] = []
    scalars: list[Scalar] = []
    writer = fn.ExprWriter(pairwise=False, flavor="cuda")
    merge: list[str] = []
    body: list[str] = []
    idx = {"row": "m", "col": "n", "all": "0"}[k.axis]

    def ptr(role, tensor, dt) -> str:
        pointers.append(Pointer(role, tensor, dt))
        return f"p{len(pointers) - 1}"

    def scalar(name, dim=None) -> str:
        scalars.append(Scalar(name, dim))
        return f"s[{len(scalars) - 1}]"

    # a row combine's tiles and per-column values: the finished tile stores (epic/checks/row_finish.py)
    tiled = [v for v in k.values if v.kind in (Kind.TILE, Kind.ROW)] if k.axis == "row" else []
    if tiled and folded:
        raise ValueError("a row combine kernel that finishes tile stores does not fold")
    grouped = not folded and not tiled and k.axis in ("row", "col")
    fused: list[tuple] = []     # grouped: (i, load, step, [butterfly, result]) of each reduction, one loop for all
    for v in k.values:
        p = P.prim(v.op)
        if v in tiled:
            continue            # written in the per-column loop below
        if p.family is P.Family.COMBINE and k.axis == "all":
            i = len(merge)
            lanes = ptr("lanes", v.attrs["buffer"], dtypes.F32)
            merge += _merge_lanes(P.reduction(v.attrs["fn"]), i, lanes, scalar(str(v.attrs["width"]), v.attrs["width"]))
            writer.bind(v, (f"red_{i}",))
        elif p.family is P.Family.COMBINE and "pick" in v.attrs and not folded:
            writer.bind(v, (_pick(program, v, len(merge), merge, ptr, grouped),))
        elif p.family is P.Family.COMBINE:
            r = P.reduction(v.attrs["fn"])
            buf = ptr(f"{k.axis}_partial", v.attrs["buffer"], dtypes.F32)
            i = len(merge)
            acc = f"acc_{i}"
            tiles = "tiles_n" if k.axis == "row" else "tiles_m"
            pitch = "rows_padded" if k.axis == "row" else "cols_padded"
            merge.append(f"float {acc} = {literal(r.identity)};")
            at = f"(long long)t * {pitch} + {idx}"
            load = f"__ldcg(part_{i} + ({at}))" if folded else f"part_{i}[{at}]"
            step = r.cxx_merge.format(a=acc, x="x")
            shuffle = f"float x = __shfl_xor_sync(0xffffffffu, {acc}, o);"
            merge.append(f"const float* part_{i} = static_cast<const float*>({buf});")
            if folded:      # FOLD_IN_FLIGHT loads at once: the last CTA's merge is on the kernel's critical path
                merge.append(f"for (int t0 = lane; t0 < {tiles}; t0 += {lanes} * FOLD_IN_FLIGHT) {{ float x_[FOLD_IN_FLIGHT];")
                merge.append(f"  _Pragma(\"unroll\") for (int u = 0; u < FOLD_IN_FLIGHT; ++u) {{ const int t = t0 + u * {lanes}; x_[u] = t < {tiles} ? {load} : 0.0f; }}")
                merge.append(f"  _Pragma(\"unroll\") for (int u = 0; u < FOLD_IN_FLIGHT; ++u) {{ if (t0 + u * {lanes} < {tiles}) {{ float x = x_[u]; {step} }} }}")
                merge.append("}")
            elif not grouped:   # grouped: one loop for all reductions (_fused_merge), after their pointers
                merge.append(f"for (int t = lane; t < {tiles}; t += {lanes}) {{ float x = {load}; {step} }}")
            # the lanes of one row (column): grouped, those with lane % rows_per_warp the same
            butterfly = (f"for (int o = 16; o >= rows_per_warp; o >>= 1) {{ {shuffle} {step} }}" if grouped else
                         f"for (int o = {first}; o > 0; o >>= 1) {{ {shuffle} {step} }}")
            result = r.cxx_finalize.format(a=acc)
            if r.by_width:
                result = f"({result} / {scalar(str(v.attrs['width']), v.attrs['width'])})"
            finish = [butterfly, f"float red_{i} = {result};"]
            if grouped:
                fused.append((i, load, step, finish))
            else:
                merge += finish
            writer.bind(v, (f"red_{i}",))
        elif p.reads == "tensor":
            t = program.tensors[v.attrs["tensor"]]
            if v.kind is Kind.SCALAR and t.producer:     # a whole-tensor statistic an earlier kernel stored
                writer.bind(v, (f"(*static_cast<const float*>({ptr('scalar', t.name, t.dtype)}))",))
            elif v.kind is Kind.SCALAR:
                writer.bind(v, (scalar(t.name),))
            elif (v.kind is Kind.COL and k.axis == "row") or (v.kind is Kind.ROW and k.axis == "col"):
                if "period" in v.attrs:
                    raise error("E702", f"a per-head vector ('{t.name}') in the vector math after a column "
                                "reduction is not supported by code generation yet", v.span)
                if t.dtype.cuda is None:
                    raise error("E702", f"reading vector '{t.name}' of type {t.dtype} in a combine kernel is not "
                                "supported by code generation yet", v.span)
                pp = ptr("col" if v.kind is Kind.COL else "row", t.name, t.dtype)
                writer.bind(v, (f"float(static_cast<const {t.dtype.cuda}*>({pp})[{idx}])",))
            else:
                raise error("E702", f"a {v.shape.describe()} in a combine kernel is not supported by code "
                            "generation yet", v.span)
        elif p.family is P.Family.SOURCE and "dim" in v.attrs:
            writer.bind(v, (scalar(str(v.attrs["dim"]), v.attrs["dim"]),))
        elif p.keyword in ("row", "col") and v.kind is (Kind.COL if k.axis == "row" else Kind.ROW):
            writer.bind(v, (f"float({idx})",))
        else:
            writer.emit(v)
    if fused:
        merge += _fused_merge(fused, "tiles_n" if k.axis == "row" else "tiles_m")
    body.extend(writer.lines)
    stores: list[str] = []
    for s in k.stores:
        if s.value.kind is Kind.TILE:
            continue
        t = program.tensors[s.tensor]
        if t.dtype.cuda is None:
            raise error("E702", f"storing a {t.dtype} vector is not supported by code generation yet", s.span)
        (x,) = writer.names[s.value.id]
        out = ptr("out", t.name, t.dtype)
        value = fn.store_expr(x, t.dtype)
        conv = f"static_cast<{t.dtype.cuda}>({value})" if t.dtype.is_int else f"{t.dtype.cuda}({value})"
        stores.append(f"static_cast<{t.dtype.cuda}*>({out})[{idx}] = {conv};")
    if not tiled:
        return CombineSpec(k.name, identifier(k.name), k.axis, pointers, scalars, merge, body + stores,
                           grouped=grouped)
    writer.lines = []
    tile = _finish_tiles(program, k, tiled, writer, ptr, scalar)
    return CombineSpec(k.name, identifier(k.name), k.axis, pointers, scalars, merge, body, stores, tile)


def _pick(program: Program, v, i: int, merge: list[str], ptr, grouped: bool) -> str:
    """A row sum of select(col == L, x, 0) (split-reductions' `pick`): the one partial that can be
    nonzero, that of the tile holding column L[m], read instead of merging every tile's (0 for L[m]
    outside the columns, where no tile holds it). Every partial but that one is exactly +0, so the
    sum over tiles is this value (for N <= 2^24, where the epilogue's float column index is exact).
    Returns the C++ name of the result."""
    buf = ptr("row_partial", v.attrs["buffer"], dtypes.F32)
    t = program.tensors[v.attrs["pick"]]
    read = f"(long long)static_cast<const {t.dtype.cuda}*>({ptr('col', t.name, t.dtype)})[m]"
    read = f"live ? {read} : -1LL" if grouped else read             # a lane past M reads no label
    merge += [f"const float* part_{i} = static_cast<const float*>({buf});",
              f"const long long label_{i} = {read};",
              f"const float red_{i} = label_{i} >= 0 && label_{i} < P.N ? "
              f"part_{i}[label_{i} / P.tile_n * rows_padded + m] : 0.0f;"]
    return f"red_{i}"


FUSE_LOOPS = True    # bench: the `unfused` candidate (a loop per reduction) sets it False


def _fused_merge(reductions: list, tiles: str) -> list[str]:
    """The grouped combine's merge loops, rows_per_warp rows (columns) per warp, chosen at launch (see
    the module's docstring): one loop over the tiles merges every reduction of the kernel, so a lane
    has kInFlight loads of each in flight at once (cross entropy: its log-sum-exp and its label logit),
    then each reduction's butterfly and result. reductions: (i, load, step, [butterfly, result])."""
    groups = [reductions] if FUSE_LOOPS else [[r] for r in reductions]
    lines: list[str] = []
    for group in groups:
        lines += ["if (live && rows_per_warp == 1) {",
                  f"  for (int t = lane; t < {tiles}; t += 32) {{ "
                  + " ".join(f"{{ float x = {load}; {step} }}" for _, load, step, _ in group) + " }",
                  "} else if (live) {",
                  f"  for (int t0 = tile_lane; t0 < {tiles}; t0 += tile_lanes * kInFlight) {{ "
                  + " ".join(f"float x{i}_[kInFlight];" for i, *_ in group),
                  "    _Pragma(\"unroll\") for (int u = 0; u < kInFlight; ++u) { const int t = t0 + u * tile_lanes; "
                  + " ".join(f"x{i}_[u] = t < {tiles} ? {load} : 0.0f;" for i, load, *_ in group) + " }",
                  f"    _Pragma(\"unroll\") for (int u = 0; u < kInFlight; ++u) {{ if (t0 + u * tile_lanes < {tiles}) {{ "
                  + " ".join(f"{{ float x = x{i}_[u]; {step} }}" for i, _, step, _ in group) + " } }",
                  "  }",
                  "}"]
        for *_, finish in group:
            lines += finish
    return lines


# what a finished tile store writes: element types with a plain CUDA conversion, and packed int4
FINISHED_STORES = (dtypes.F32, dtypes.BF16, dtypes.F16, dtypes.E4M3, dtypes.E5M2, dtypes.I32, dtypes.I8, dtypes.I4)


def _finish_tiles(program: Program, k: CombineKernel, tiled: list, writer, ptr, scalar) -> list[str]:
    """The per-column loop of a row combine kernel that finishes tile stores (epic/checks/row_finish.py):
    the lanes of row m's warp take columns lane, lane + 32, ... of the stored width W, read back the
    unquantized values the gemm stored, and store the quantized ones. i4 is packed two per byte: a lane
    takes a column pair and writes one byte."""
    stored = [s for s in k.stores if s.value.kind is Kind.TILE]
    widths = {s.value.shape.width for s in stored}
    if len(widths) != 1:
        raise error("E702", "finished tile stores of different widths in one row are not supported by code "
                    "generation yet", stored[0].span)
    w = widths.pop()
    wdim = k.n * w
    width = scalar(str(wdim), wdim)
    tile_reads: dict[int, tuple[str, object]] = {}      # line index -> (pointer, dtype) of a tile read
    for v in tiled:
        p = P.prim(v.op)
        if p.reads == "tensor":
            t = program.tensors[v.attrs["tensor"]]
            if "period" in v.attrs or t.dtype.cuda is None or v.shape.width != w:
                raise error("E702", f"reading '{t.name}' ({t.describe()}) while storing a quantized tile row by row is "
                            "not supported by code generation yet", v.span)
            pp = ptr("tile" if v.kind is Kind.TILE else "row", t.name, t.dtype)
            at = "(long long)m * W + n" if v.kind is Kind.TILE else "n"
            if v.kind is Kind.TILE:
                tile_reads[len(writer.lines)] = (pp, t.dtype)
            writer.lines.append(f"const float {pp}_at = float(static_cast<const {t.dtype.cuda}*>({pp})[{at}]);")
            writer.bind(v, (f"{pp}_at",))        # loaded once: the stores in between could alias it
        elif p.keyword == "col" and v.shape.width == 1:
            writer.bind(v, ("float(n)",))
        elif p.family is P.Family.SOURCE and p.keyword:
            raise error("E702", f"'{v.op}' while storing a quantized tile row by row is not supported by code "
                        "generation yet", v.span)
        else:
            writer.emit(v)
    for s in stored:
        if program.tensors[s.tensor].dtype not in FINISHED_STORES:
            raise error("E702", f"storing '{s.tensor}' as {program.tensors[s.tensor].dtype} row by row after a row "
                        "statistic is not supported by code generation yet", s.span,
                        f"store one of {', '.join(d.name for d in FINISHED_STORES)}")
    packed = any(program.tensors[s.tensor].dtype is dtypes.I4 for s in stored)
    if not packed:
        return _vector_loop(program, stored, writer, width, tile_reads, ptr)
    per = 2                                      # int4: a lane takes a column pair and writes one byte
    lines = [f"const long long W = (long long)({width});",
             "for (long long j = lane; j < (W + 1) / 2; j += 32) {"]
    lines += [f"  unsigned pack_{i} = 0u;" for i, s in enumerate(stored)
              if program.tensors[s.tensor].dtype is dtypes.I4]
    lines += [f"  for (int e = 0; e < {per}; ++e) {{", f"    const long long n = j * {per} + e;",
              "    if (n >= W) break;"]
    lines += [f"    {line}" for line in writer.lines]
    tail = []
    for i, s in enumerate(stored):
        t = program.tensors[s.tensor]
        (x,) = writer.names[s.value.id]
        value = fn.store_expr(x, t.dtype)
        out = ptr("out", t.name, t.dtype)
        if t.dtype is dtypes.I4:
            lines.append(f"    pack_{i} |= (unsigned(static_cast<int>({value})) & 0xFu) << (4 * e);")
            tail.append(f"  static_cast<uint8_t*>({out})[(long long)m * ((W + 1) / 2) + j] = uint8_t(pack_{i});")
            continue
        conv = f"static_cast<{t.dtype.cuda}>({value})" if t.dtype.is_int else f"{t.dtype.cuda}({value})"
        lines.append(f"    static_cast<{t.dtype.cuda}*>({out})[(long long)m * W + n] = {conv};")
    return lines + ["  }"] + tail + ["}"]


def _merge_lanes(r: P.Reduction, i: int, lanes: str, count: str) -> list[str]:
    """C++ that merges `count` values (one per row or column) into one number in a fixed order, in
    one warp: lane l keeps kLanesInFlight states, state u taking values l + 32 u, l + 32 u + 32 *
    kLanesInFlight, ... (independent loads in flight); each lane merges its states in order, then an
    XOR butterfly merges the lanes. No shared memory: the result is lane 0's red_{i}."""
    acc = f"acc_{i}"
    step = lambda at: r.cxx_merge.format(a=acc + at, x="x")    # noqa: E731
    result = r.cxx_finalize.format(a=acc + "[0]")
    if r.by_width:
        result = f"({result} / float(count_{i}))"
    return [f"float {acc}[kLanesInFlight];",
        "#pragma unroll",
        f"for (int u = 0; u < kLanesInFlight; ++u) {{ {acc}[u] = {literal(r.identity)}; }}",
        f"const float* lanes_{i} = static_cast<const float*>({lanes});",
        f"const long long count_{i} = (long long)({count});",
        f"for (long long t0 = lane; t0 < count_{i}; t0 += 32 * kLanesInFlight) {{",
        "#pragma unroll",
        f"  for (int u = 0; u < kLanesInFlight; ++u) {{ const long long t = t0 + 32 * u; "
        f"if (t < count_{i}) {{ float x = lanes_{i}[t]; {step('[u]')} }} }}",
        "}",
        "#pragma unroll",
        f"for (int u = 1; u < kLanesInFlight; ++u) {{ float x = {acc}[u]; {step('[0]')} }}",
        f"for (int o = 16; o > 0; o >>= 1) {{ float x = __shfl_xor_sync(0xffffffffu, {acc}[0], o); {step('[0]')} }}",
        f"float red_{i} = {result};",
    ]


VEC = 16       # columns per lane and step of the vector loop: two 16-byte moves of a 16-bit tile
IN_FLIGHT_BYTES = 128     # bytes of tile reads each lane starts before it computes: one warp per row
#                           leaves the SMs half full, so a lane needs several steps' loads in flight


def steps_in_flight(tile_reads: dict, vec: int = VEC) -> int:
    """Vector steps a lane loads before computing any: IN_FLIGHT_BYTES of its widest tile read."""
    widest = max((read[1].bits for read in tile_reads.values()), default=16)
    return max(1, min(4, IN_FLIGHT_BYTES * 8 // (vec * widest)))


def _vector_loop(program: Program, stored: list, writer, width: str, tile_reads: dict, ptr) -> list[str]:
    """The per-column loop without packed stores: where W is a multiple of VEC (every row then starts
    VEC-element aligned, and tensors are 16-byte aligned), each lane moves VEC consecutive columns per
    step with vector loads and stores (8, 16 or 32 bytes), loading U steps (steps_in_flight) before it
    computes and stores them (a finished tile may be written over the one it reads: each element is
    read and written by one lane, its read first); else one column per step."""
    outs = {s.tensor: ptr("out", program.tensors[s.tensor].name, program.tensors[s.tensor].dtype) for s in stored}
    lane, lanes, vec = "lane", "32", VEC
    steps = steps_in_flight(tile_reads, vec)

    def body(vector: bool) -> list[str]:
        lines = [f"const float {tile_reads[i][0]}_at = float(in_{tile_reads[i][0]}[q][e]);" if vector and i in tile_reads
                 else line for i, line in enumerate(writer.lines)]
        for s in stored:
            t = program.tensors[s.tensor]
            (x,) = writer.names[s.value.id]
            value = fn.store_expr(x, t.dtype)
            conv = f"static_cast<{t.dtype.cuda}>({value})" if t.dtype.is_int else f"{t.dtype.cuda}({value})"
            lines.append(f"out_{outs[s.tensor]}[q][e] = {conv};" if vector else
                         f"static_cast<{t.dtype.cuda}*>({outs[s.tensor]})[(long long)m * W + n] = {conv};")
        return lines

    step = f"j0 + (long long)q * {lanes} * {vec}"
    lines = [f"const long long W = (long long)({width});", f"if (W % {vec} == 0) {{",
             f"  for (long long j0 = (long long){lane} * {vec}; j0 < W; j0 += {lanes} * {vec} * {steps}) {{"]
    for pp, dt, *_ in tile_reads.values():
        lines.append(f"    alignas(16) {dt.cuda} in_{pp}[{steps}][{vec}];")
    for s in stored:
        lines.append(f"    alignas(16) {program.tensors[s.tensor].dtype.cuda} out_{outs[s.tensor]}[{steps}][{vec}];")
    if tile_reads:
        lines += ["    #pragma unroll", f"    for (int q = 0; q < {steps}; ++q) {{", f"      const long long j = {step};",
                  "      if (j >= W) break;"]
        for pp, dt, *row in tile_reads.values():     # (pointer, dtype[, False: a row vector, indexed by column])
            at = "(long long)m * W + j" if not row or row[0] else "j"
            lines.append(f"      {_copy(f'in_{pp}[q]', f'static_cast<const {dt.cuda}*>({pp}) + {at}', dt, vec)}")
        lines.append("    }")
    lines += ["    #pragma unroll", f"    for (int q = 0; q < {steps}; ++q) {{", f"      const long long j = {step};",
              "      if (j >= W) break;", "      #pragma unroll", f"      for (int e = 0; e < {vec}; ++e) {{",
              "        const long long n = j + e;"]
    lines += [f"        {line}" for line in body(True)]
    lines.append("      }")
    for s in stored:
        dt = program.tensors[s.tensor].dtype
        lines.append(f"      {_copy(f'static_cast<{dt.cuda}*>({outs[s.tensor]}) + (long long)m * W + j', f'out_{outs[s.tensor]}[q]', dt, vec)}")
    lines += ["    }", "  }", "} else {", f"  for (long long n = {lane}; n < W; n += {lanes}) {{"]
    lines += [f"    {line}" for line in body(False)]
    return lines + ["  }", "}"]


def _copy(dst: str, src: str, dt, vec: int = VEC, load: str = "") -> str:
    """vec elements of dtype dt from src to dst, both aligned to vec elements, as 16-byte moves (VEC
    one-byte elements are one; vec * bits a multiple of 128). load: a function the loads go through
    (__ldcg: L2 only)."""
    return " ".join(f"reinterpret_cast<uint4*>({dst})[{i}] = {load}(reinterpret_cast<const uint4*>({src}){' + ' + str(i) if load else ''})"
                    + ("" if load else f"[{i}]") + ";" for i in range(vec * dt.bits // 128))
