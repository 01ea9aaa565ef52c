"""Reduction splitting: every whole-row/column reduction becomes per-tile partials + a combine kernel.

In the gemm, `reduce(X)` turns into a `partial` sink that writes one state per (row, tile of
columns) -- deterministic, no atomics -- into a buffer. A combine kernel placed right after the
gemm reads only those partials, merges them in tile order with the reduction's own merge rule
(epic/ir/primitives.py: sums add, max/min compare, mean divides by the width, log-sum-exps merge
as log(exp(a) + exp(b))), then
computes the vector math that follows the reductions and performs the stores that need it.
Vector stores that need no reduction (a scaled column vector) move there too: a gemm epilogue
stores tiles only. A quantizing tile store that needs a row statistic (dynamic per-token
quantization, epic/checks/row_finish.py) moves to the row combine kernel: the gemm stores the
unquantized tile-local value into NAME__preI, and the combine kernel reads it back row by row.
Buffers and kernels made here are named NAME__..., a namespace user names cannot enter.

A whole-tensor reduction (all_f(x) = col_f(row_f(x)): the last step reduces a vector) takes one more
kernel: the combine kernel that owns the vector stores it, pre-mapped (amax: abs), into a buffer of
one value per row (or column); an "all" combine kernel (one warp) merges those in a fixed order and
computes and stores the scalar math that follows.
"""
from __future__ import annotations

from dataclasses import replace

from .. import dtypes
from ..checks import row_finish
from ..checks.locality import reductions_feeding, whole_reductions_feeding
from ..dtypes import F32
from ..ir import primitives as P
from ..ir.core import CombineKernel, Store, Tensor, Value, topo_order
from ..shapes import Kind
from .rewrite import copy_with, make


def run(program, trace=None):
    kernels, tensors = [], dict(program.tensors)
    unscalable = row_finish.unscalable_reads(program)
    for k in program.kernels:
        if k.kind != "gemm":
            kernels.append(k)
            continue
        dep, whole = reductions_feeding(k), whole_reductions_feeding(k)
        in_gemm = row_finish.left_in_gemm(k, tensors, dep, unscalable)
        if any(v.kind in (Kind.TILE, Kind.BLOCK) for v in k.values
               if v.id in dep and not _is_reduce(v) and v.id in in_gemm) or \
                any(v.kind is not Kind.SCALAR for v in k.values if v.id in whole):
            kernels.append(k)   # a locality error the checker will report
            continue
        if not dep and not any(s.value.kind in (Kind.COL, Kind.ROW) for s in k.stores):
            kernels.append(k)   # nothing to split
            continue
        kernels.extend(_split(k, dep, tensors, unscalable))
    return program.replace_kernels(kernels, tensors)


def _is_reduce(v: Value) -> bool:
    return P.family(v.op) is P.Family.REDUCE


def _is_tile_reduce(v: Value) -> bool:
    return _is_reduce(v) and v.kind is not Kind.SCALAR


def _is_whole_reduce(v: Value) -> bool:
    return _is_reduce(v) and v.kind is Kind.SCALAR


def combine_name(gemm: str, axis: str) -> str:
    return f"{gemm}__{axis}_combine"


def _store_axis(s: Store, dep: dict, finished: set[int]) -> str | None:
    """Which combine kernel a store belongs to: vectors go to the one over rows (COL) or columns (ROW),
    whole-tensor statistics to the one over everything, quantizing tiles that need a row statistic
    to the one over rows (it reads back the unquantized value the gemm stores)."""
    if id(s) in finished:
        return "row"
    if s.value.kind is Kind.SCALAR:
        return "all"
    if s.value.id in dep:
        return dep[s.value.id].attrs["axis"]
    return {Kind.COL: "row", Kind.ROW: "col"}.get(s.value.kind)


