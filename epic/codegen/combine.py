"""A combine kernel of the plan -> a resolved description of a small CUDA kernel (CombineSpec).

One thread per row (axis "row") or column (axis "col"). It merges the per-tile partials that the
gemm's Sm90ColReduction / Sm90RowReduction nodes wrote -- laid out tile-major, [tiles, round_up(M,
tile M)] for rows and [tiles, round_up(N, tile N)] for columns, so the threads of a warp read
consecutive floats -- in tile order (deterministic), then evaluates the vector math that follows
and stores the results. ABI: epic_launch(ptrs, sizes=[M, N, tile M, tile N], scalars, stream, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes
from ..ir.core import CombineKernel, Program
from ..shapes import Kind
from . import functor as fn
from .evt import Pointer, Scalar, _symbol

C_TYPES = {"f32": "float", "bf16": "__nv_bfloat16", "f16": "__half", "e4m3": "__nv_fp8_e4m3",
           "e5m2": "__nv_fp8_e5m2", "i8": "int8_t", "i32": "int32_t"}
MERGE = {"sum": "acc_{i} += x;", "mean": "acc_{i} += x;", "max": "acc_{i} = fmaxf(acc_{i}, x);",
         "min": "acc_{i} = fminf(acc_{i}, x);"}
START = {"sum": "0.f", "mean": "0.f", "max": "-INFINITY", "min": "INFINITY"}


@dataclass
class CombineSpec:
    name: str
    symbol: str
    axis: str
    pointers: list[Pointer]
    scalars: list[Scalar]
    body: list[str]


def lower_combine(program: Program, k: CombineKernel) -> CombineSpec:
    pointers: list[Pointer] = []
    scalars: list[Scalar] = []
    writer = fn.ExprWriter(pairwise=False, flavor="cuda")
    body: list[str] = []
    idx = "m" if k.axis == "row" else "n"

    def ptr(role, tensor, dt) -> str:
        pointers.append(Pointer(role, tensor, dt))
        return f"p{len(pointers) - 1}"

    def scalar(name, dim=None) -> str:
        scalars.append(Scalar(name, dim))
        return f"s[{len(scalars) - 1}]"

    for v in k.values:
        if v.op == "combine":
            fname = v.attrs["fn"]
            if fname not in MERGE:
                raise fn.unsupported(f"merging {fname} partials (online log-sum-exp) is not supported by code "
                                     "generation yet", v.span)
            p = ptr(f"{k.axis}_partial", v.attrs["buffer"], dtypes.F32)
            i = len(body)
            tiles = "tiles_n" if k.axis == "row" else "tiles_m"
            pitch = "rows_padded" if k.axis == "row" else "cols_padded"
            body.append(f"float acc_{i} = {START[fname]};")
            body.append(f"for (int t = 0; t < {tiles}; ++t) {{ float x = static_cast<const float*>({p})"
                        f"[(long long)t * {pitch} + {idx}]; {MERGE[fname].format(i=i)} }}")
            if fname == "mean":
                body.append(f"acc_{i} /= {scalar(str(v.attrs['width']), v.attrs['width'])};")
            writer.bind(v, (f"acc_{i}",))
        elif v.op == "load":
            t = program.tensors[v.attrs["tensor"]]
            if v.kind is Kind.SCALAR:
                writer.bind(v, (scalar(t.name),))
            elif (v.kind is Kind.COL and k.axis == "row") or (v.kind is Kind.ROW and k.axis == "col"):
                if t.dtype.name not in C_TYPES:
                    raise fn.unsupported(f"vector '{t.name}' of type {t.dtype}", v.span)
                p = ptr("col" if v.kind is Kind.COL else "row", t.name, t.dtype)
                writer.bind(v, (f"float(static_cast<const {C_TYPES[t.dtype.name]}*>({p})[{idx}])",))
            else:
                raise fn.unsupported(f"a {v.shape.describe()} in a combine kernel", v.span)
        elif v.op == "dim":
            writer.bind(v, (scalar(str(v.attrs["dim"]), v.attrs["dim"]),))
        elif v.op == "row_index" and k.axis == "row" or v.op == "col_index" and k.axis == "col":
            writer.bind(v, (f"float({idx})",))
        else:
            writer.emit(v)
    body.extend(writer.lines)
    for s in k.stores:
        t = program.tensors[s.tensor]
        if t.dtype.name not in C_TYPES:
            raise fn.unsupported(f"storing a {t.dtype} vector", s.span)
        (x,) = writer.names[s.value.id]
        p = ptr("out", t.name, t.dtype)
        ctype = C_TYPES[t.dtype.name]
        value = fn.store_expr(x, t.dtype)
        conv = f"static_cast<{ctype}>({value})" if t.dtype.is_int else f"{ctype}({value})"
        body.append(f"static_cast<{ctype}*>({p})[{idx}] = {conv};")
    return CombineSpec(k.name, _symbol(k.name), k.axis, pointers, scalars, body)
