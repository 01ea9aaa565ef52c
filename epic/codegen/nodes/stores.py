"""Store nodes: extra output tiles, the output that goes through the collective as D, and
deterministic per-tile partials of reductions (FinalReduction=false: no atomics)."""
from __future__ import annotations

from ... import dtypes
from ...ir import primitives as P
from ...ir.core import make
from ...shapes import Kind
from ..cxx import literal
from .base import NodeImpl

# what the collective can store as D (converted from the root node's float results)
D_TYPES = (dtypes.BF16, dtypes.F16, dtypes.F32, dtypes.E4M3, dtypes.E5M2, dtypes.I8)


def _tile_store(b, s) -> bool:
    t = b.program.tensors[s.tensor]
    return s.value.kind is Kind.TILE and s.value.shape.width == 1 and t.dtype.cutlass is not None


def emit_d(impl, b, s, element: str, bits: int, pack=None, note: str = "") -> int:
    """The store of `s` through the collective: the root Compute node outputs D's element."""
    t = b.program.tensors[s.tensor]
    b.set_d(t, element, bits, note or "[M, N] row-major, stored by the collective")
    return b.compute(s.value, t.dtype, element, pack)


def emit_aux_store(impl, b, s, element: str, pack=None, note: str = "") -> int:
    """The store of `s` through an Sm90AuxStore (a TMA store of an [M, N] tile of `element`)."""
    t = b.program.tensors[s.tensor]
    src = b.compute(s.value, t.dtype, pack=pack)
    p = b.pointer("aux_store", t.name, t.dtype, note)
    b.aux_elements.append(element)
    d = b.descriptor("AuxStoreDescriptor", element)
    return b.add(impl, f"Sm90AuxStore<{d}::Stages, typename {d}::EpilogueTile, {element}, RN, StrideAux, "
                 f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpR2S>",
                 f"{{static_cast<{element}*>({p}), sAux}}", [src], f"store tile {t.name}")


class DStore(NodeImpl):
    role = "root"
    covers = f"one tile of the accumulator's width in {', '.join(map(str, D_TYPES))} (the collective's D)"

    @classmethod
    def matches(cls, b, s) -> bool:
        return _tile_store(b, s) and b.program.tensors[s.tensor].dtype in D_TYPES

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.program.tensors[s.tensor]
        return emit_d(cls, b, s, t.dtype.cutlass, t.dtype.bits)


class AuxStore(NodeImpl):
    role = "store"
    covers = "extra tiles of the accumulator's width (TMA store)"

    @classmethod
    def matches(cls, b, s) -> bool:
        return _tile_store(b, s)

    @classmethod
    def emit(cls, b, s) -> int:
        return emit_aux_store(cls, b, s, b.program.tensors[s.tensor].dtype.cutlass)


class E8m0Store(NodeImpl):
    """e8m0 tiles as bytes: the value is rounded to its power of two (functor.store_expr), whose f32
    exponent field is the e8m0 byte (2**-127, f32's subnormal 0x00400000, has field 0 = code 0)."""
    role = "store"
    covers = "e8m0 tiles of the accumulator's width (their exponent bytes, TMA store)"

    @classmethod
    def matches(cls, b, s) -> bool:
        t = b.program.tensors[s.tensor]
        return s.value.kind is Kind.TILE and s.value.shape.width == 1 and t.dtype is dtypes.E8M0

    @classmethod
    def emit(cls, b, s) -> int:
        pack = lambda parts: tuple(f"float((epic_bits({x}) >> 23) & 0xffu)" for x in parts)   # noqa: E731
        return emit_aux_store(cls, b, s, "uint8_t", pack, "[M, N] e8m0 bytes")


class _StockPartial(NodeImpl):
    """Per-tile partials of a one-state reduction through CUTLASS's Sm90ColReduction (one value per
    row and column tile) or Sm90RowReduction (per column and row tile)."""
    role = "store"
    axis = ""
    cutlass = ""
    stride = ""

    @classmethod
    def matches(cls, b, s) -> bool:
        v = s.value
        return (P.family(v.op) is P.Family.PARTIAL and v.attrs["axis"] == cls.axis
                and P.reduction(v.attrs["fn"]).cxx_op is not None)

    @classmethod
    def emit(cls, b, s) -> int:
        v = s.value
        r = P.reduction(v.attrs["fn"])
        x = make(r.pre, (v.args[0],), {}, v.span) if r.pre else v.args[0]
        src = b.compute(x)
        p = b.pointer(f"{cls.axis}_partial", s.tensor, dtypes.F32)
        op = r.cxx_op
        return b.add(cls, f"{cls.cutlass}<{op}, {op}, {op}, 0, TileShape, float, float, RN, "
                     f"Stride<{cls.stride}, int64_t>, 4, true, /*FinalReduction=*/false>",
                     f"{{{p}, {literal(r.identity[0])}, {{{', '.join(x + '{}' for x in cls.stride.split(', '))}, "
                     "int64_t(0)}}", [src], f"per-tile {cls.axis} {r.name} -> {s.tensor}")


class RowPartial(_StockPartial):
    covers = "per-tile partials of a row reduction (sum, mean, max, min, amax)"
    axis, cutlass, stride = "row", "Sm90ColReduction", "_1, _0"


class ColPartial(_StockPartial):
    covers = "per-tile partials of a column reduction (sum, mean, max, min, amax)"
    axis, cutlass, stride = "col", "Sm90RowReduction", "_0, _1"
