"""The decode tail (a gemm's configuration `combine=tail`): the gemm stores only its accumulator, and
one kernel after it runs the gemm's whole epilogue and its row combine kernel's math, one CTA per row.

At decode sizes each CTA has one tile, so its epilogue runs after its mainloop with nothing to hide
behind, and a row statistic adds a combine kernel that waits for the gemm (docs/PERFORMANCE.md,
"Decode"); a 1xB block statistic (QK-norm's heads, fp8's scale blocks) splits each block over a 1x2
cluster whose CTAs exchange their halves. Here a gemm K and the row combine kernel C right after it
(the one that merges K's partials; none where K has block statistics only) become, in the plan's
program:
  K  the same gemm, storing its accumulator as f32 into K__acc and nothing else;
  K__tail  K's epilogue values with the accumulator read back from K__acc, every per-tile partial
     replaced by the whole row's reduction, then C's values on those reductions, and every store of
     K (but its partials and the tiles it stored for C to read back) and of C. A thread of the tail
     holds VEC consecutive columns, so a column pair (RoPE's) is one thread's and a 1xB block
     B / VEC neighbouring lanes' (columns_per_thread).
Nothing is rounded that the fused plan does not round: the epilogue computes in f32, and K__acc is f32.
Made at plan time (planner.make_plan, emit.specs), because the configuration depends on the sizes;
`epic plan` prints the kernels it gives.
"""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .. import dtypes
from ..diagnostics import Span, error
from ..dtypes import F32
from ..ir import primitives as P
from ..ir.core import Program, Store, TailKernel, Tensor, Value, topo_order
from ..passes.rewrite import copy_with, make
from ..shapes import Kind

# what the tail kernel stores as a tile: element types with a plain CUDA conversion (not packed int4)
TAIL_TILE_STORES = (dtypes.F32, dtypes.BF16, dtypes.F16, dtypes.E4M3, dtypes.E5M2, dtypes.I32, dtypes.I8)
# A tail thread holds VEC consecutive columns per step: 16-byte moves of 16-bit elements, or of 1-byte
# ones where a tile read or store has them (codegen/tail.py: measured). A 1xB block is then the lanes'
# butterfly over B / VEC lanes of a warp.
VEC_16BIT, VEC_8BIT = 8, 16


# The heuristic takes the tail for a gemm of at most TAIL_ROWS rows (the small-M tile's range) whose N is
# known and at most TAIL_N, where the tail can run its epilogue. Residual + RMSNorm at N = 4096 on an H100,
# ratio to cuBLAS, default (fused epilogue + row combine kernel) against the tail
# (bench/results/2026-12-07-h100-interleaved-tail-*.json): M = 1: 1.268 / 1.197, 16: 1.190 / 1.122,
# 64: 1.165 / 1.094, 128: 1.209 / 1.108, 256: 1.212 / 1.171; the pre-norm first half (the tail then feeds
# the next gemm) 1.035 / 1.020 to 1.075 / 1.070. Cross entropy over 128256 columns was slower with it
# (0.978 / 1.155 at M = 64: the accumulator's round trip), hence TAIL_N, and a gemm that stores no tile
# (its epilogue writes only per-tile partials, as cross entropy's) keeps its combine kernel: what the
# tail takes out of the gemm is its tile loads and stores.
# A gemm with 1xB block statistics and no row statistic has no combine kernel to save: the tail takes
# its epilogue out of the gemm from BLOCK_TAIL_ROWS rows on, past one row of 64-row tiles. QK-norm + RoPE
# / fp8 1x128 quantization at N = 4096 on an H100, the gemm's own epilogue against the tail
# (bench/results/2026-12-07-h100-interleaved-blocks-tail*.json): M = 1: 1.217 / 1.259, 1.182 / 1.220; 16:
# 1.177 / 1.221, 1.071 / 1.162; 128: 1.283 / 1.163, 1.285 / 1.138; 256: 1.329 / 1.201, 1.317 / 1.158. At
# 64 rows, with the split blocks' halves exchanged through shared memory (2026-12-07-h100-pair-exchange-
# smem.log, four runs): QK-norm 1.121-1.132 against 1.137-1.158, fp8 1.119-1.121 against 1.116-1.121.
TAIL_ROWS, TAIL_N, BLOCK_TAIL_ROWS = 256, 8192, 65


