"""Leaf nodes: values the epilogue reads (the accumulator, extra tiles, vectors, scalars)."""
from __future__ import annotations

from ... import dtypes
from ...plan import epilogue as pat
from .base import NodeImpl


class AccFetch(pat.AccFetch, NodeImpl):
    @classmethod
    def emit(cls, b, v) -> int:
        return b.add(cls, "Sm90AccFetch", "{}", [], "acc")


class ScalarBroadcast(pat.ScalarBroadcast, NodeImpl):
    @classmethod
    def emit(cls, b, v) -> int:
        t = b.tensors.get(v.attrs.get("tensor"))
        if t is not None and t.producer:    # a whole-tensor statistic an earlier kernel stored: read on the device
            p = b.pointer("scalar", t.name, t.dtype)
            return b.add(cls, "Sm90ScalarBroadcast<float>", f"{{{{0.f}}, {{static_cast<float const*>({p})}}, {{}}}}",
                         [], f"scalar {t.name} (device)")
        name = v.attrs.get("tensor") or str(v.attrs["dim"])
        s = b.scalar(name, v.attrs.get("dim"))
        return b.add(cls, "Sm90ScalarBroadcast<float>", f"{{{{{s}}}, {{nullptr}}, {{}}}}", [], f"scalar {name}")


class AuxLoad(pat.AuxLoad, NodeImpl):
    @classmethod
    def emit(cls, b, v) -> int:
        return emit_aux_load(cls, b, v, b.tensors[v.attrs["tensor"]].dtype.cutlass)


def emit_aux_load(impl, b, v, el: str, note: str = "") -> int:
    """An Sm90AuxLoad of the [M, N] tile `v` reads, as elements of type `el`."""
    t = b.tensors[v.attrs["tensor"]]
    p = b.pointer("aux_load", t.name, t.dtype, note)
    d = b.descriptor("AuxLoadDescriptor", el)
    stages = f"{d}::Stages" if b.cfg.aux_load == "tma" else "0"     # 0: global -> registers
    return b.add(impl, f"Sm90AuxLoad<{stages}, typename {d}::EpilogueTile, {el}, StrideAux, "
                 f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpS2R>",
                 f"{{static_cast<{el} const*>({p}), {el}(0), sAux}}", [], f"load tile {t.name}")


class HalfWidthLoad(pat.HalfWidthLoad, NodeImpl):
    """An [M, N/2] tile viewed as an [M, N] tile of containers half its element's width (bytes; f32:
    half-words), so that it loads like any tile of the accumulator's width, subtile for subtile (nothing
    is copied): column pair (2k, 2k+1) reads the low and the high container of element k. Its rows
    are 16-byte aligned exactly when the [M, N/2] tensor's are."""

    @classmethod
    def emit(cls, b, v) -> int:
        el = "uint16_t" if v.dtype is dtypes.F32 else "uint8_t"
        return emit_aux_load(cls, b, v, el, f"[M, N/2] {v.dtype} seen as [M, N] {el}")

    @classmethod
    def parts(cls, j: int, v) -> tuple[str, ...]:
        # the containers arrive as exact small integers in float; reassemble the element's bits
        lo, hi = f"uint32_t(in{j}[2 * k])", f"uint32_t(in{j}[2 * k + 1])"
        if v.dtype is dtypes.F32:
            return (f"epic_from_bits({lo} | ({hi} << 16))",)
        bits = f"({lo} | ({hi} << 8))"
        if v.dtype is dtypes.BF16:       # bf16 -> f32 is its bits shifted up
            return (f"epic_from_bits({bits} << 16)",)
        return (f"float(cutlass::half_t::bitcast(uint16_t{bits}))",)


class _VectorBroadcast(NodeImpl):
    """A vector read once per tile and broadcast: along the rows (Sm90RowBroadcast, one value per
    column) or along the columns (Sm90ColBroadcast, one value per row)."""
    role_name, cutlass, stride, what = "", "", "", ""

    @classmethod
    def emit(cls, b, v) -> int:
        t = b.tensors[v.attrs["tensor"]]
        el = t.dtype.cutlass
        p = b.pointer(cls.role_name, t.name, t.dtype)
        return b.add(cls, f"{cls.cutlass}<0, TileShape, {el}, float, Stride<{cls.stride}, int64_t>>",
                     f"{{static_cast<{el} const*>({p}), {el}(0), {{}}}}", [], f"{cls.what} {t.name}")


class RowBroadcast(pat.RowBroadcast, _VectorBroadcast):
    role_name, cutlass, stride, what = "row", "Sm90RowBroadcast", "_0, _1", "row vector"


class ColBroadcast(pat.ColBroadcast, _VectorBroadcast):
    role_name, cutlass, stride, what = "col", "Sm90ColBroadcast", "_1, _0", "column vector"