def _split(k, dep: dict, tensors: dict, unscalable: frozenset) -> list:
    finished = {id(s) for s in row_finish.finished_stores(k, tensors, dep, unscalable)}
    local_stores = [s for s in k.stores if _store_axis(s, dep, finished) is None]
    partial_stores: list[Store] = []
    combines = []
    wholes = [v for v in k.values if _is_whole_reduce(v)]
    all_mapped: dict[int, Value] = {}
    for axis in ("row", "col"):
        reduces = [v for v in k.values if _is_tile_reduce(v) and v.attrs["axis"] == axis]
        stores = [s for s in k.stores if _store_axis(s, dep, finished) == axis]
        vector = Kind.COL if axis == "row" else Kind.ROW
        for i, w in enumerate(v for v in wholes if v.args[0].kind is vector):
            stores.append(_lanes_store(k, w, i, axis, tensors, all_mapped))
        if not reduces and not stores:
            continue
        mapped: dict[int, Value] = {}
        for i, r in enumerate(reduces):
            buf = f"{k.name}__{r.name or axis + '_' + r.attrs['fn']}_part{i}"
            x = r.args[0]
            tensors[buf] = Tensor(buf, F32, (k.rows, k.n * x.shape.width), "partial",
                                  r.span, producer=k.name, tiles_axis="n" if axis == "row" else "m")
            attrs = {"axis": axis, "fn": r.attrs["fn"], "buffer": buf}
            partial = make("partial", (x,), attrs, like=r, name=r.name)
            partial_stores.append(Store(buf, partial, r.span))
            width = k.n * x.shape.width if axis == "row" else k.rows
            pick = _picked_column(r, tensors)
            mapped[r.id] = make("combine", (), dict(attrs, width=width, of_width=x.shape.width,
                                                    **({"pick": pick} if pick else {})), like=r, name=r.name)
        for s in stores:
            if id(s) in finished:
                partial_stores += _read_back(k, s, dep, tensors, mapped)
        for s in stores:
            _copy_into(s.value, mapped)
        new_stores = [Store(s.tensor, mapped[s.value.id], s.span) for s in stores]
        name = combine_name(k.name, axis)
        for s in stores:
            tensors[s.tensor] = replace(tensors[s.tensor], producer=name)
        combines.append(CombineKernel(name, k.name, axis, k.rows, k.n,
                                      topo_order([s.value for s in new_stores]), new_stores, span=k.span))
    whole_stores = [s for s in k.stores if _store_axis(s, dep, finished) == "all"]
    if whole_stores:
        for s in whole_stores:
            _copy_into(s.value, all_mapped)
        name = combine_name(k.name, "all")
        for s in whole_stores:
            tensors[s.tensor] = replace(tensors[s.tensor], producer=name)
        new_stores = [Store(s.tensor, all_mapped[s.value.id], s.span) for s in whole_stores]
        combines.append(CombineKernel(name, k.name, "all", k.rows, k.n,
                                      topo_order([s.value for s in new_stores]), new_stores, span=k.span))
    stores = local_stores + partial_stores
    gemm = k.with_values(topo_order([s.value for s in stores]), stores)
    return [gemm] + [c for c in combines if c.stores]


PICK = True     # bench: the `unpicked` candidate (every tile's partial merged) sets it False


def _picked_column(r: Value, tensors: dict) -> str | None:
    """The input L of a row sum of select(col == L, x, 0) (cross entropy's row_pick) where L is an
    integer column vector the program reads: every tile's partial of row m is exactly 0 but that of
    the tile holding column L[m] (none for L[m] outside the columns), so the combine kernel reads that
    one partial instead of merging all (codegen/combine.py). None for any other reduction."""
    x = r.args[0]
    selected = P.selected_column(x)
    if not PICK or r.attrs["fn"] != "sum" or r.attrs["axis"] != "row" or x.shape.width != 1 or selected is None:
        return None
    label = selected[0]
    if not P.is_load(label):
        return None
    t = tensors.get(label.attrs["tensor"])
    if t is None or t.role != "input" or "period" in label.attrs or label.kind is not Kind.COL or \
            not label.dtype.is_int or label.dtype.cuda is None:
        return None
    return t.name


def _read_back(k, s: Store, dep: dict, tensors: dict, mapped: dict) -> list[Store]:
    """A finished store's tile-local inputs: the gemm stores each (in its own dtype: nothing is rounded
    that the source program does not round) into a buffer NAME__preI, which the row combine kernel
    loads back as a tile. Returns the gemm's new stores."""
    out = []
    for i, v in enumerate(row_finish.frontier(s, dep)):
        if v.id in mapped:          # shared with another finished store
            continue
        dt = F32 if v.dtype in dtypes.PACKED else v.dtype      # packed 4-bit values: f32 holds them exactly
        buf = f"{s.tensor}__pre{i}"
        tensors[buf] = Tensor(buf, dt, v.shape.dims(k.rows, k.n), "buffer", s.span, producer=k.name)
        out.append(Store(buf, v, s.span))
        mapped[v.id] = make("load", (), {"tensor": buf, "dtype": dt, "shape": v.shape}, like=v, name=buf)
    return out


def _lanes_store(k, w: Value, i: int, axis: str, tensors: dict, all_mapped: dict) -> Store:
    """The vector a whole-tensor reduction w reduces, stored (pre-mapped) by the combine kernel over
    `axis` into a buffer of one value per row/column; w itself becomes the "all" kernel's combine."""
    r = P.reduction(w.attrs["fn"])
    x = w.args[0]
    buf = f"{k.name}__{w.name or 'all_' + r.name}_lanes{i}"
    count = k.rows if axis == "row" else k.n * x.shape.width
    tensors[buf] = Tensor(buf, F32, (count,), "buffer", w.span, producer=combine_name(k.name, axis))
    lanes = make(r.pre, (x,), {}, like=w) if r.pre else x
    all_mapped[w.id] = make("combine", (), {"axis": "all", "fn": r.name, "buffer": buf, "width": count,
                                           "of_width": x.shape.width}, like=w, name=w.name)
    return Store(buf, lanes, w.span)


def _copy_into(root: Value, mapped: dict) -> Value:
    """Rebuild root (vector math after the reductions) on the combine kernel's values: a fresh
    value per kernel, operands first (iteratively: the chain may be long)."""
    stack = [(root, False)]
    while stack:
        v, ready = stack.pop()
        if v.id in mapped:
            continue
        if not ready:
            stack.append((v, True))
            stack.extend((a, False) for a in v.args if a.id not in mapped)
            continue
        args = tuple(mapped[a.id] for a in v.args)
        mapped[v.id] = copy_with(v, args) if args else make(v.op, (), v.attrs, like=v, name=v.name)
    return mapped[root.id]
