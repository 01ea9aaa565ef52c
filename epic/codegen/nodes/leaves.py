"""Leaf nodes: values the epilogue reads (the accumulator, extra tiles, vectors, scalars)."""
from __future__ import annotations

from ...ir import primitives as P
from ...shapes import Kind
from .base import NodeImpl


def _reads_tensor(v) -> bool:
    return P.prim(v.op).reads == "tensor"


class AccFetch(NodeImpl):
    covers = "the accumulator (acc)"

    @classmethod
    def matches(cls, b, v) -> bool:
        return P.is_accumulator(v.op)

    @classmethod
    def emit(cls, b, v) -> int:
        return b.add(cls, "Sm90AccFetch", "{}", [], "acc")


class ScalarBroadcast(NodeImpl):
    covers = "runtime scalars and dimension sizes"

    @classmethod
    def matches(cls, b, v) -> bool:
        return v.kind is Kind.SCALAR and P.family(v.op) is P.Family.SOURCE and (_reads_tensor(v) or "dim" in v.attrs)

    @classmethod
    def emit(cls, b, v) -> int:
        t = b.program.tensors.get(v.attrs.get("tensor"))
        if t is not None and t.producer:    # a whole-tensor statistic an earlier kernel stored: read on the device
            p = b.pointer("scalar", t.name, t.dtype)
            return b.add(cls, "Sm90ScalarBroadcast<float>", f"{{{{0.f}}, {{static_cast<float const*>({p})}}, {{}}}}",
                         [], f"scalar {t.name} (device)")
        name = v.attrs.get("tensor") or str(v.attrs["dim"])
        s = b.scalar(name, v.attrs.get("dim"))
        return b.add(cls, "Sm90ScalarBroadcast<float>", f"{{{{{s}}}, {{nullptr}}, {{}}}}", [], f"scalar {name}")


class AuxLoad(NodeImpl):
    covers = "extra [M, N] tiles of the accumulator's width (TMA through shared memory, or straight to registers)"

    @classmethod
    def matches(cls, b, v) -> bool:
        return _reads_tensor(v) and v.kind is Kind.TILE and v.shape.width == 1 and v.dtype.cutlass is not None

    @classmethod
    def emit(cls, b, v) -> int:
        return emit_aux_load(cls, b, v, b.program.tensors[v.attrs["tensor"]].dtype.cutlass)


def emit_aux_load(impl, b, v, el: str, note: str = "") -> int:
    """An Sm90AuxLoad of the [M, N] tile `v` reads, as elements of type `el`."""
    t = b.program.tensors[v.attrs["tensor"]]
    p = b.pointer("aux_load", t.name, t.dtype, note)
    d = b.descriptor("AuxLoadDescriptor", el)
    stages = f"{d}::Stages" if b.cfg.aux_load == "tma" else "0"     # 0: global -> registers
    return b.add(impl, f"Sm90AuxLoad<{stages}, typename {d}::EpilogueTile, {el}, StrideAux, "
                 f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpS2R>",
                 f"{{static_cast<{el} const*>({p}), {el}(0), sAux}}", [], f"load tile {t.name}")


class _VectorBroadcast(NodeImpl):
    """A vector read once per tile and broadcast: along the rows (Sm90RowBroadcast, one value per
    column) or along the columns (Sm90ColBroadcast, one value per row)."""
    kind = Kind.ROW
    role_name, cutlass, stride, what = "", "", "", ""

    @classmethod
    def matches(cls, b, v) -> bool:
        return (_reads_tensor(v) and v.kind is cls.kind and v.dtype.cutlass is not None
                and (not v.shape.has_columns or v.shape.width == 1))

    @classmethod
    def emit(cls, b, v) -> int:
        t = b.program.tensors[v.attrs["tensor"]]
        el = t.dtype.cutlass
        p = b.pointer(cls.role_name, t.name, t.dtype)
        return b.add(cls, f"{cls.cutlass}<0, TileShape, {el}, float, Stride<{cls.stride}, int64_t>>",
                     f"{{static_cast<{el} const*>({p}), {el}(0), {{}}}}", [], f"{cls.what} {t.name}")


class RowBroadcast(_VectorBroadcast):
    covers = "row vectors [N] (one value per column)"
    kind, role_name, cutlass, stride, what = Kind.ROW, "row", "Sm90RowBroadcast", "_0, _1", "row vector"


class ColBroadcast(_VectorBroadcast):
    covers = "column vectors [M] (one value per row)"
    kind, role_name, cutlass, stride, what = Kind.COL, "col", "Sm90ColBroadcast", "_1, _0", "column vector"
