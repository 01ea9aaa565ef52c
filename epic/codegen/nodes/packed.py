"""Width-changing loads and stores through stock nodes, by viewing memory in containers of the
accumulator's width (nothing is copied; the caller's tensors are used as they are).

Each column pair (2k, 2k+1) of the accumulator sits in one thread's registers, so a pairwise map
is local; only the memory traffic changes width:
- a tile half as wide as the accumulator (swiglu: [M, N/2]) of a 16-bit type, the gemm's only store,
  goes out through a node of its own (HalfWidthPairD: stmatrix, TMA store). Otherwise it is stored
  as an [M, N] tile of bytes: pair k writes the low and the high byte of its one value (f32: two uint16
  half-words). The bytes land exactly where the [M, N/2] tensor's elements are.
- a tile twice as wide (swiglu_bwd's [M, 2N]) of a 16-bit type is loaded or stored as an [M, N]
  tile of floats, each holding the bits of two adjacent 16-bit values (low half = even column).
The container values are moved bit-exactly (float -> float conversions are the identity; bytes
and half-words are exact small integers in float).
"""
from __future__ import annotations

from ... import dtypes
from ...plan import epilogue as pat
from .base import NodeImpl
from .leaves import emit_aux_load
from .stores import emit_aux_store, emit_d

_UNPACK = {"bf16": "epic_bf16", "f16": "epic_f16"}


def _split_half(t):
    """(container element, bits, pack) for a half-width tile of t's dtype."""
    if t.dtype is dtypes.F32:
        return "uint16_t", 16, lambda parts: (f"epic_half_word({parts[0]}, 0)", f"epic_half_word({parts[0]}, 1)")
    T = t.dtype.cutlass
    return "uint8_t", 8, lambda parts: (f"epic_byte<{T}>({parts[0]}, 0)", f"epic_byte<{T}>({parts[0]}, 1)")


def _pack_double(t):
    T = t.dtype.cutlass
    return lambda parts: (f"epic_pack2<{T}>({parts[0]}, {parts[1]})", f"epic_pack2<{T}>({parts[2]}, {parts[3]})")


class HalfWidthD(pat.HalfWidthD, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        element, bits, pack = _split_half(t)
        return emit_d(cls, b, s, element, bits, pack, f"[M, N/2] {t.dtype} seen as [M, N] {element}")


class HalfWidthPairD(pat.HalfWidthPairD, NodeImpl):
    """Each pair carries its one value on both columns; the node stores element 2k of each pair."""
    header = "epic_nodes/half_width_pair_store.hpp"

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        T = t.dtype.cutlass
        src = b.compute(s.value, t.dtype, pack=lambda parts: (parts[0], parts[0]))
        p = b.pointer("aux_store", t.name, t.dtype, f"[M, N/2] {t.dtype} (stmatrix, TMA store)")
        b.aux_elements.append("uint8_t")      # the void D's staging buffer holds the half-width subtile
        return b.add(cls, f"epic_nodes::Sm90HalfWidthPairStore<{T}, typename EpiDesc::EpilogueTile>",
                     f"{{static_cast<{T}*>({p})}}", [src], f"store tile {t.name} (half width, stmatrix)")


class HalfWidthAux(pat.HalfWidthAux, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        element, _, pack = _split_half(t)
        return emit_aux_store(cls, b, s, element, pack, f"[M, N/2] {t.dtype} seen as [M, N] {element}")


class DoubleWidthD(pat.DoubleWidthD, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        return emit_d(cls, b, s, "float", 32, _pack_double(t), f"[M, 2N] {t.dtype} seen as [M, N] pairs")


class DoubleWidthAux(pat.DoubleWidthAux, NodeImpl):
    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        return emit_aux_store(cls, b, s, "float", _pack_double(t), f"[M, 2N] {t.dtype} seen as [M, N] pairs")


class DoubleWidthLoad(pat.DoubleWidthLoad, NodeImpl):
    @classmethod
    def emit(cls, b, v) -> int:
        return emit_aux_load(cls, b, v, "float", f"[M, 2N] {v.dtype} seen as [M, N] pairs")

    @classmethod
    def parts(cls, j: int, v) -> tuple[str, ...]:
        u = _UNPACK[v.dtype.name]
        return tuple(f"{u}_{half}(in{j}[2 * k + {e}])" for e in (0, 1) for half in ("lo", "hi"))