def by_heuristic(program: Program, configs: dict, rows: dict, ns: dict, overrides: dict | None,
                 choose=None) -> dict:
    """configs with combine=tail where the heuristic takes it (above): not where the file or the call
    chose a combine, nor for a gemm on the vendor's library or split along K (nor, so, for the
    vocabulary-parallel call, epic.distributed.run_sharded, whose gemm stores no tile). rows, ns: each gemm's M
    and N (None where the sizes leave N open). choose(kernel, override) -> the configuration the plan
    chooses with these per-gemm overrides (config.choose at the gemm's sizes): a gemm that takes the
    tail is chosen again with combine=tail, which leaves out what its block statistics needed (a 1x2
    cluster sharing each block, an epilogue subtile as wide as one); None: combine=tail on the same
    configuration."""
    out = dict(configs)
    for k in program.kernels:
        cfg = configs.get(k.name)
        if k.kind != "gemm" or cfg is None or cfg.combine != "kernel" or cfg.vendor or cfg.split_k:
            continue
        chosen = "combine" in (k.options or {}) or "combine" in ((overrides or {}).get(k.name) or {})
        n = ns.get(k.name)
        tiles = any(s.value.kind is Kind.TILE and program.tensors[s.tensor].role != "partial" for s in k.stores)
        least = 1 if row_combine_after(program, k) is not None else BLOCK_TAIL_ROWS
        if chosen or not tiles or not _statistics(program, k) or not least <= rows[k.name] <= TAIL_ROWS \
                or n is None or n > TAIL_N or refusal(program, k):
            continue
        override = {**((overrides or {}).get(k.name) or {}), "combine": "tail"}
        out[k.name] = choose(k, override) if choose else replace(cfg, combine="tail")
    return out


def acc_buffer(gemm: str) -> str:
    return f"{gemm}__acc"


def tail_name(gemm: str) -> str:
    return f"{gemm}__tail"


def row_combine_after(program: Program, k) -> object | None:
    """The row combine kernel right after gemm k that merges k's partials; None when there is none."""
    i = program.kernels.index(k)
    c = program.kernels[i + 1] if i + 1 < len(program.kernels) else None
    if c is not None and c.kind == "combine" and c.axis == "row" and c.source == k.name:
        return c
    return None


def _statistics(program: Program, k) -> bool:
    """Whether gemm k has a row statistic (a row combine kernel after it) or a 1xB block statistic."""
    return row_combine_after(program, k) is not None or any(P.family(v.op) is P.Family.BLOCK for v in k.values)


def columns_per_thread(program: Program, values: list[Value], stores: list) -> int:
    """A tail thread's columns per step for these values and stores (VEC_8BIT where a tile or row
    read or a tile store has 1-byte elements, else VEC_16BIT)."""
    dts = [program.tensors[v.attrs["tensor"]].dtype for v in values
           if P.is_load(v) and v.kind in (Kind.TILE, Kind.ROW) and "period" not in v.attrs]
    dts += [program.tensors[s.tensor].dtype for s in stores
            if s.value.kind is Kind.TILE and program.tensors[s.tensor].role != "partial"]
    return VEC_8BIT if any(dt.bits == 8 for dt in dts) else VEC_16BIT


def refusal(program: Program, k) -> tuple[str, Span | None] | None:
    """Why gemm k's epilogue cannot run as a decode tail (a reason and where), None when it can."""
    c = row_combine_after(program, k)
    if not _statistics(program, k):
        return ("it has no row or block statistic: combine=tail runs a gemm's epilogue with its statistics "
                "(and the row combine kernel after it) as one kernel", k.span)
    if k.acc is not F32:
        return (f"it accumulates in {k.acc} (the tail reads an f32 accumulator)", k.span)
    other = next((x for x in program.kernels if x.kind == "combine" and x.source == k.name and x is not c), None)
    if other is not None:
        return (f"it has {'column' if other.axis == 'col' else 'whole-tensor'} statistics too (the tail "
                "reduces rows only)", other.span)
    values, stores = [*k.values, *(c.values if c else [])], [*k.stores, *(c.stores if c else [])]
    vec = columns_per_thread(program, values, stores)
    for v in values:
        why = _unsupported(program, v, vec)
        if why:
            return why, v.span
    for s in stores:
        t = program.tensors[s.tensor]
        if t.role == "partial" or s.value.kind not in (Kind.TILE, Kind.ROW, Kind.BLOCK):
            continue
        if s.value.kind is Kind.ROW or s.value.shape.width != 1:
            return (f"it stores '{t.name}' as a {s.value.shape.describe()} (the tail stores tiles and 1xB block "
                    "values as wide as the accumulator, and column vectors)", s.span)
        if t.dtype not in TAIL_TILE_STORES:
            return (f"it stores '{t.name}' as {t.dtype} (the tail stores "
                    f"{', '.join(d.name for d in TAIL_TILE_STORES)})", s.span)
    return None


