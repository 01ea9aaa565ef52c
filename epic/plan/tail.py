"""The decode tail (a gemm's configuration `combine=tail`): the gemm stores only its accumulator, and
one kernel after it runs the gemm's whole epilogue and its row combine kernel's math, one CTA per row.

At decode sizes each CTA has one tile, so its epilogue runs after its mainloop with nothing to hide
behind, and a row statistic adds a combine kernel that waits for the gemm (docs/PERFORMANCE.md,
"Decode"). Here a gemm K and the row combine kernel C right after it (the one that merges K's
partials) become, in the plan's program:
  K  the same gemm, storing its accumulator as f32 into K__acc and nothing else;
  K__tail  K's epilogue values with the accumulator read back from K__acc, every per-tile partial
     replaced by the whole row's reduction, then C's values on those reductions, and every store of
     K (but its partials and the tiles it stored for C to read back) and of C.
Nothing is rounded that the fused plan does not round: the epilogue computes in f32, and K__acc is f32.
Made at plan time (planner.make_plan, emit.specs), because the configuration depends on the sizes;
`epic plan` prints the kernels it gives.
"""
from __future__ import annotations

from dataclasses import replace

from .. import dtypes
from ..diagnostics import Span, error
from ..dtypes import F32
from ..ir import primitives as P
from ..ir.core import Program, Store, TailKernel, Tensor, Value, topo_order
from ..passes.rewrite import copy_with, make
from ..shapes import Kind

# what the tail kernel stores as a tile: element types with a plain CUDA conversion (not packed int4)
TAIL_TILE_STORES = (dtypes.F32, dtypes.BF16, dtypes.F16, dtypes.E4M3, dtypes.E5M2, dtypes.I32, dtypes.I8)


# The heuristic takes the tail for a gemm of at most TAIL_ROWS rows (the small-M tile's range) whose N is
# known and at most TAIL_N, where the tail can run its epilogue. Residual + RMSNorm at N = 4096 on an H100,
# ratio to cuBLAS, default (fused epilogue + row combine kernel) against the tail
# (bench/results/2026-12-07-h100-interleaved-tail-*.json): M = 1: 1.268 / 1.197, 16: 1.190 / 1.122,
# 64: 1.165 / 1.094, 128: 1.209 / 1.108, 256: 1.212 / 1.171; the pre-norm first half (the tail then feeds
# the next gemm) 1.035 / 1.020 to 1.075 / 1.070. Cross entropy over 128256 columns was slower with it
# (0.978 / 1.155 at M = 64: the accumulator's round trip), hence TAIL_N, and a gemm that stores no tile
# (its epilogue writes only per-tile partials, as cross entropy's) keeps its combine kernel: what the
# tail takes out of the gemm is its tile loads and stores.
TAIL_ROWS, TAIL_N = 256, 8192


def by_heuristic(program: Program, configs: dict, rows: dict, ns: dict, overrides: dict | None) -> dict:
    """configs with combine=tail where the heuristic takes it (above): not where the file or the call
    chose a combine, nor for a gemm on the vendor's library or split along K (nor, so, for the
    vocabulary-parallel call, epic.distributed.run_sharded, whose gemm stores no tile). rows, ns: each gemm's M
    and N (None where the sizes leave N open)."""
    out = dict(configs)
    for k in program.kernels:
        cfg = configs.get(k.name)
        if k.kind != "gemm" or cfg is None or cfg.combine != "kernel" or cfg.vendor or cfg.split_k:
            continue
        chosen = "combine" in (k.options or {}) or "combine" in ((overrides or {}).get(k.name) or {})
        n = ns.get(k.name)
        tiles = any(s.value.kind is Kind.TILE and program.tensors[s.tensor].role != "partial" for s in k.stores)
        if chosen or not tiles or rows[k.name] > TAIL_ROWS or n is None or n > TAIL_N or refusal(program, k):
            continue
        out[k.name] = replace(cfg, combine="tail")
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


