"""Store nodes: extra output tiles, the output that goes through the collective as D, and
deterministic per-tile partials of reductions (FinalReduction=false: no atomics)."""
from __future__ import annotations

from ... import dtypes
from ...ir import primitives as P
from ...ir.core import make
from ...plan import epilogue as pat
from ..cxx import literal
from .base import NodeImpl


def emit_d(impl, b, s, element: str, bits: int, pack=None, note: str = "") -> int:
    """The store of `s` through the collective: the root Compute node outputs D's element."""
    t = b.tensors[s.tensor]
    b.set_d(t, element, bits, note or "[M, N] row-major, stored by the collective")
    return b.compute(s.value, t.dtype, element, pack)


def emit_aux_store(impl, b, s, element: str, pack=None, note: str = "") -> int:
    """The store of `s` through an Sm90AuxStore (a TMA store of an [M, N] tile of `element`)."""
    t = b.tensors[s.tensor]
    src = b.compute(s.value, t.dtype, pack=pack)
    p = b.pointer("aux_store", t.name, t.dtype, note)
    b.aux_elements.append(element)
    d = b.descriptor("AuxStoreDescriptor", element)
    return b.add(impl, f"Sm90AuxStore<{d}::Stages, typename {d}::EpilogueTile, {element}, RN, StrideAux, "
                 f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpR2S>",
                 f"{{static_cast<{element}*>({p}), sAux}}", [src], f"store tile {t.name}")


class DStore(pat.DStore, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        return emit_d(cls, b, s, t.dtype.cutlass, t.dtype.bits)


class AuxStore(pat.AuxStore, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        return emit_aux_store(cls, b, s, b.tensors[s.tensor].dtype.cutlass)


class E8m0Store(pat.E8m0Store, NodeImpl):
    """e8m0 tiles as bytes: the value is rounded to its power of two (functor.store_expr), whose f32
    exponent field is the e8m0 byte (2**-127, f32's subnormal 0x00400000, has field 0 = code 0)."""

    @classmethod
    def emit(cls, b, s) -> int:
        pack = lambda parts: tuple(f"float((epic_bits({x}) >> 23) & 0xffu)" for x in parts)   # noqa: E731
        return emit_aux_store(cls, b, s, "uint8_t", pack, "[M, N] e8m0 bytes")


class OutsideAs(NodeImpl):
    """Elements outside the problem replaced by a value, the reduction's identity, in front of a stock
    reduction that then visits every element unchecked: a tile inside the problem skips the test
    (templates/nodes/epic_nodes/outside_as.hpp says why the partials stay the same bit for bit)."""
    header = "epic_nodes/outside_as.hpp"


class _StockPartial(NodeImpl):
    """Per-tile partials of a one-state reduction through CUTLASS's Sm90ColReduction (one value per
    row and column tile) or Sm90RowReduction (per column and row tile), its input masked to the
    problem by OutsideAs instead of the reduction's own test of every element."""
    cutlass = ""
    stride = ""

    @classmethod
    def emit(cls, b, s) -> int:
        v = s.value
        r = P.reduction(v.attrs["fn"])
        x = make(r.pre, (v.args[0],), {}, v.span) if r.pre else v.args[0]
        identity = literal(r.identity)
        src = b.add(OutsideAs, "epic_nodes::Sm90OutsideAs", f"{{{identity}}}", [b.compute(x)],
                    f"outside the problem -> {identity}")
        p = b.pointer(f"{cls.axis}_partial", s.tensor, dtypes.F32)
        op = r.cxx_op
        return b.add(cls, f"{cls.cutlass}<{op}, {op}, {op}, 0, TileShape, float, float, RN, "
                     f"Stride<{cls.stride}, int64_t>, 4, true, /*FinalReduction=*/false, /*VisitCheckOOB=*/false>",
                     f"{{{p}, {identity}, {{{', '.join(x + '{}' for x in cls.stride.split(', '))}, "
                     "int64_t(0)}}", [src], f"per-tile {cls.axis} {r.name} -> {s.tensor}")


class RowPartial(pat.RowPartial, _StockPartial):
    cutlass, stride = "Sm90ColReduction", "_1, _0"


class ColPartial(pat.ColPartial, _StockPartial):
    cutlass, stride = "Sm90RowReduction", "_0, _1"