def _unsupported(program: Program, v: Value, vec: int) -> str | None:
    """Why value v cannot be computed in a tail kernel whose threads hold vec columns; None when it can."""
    p = P.prim(v.op)
    if v.kind is Kind.BLOCK or p.family is P.Family.BLOCK:
        block = v.attrs.get("block") or v.shape.block      # block_quant gives a tile: its attribute says
        if v.shape.width != 1:
            return (f"'{v.op}' gives 1x{block} blocks of a value narrower than the accumulator (the tail reduces "
                    "blocks of its full width)")
        if block % vec or block // vec > 32:
            return (f"'{v.op}' reduces 1x{block} blocks (the tail's threads hold {vec} columns each, and a block "
                    f"is the columns of 1 to 32 neighbouring lanes: a multiple of {vec} up to {32 * vec})")
    if v.kind in (Kind.TILE, Kind.ROW) and v.shape.width not in (1, Fraction(1, 2)):
        return f"'{v.op}' gives a {v.shape.describe()} (the tail computes values as wide as the accumulator or half)"
    if p.family in (P.Family.PARTIAL, P.Family.COMBINE) and v.attrs["axis"] != "row":
        return f"a {v.attrs['axis']} reduction (the tail reduces rows only)"
    if p.family in (P.Family.PARTIAL, P.Family.REDUCE, P.Family.BLOCK) and any(
            a.shape.has_columns and a.shape.width != 1 for a in v.args):
        return f"'{v.op}' reduces a value narrower than the accumulator (the tail reduces its full width)"
    if P.is_load(v):
        t = program.tensors[v.attrs["tensor"]]
        if t.dtype.cuda is None or (v.kind is Kind.TILE and t.layout != "row") or (
                v.shape.has_columns and v.shape.width != 1):
            return f"'{t.name}' ({t.describe()}) is not read by the tail's code generation"
    return None


def rewrite(program: Program, configs: dict) -> Program:
    """The program with each gemm whose configuration says combine=tail and the row combine kernel
    after it replaced by that gemm storing its accumulator and a tail kernel (the module's docstring).
    Raises E216 where such a gemm cannot take it. A program rewritten already comes back as it is."""
    done = {k.source for k in program.kernels if k.kind == "tail"}
    tails = {k.name for k in program.kernels if k.kind == "gemm" and k.name in configs
             and configs[k.name].combine == "tail" and k.name not in done}
    if not tails:
        return program
    tensors, kernels, merged = dict(program.tensors), [], set()
    for k in program.kernels:
        if k.name in merged:
            continue
        if k.name not in tails:
            kernels.append(k)
            continue
        why = refusal(program, k)
        if why is not None:
            raise error("E216", f"gemm '{k.name}' cannot take combine=tail: {why[0]}", why[1],
                        "use combine=kernel (the default) or combine=fold")
        c = row_combine_after(program, k)
        if c is not None:
            merged.add(c.name)
        kernels += _split(program, k, c, tensors)
    return program.replace_kernels(kernels, tensors)


def _split(program: Program, k, c, tensors: dict) -> list:
    acc = next((v for v in k.values if P.is_accumulator(v.op)), None) or make("acc", (), {})
    buf = acc_buffer(k.name)
    tensors[buf] = Tensor(buf, F32, (k.rows, k.n), "buffer", k.span, producer=k.name)
    gemm = k.with_values([acc], [Store(buf, acc, k.span)])
    name = tail_name(k.name)
    mapped: dict[int, Value] = {acc.id: make("load", (), {"tensor": buf, "dtype": F32, "shape": acc.shape},
                                             like=acc, name=buf)}
    reductions: dict[str, Value] = {}        # a partial buffer -> the whole row's reduction
    read_back: dict[str, Value] = {}         # a tile K stored for C to read back -> its value here
    stores: list[Store] = []
    for v in k.values:
        if v.id in mapped:
            continue
        args = tuple(mapped[a.id] for a in v.args)
        if P.family(v.op) is P.Family.PARTIAL:
            mapped[v.id] = reductions[v.attrs["buffer"]] = make(
                "reduce", args, {"axis": "row", "fn": v.attrs["fn"]}, like=v, name=v.name)
        else:
            mapped[v.id] = copy_with(v, args) if args else v
    c_values, c_stores = (c.values, c.stores) if c is not None else ([], [])
    back = {v.attrs["tensor"] for v in c_values if P.is_load(v)}      # tiles K stored for C (split-reductions)
    for s in k.stores:
        t = tensors[s.tensor]
        if t.role == "partial":
            del tensors[s.tensor]
        elif t.role == "buffer" and s.tensor in back:
            read_back[s.tensor] = mapped[s.value.id]
            del tensors[s.tensor]
        else:
            stores.append(Store(s.tensor, mapped[s.value.id], s.span))
    for v in c_values:
        if v.id in mapped:
            continue
        if P.family(v.op) is P.Family.COMBINE:
            mapped[v.id] = reductions[v.attrs["buffer"]]
        elif P.is_load(v) and v.attrs["tensor"] in read_back:
            mapped[v.id] = read_back[v.attrs["tensor"]]
        else:
            args = tuple(mapped[a.id] for a in v.args)
            mapped[v.id] = copy_with(v, args) if args else v
    stores += [Store(s.tensor, mapped[s.value.id], s.span) for s in c_stores]
    for s in stores:
        tensors[s.tensor] = replace(tensors[s.tensor], producer=name)
    tail = TailKernel(name, k.name, "row", k.rows, k.n, topo_order([s.value for s in stores]), stores, span=k.span)
    return [gemm, tail]