def refusal(program: Program, k) -> tuple[str, Span | None] | None:
    """Why gemm k's epilogue cannot run as a decode tail (a reason and where), None when it can."""
    c = row_combine_after(program, k)
    if c is None:
        return ("it has no row statistic: combine=tail runs a gemm's epilogue and the row combine kernel "
                "after it as one kernel", k.span)
    if k.acc is not F32:
        return (f"it accumulates in {k.acc} (the tail reads an f32 accumulator)", k.span)
    other = next((x for x in program.kernels if x.kind == "combine" and x.source == k.name and x is not c), None)
    if other is not None:
        return (f"it has {'column' if other.axis == 'col' else 'whole-tensor'} statistics too (the tail "
                "reduces rows only)", other.span)
    for v in [*k.values, *c.values]:
        why = _unsupported(program, v)
        if why:
            return why, v.span
    for s in [*k.stores, *c.stores]:
        t = program.tensors[s.tensor]
        if t.role == "partial" or s.value.kind not in (Kind.TILE, Kind.ROW, Kind.BLOCK):
            continue
        if s.value.kind is not Kind.TILE or s.value.shape.width != 1:
            return (f"it stores '{t.name}' as a {s.value.shape.describe()} (the tail stores tiles as wide as "
                    "the accumulator, and column vectors)", s.span)
        if t.dtype not in TAIL_TILE_STORES:
            return (f"it stores '{t.name}' as {t.dtype} (the tail stores "
                    f"{', '.join(d.name for d in TAIL_TILE_STORES)})", s.span)
    return None


def _unsupported(program: Program, v: Value) -> str | None:
    """Why value v cannot be computed in a tail kernel; None when it can."""
    p = P.prim(v.op)
    if v.kind is Kind.BLOCK or p.family is P.Family.BLOCK:
        return f"'{v.op}' is a block statistic (the tail reduces whole rows only)"
    if p.family is P.Family.PAIR:
        return f"'{v.op}' pairs columns (the tail computes one column at a time)"
    if v.kind in (Kind.TILE, Kind.ROW) and v.shape.width != 1:
        return f"'{v.op}' gives a {v.shape.describe()} (the tail computes values as wide as the accumulator)"
    if p.family in (P.Family.PARTIAL, P.Family.COMBINE) and v.attrs["axis"] != "row":
        return f"a {v.attrs['axis']} reduction (the tail reduces rows only)"
    if P.is_load(v):
        t = program.tensors[v.attrs["tensor"]]
        if "period" in v.attrs:
            return f"'{t.name}' is read once per {v.attrs['period']} columns (the tail reads whole rows)"
        if t.dtype.cuda is None or (v.kind is Kind.TILE and t.layout != "row"):
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
    back = {v.attrs["tensor"] for v in c.values if P.is_load(v)}      # tiles K stored for C (split-reductions)
    for s in k.stores:
        t = tensors[s.tensor]
        if t.role == "partial":
            del tensors[s.tensor]
        elif t.role == "buffer" and s.tensor in back:
            read_back[s.tensor] = mapped[s.value.id]
            del tensors[s.tensor]
        else:
            stores.append(Store(s.tensor, mapped[s.value.id], s.span))
    for v in c.values:
        if v.id in mapped:
            continue
        if P.family(v.op) is P.Family.COMBINE:
            mapped[v.id] = reductions[v.attrs["buffer"]]
        elif P.is_load(v) and v.attrs["tensor"] in read_back:
            mapped[v.id] = read_back[v.attrs["tensor"]]
        else:
            args = tuple(mapped[a.id] for a in v.args)
            mapped[v.id] = copy_with(v, args) if args else v
    stores += [Store(s.tensor, mapped[s.value.id], s.span) for s in c.stores]
    for s in stores:
        tensors[s.tensor] = replace(tensors[s.tensor], producer=name)
    tail = TailKernel(name, k.name, "row", k.rows, k.n, topo_order([s.value for s in stores]), stores, span=k.span)
    return [gemm, tail]
