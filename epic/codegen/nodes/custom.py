"""Nodes that stock CUTLASS sm90 lacks; their C++ is under templates/nodes/epic_nodes/ (one header
each, printed into the kernels that use them).

- Coordinate: the row or column index of each element (`row`, `col`; cross entropy's row_pick).
- PeriodicRowBroadcast: a per-head vector, [Dh] repeated along N = H*Dh columns (vec[col % Dh]).
- RowLsePartial: each tile's log-sum-exp of a row (online over (max, sum of exp(x - max)) pairs).
- BlockScaleD / BlockScaleInt4: 1xB block-scaled quantization, the internal op block_quant(x, s):
  q = x / s with s = max(block amax of |x|, floor) / qmax, which the block-quant pass
  (passes/block_quant.py) recognises in its spellings (the prelude's fp8_e4m3_scale, int8_block_scale
  and int4_group_scale, x * (qmax / m), ...); the root of the epilogue (it rewrites the subtile before
  D is stored, or packs int4 bytes itself), and it stores the scales too.
- BlockScaleHalfWidth: the same of a half-width value (SwiGLU's output, then fp8): each column pair
  carries its one value on both columns, so a 1xB block is 1x2B accumulator columns; the node stores
  one byte per pair itself.
- BlockReduceScale: q = y * s (or y / s) with s a function of one 1xB block reduction of another tile z
  (QK-norm's per-head rsqrt(mean(h * h) + eps), once hoist-block-scale has moved s to the store); the
  root, reducing z while the subtile is visited; it can store s too.
- PackedInt4Store: an i4 or e2m1 tile packed two per byte (low nibble = even column), stored directly.
"""
from __future__ import annotations

from ... import dtypes
from ...diagnostics import error
from ...ir import primitives as P
from ...plan import epilogue as pat
from .. import functor as fn
from ..cxx import literal
from .base import NodeImpl

_BLOCK_SCALE = "epic_nodes/block_scale.hpp"


class Coordinate(pat.Coordinate, NodeImpl):
    header = "epic_nodes/coordinate.hpp"

    @classmethod
    def emit(cls, b, v) -> int:
        keyword = P.prim(v.op).keyword
        return b.add(cls, f"epic_nodes::Sm90Coordinate<{0 if keyword == 'row' else 1}>", "{}", [], f"{keyword} index")


class PeriodicRowBroadcast(pat.PeriodicRowBroadcast, NodeImpl):
    header = "epic_nodes/periodic_row_broadcast.hpp"

    @classmethod
    def emit(cls, b, v) -> int:
        t = b.tensors[v.attrs["tensor"]]
        p = b.pointer("row", t.name, t.dtype)
        period = b.scalar(str(v.attrs["period"]), v.attrs["period"])
        return b.add(cls, f"epic_nodes::Sm90PeriodicRowBroadcast<{t.dtype.cutlass}>",
                     f"{{static_cast<{t.dtype.cutlass} const*>({p}), int({period})}}", [],
                     f"per-head vector {t.name} (every {v.attrs['period']} columns)")


class RowLsePartial(pat.RowLsePartial, NodeImpl):
    header = "epic_nodes/row_lse_partial.hpp"

    @classmethod
    def emit(cls, b, s) -> int:
        src = b.compute(s.value.args[0])
        p = b.pointer("row_partial", s.tensor, dtypes.F32, "[tiles N, M padded] per-tile log-sum-exp")
        return b.add(cls, "epic_nodes::Sm90RowLsePartial<TileShape>", f"{{static_cast<float*>({p})}}", [src],
                     f"per-tile row lse -> {s.tensor}")


# ---------------------------------------------------------------- block-scaled quantization
class _BlockScale(NodeImpl):
    """block_quant(x, s): the node computes s from x itself (the op's attributes block, floor, qmax)
    and stores the stores of s (the pattern's claims)."""
    header = _BLOCK_SCALE
    output = 0      # 0: D; 1: packed int4 bytes; 2: a byte per column pair

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        x = s.value.args[0]
        block, floor, qmax = (s.value.attrs[a] for a in ("block", "floor", "qmax"))
        scales = cls.claims(b, s)
        el, scale_arg = _block_values_pointer(b, scales, f"[M, {'N/2' if cls.output == 2 else 'N'}/{block}] scales")
        element_q = ""
        if cls.output == 0:
            src = b.compute(x)
            b.set_d(t, t.dtype.cutlass, t.dtype.bits, f"[M, N] {t.dtype}, 1x{block} block-scaled")
            q_arg = "nullptr"
        elif cls.output == 1:
            src = b.compute(x)
            pq = b.pointer("int4_store", t.name, t.dtype, "[M, N/2] packed int4")
            b.aux_elements.append("uint8_t")
            q_arg = f"static_cast<uint8_t*>({pq})"
        else:       # a half-width value on both columns of its pair: a 1xB block is 1x2B of them
            src = b.compute(x, pack=lambda parts: (parts[0], parts[0]))
            pq = b.pointer("byte_store", t.name, t.dtype, f"[M, N/2] {t.dtype}, 1x{block} block-scaled")
            b.aux_elements.append("uint8_t")
            q_arg = f"static_cast<uint8_t*>({pq})"
            element_q, block = f", {t.dtype.cutlass}", block * 2
        _split_blocks(b, block)
        return b.add(cls, f"epic_nodes::Sm90BlockScale<{block}, {el}, false, 0, {cls.output}{element_q}>",
                     f"{{{scale_arg}, {literal(qmax)}, {literal(floor)}, {q_arg}}}", [src],
                     f"1x{block} block scale -> {t.name}" + (f", scales {scales[0].tensor}" if scales else ""))


class BlockScaleD(pat.BlockScaleD, _BlockScale):
    output = 0


class BlockScaleInt4(pat.BlockScaleInt4, _BlockScale):
    output = 1


class BlockScaleHalfWidth(pat.BlockScaleHalfWidth, _BlockScale):
    output = 2


def _block_values_pointer(b, stores: list, note: str) -> tuple[str, str]:
    """(element type, Arguments pointer) of the [M, N/B] block values a segment root stores (nullptr:
    none are stored)."""
    if not stores:
        return "float", "nullptr"
    t = b.tensors[stores[0].tensor]
    p = b.pointer("block_scale", t.name, t.dtype, note)
    el = dtypes.E8M0_CUTLASS if t.dtype is dtypes.E8M0 else t.dtype.cutlass   # e8m0: rounded up, as the reference
    return el, f"static_cast<{el}*>({p})"


def _split_blocks(b, block: int) -> None:
    """Split blocks (the tile half a block wide, a 1x2 pingpong cluster: plan/config.py checks the
    configuration): the two CTAs exchange their halves through each other's shared memory, two words
    per row of the tile (one per consumer warp group) that the mainloop's pipeline keeps. The words
    carry one node's halves, tagged by tile only: a second split-block node in the same epilogue would
    overwrite the first's values under the same tag, so it is refused here (code generation supports
    one block node per gemm today, so no program reaches this)."""
    if b.cfg.tile_n >= block:
        return
    if b.pair_words:
        raise error("E702", "two 1xB block statistics split over a 1x2 cluster in one epilogue are not "
                    "supported by code generation yet (their halves would share the exchange's words)", None,
                    f"give the gemm tiles at least {block} wide (with tile=...), or compute one of them in a later gemm")
    b.pair_words = 2 * b.cfg.tile_m


# ---------------------------------------------------------------- block statistics scaling a tile
def _block_functor(b, scale, r) -> str:
    """The struct the node calls: the reduction's identity, pre-map, merge, and s from the statistic."""
    red = P.reduction(r.attrs["fn"])
    pre = P.prim(red.pre).cxx.format("x") if red.pre else "x"
    writer = fn.ExprWriter(pairwise=False)
    writer.bind(r, ("a0",))
    value = writer.emit(scale)[0]
    name = f"epic_block{len(b.functors)}"
    lines = [f"struct {name} {{  // {red.name} over 1x{r.attrs['block']} blocks, then the scale",
             f"  CUTLASS_DEVICE static float identity() {{ return {literal(red.identity)}; }}",
             f"  CUTLASS_DEVICE static float pre(float x) {{ return {pre}; }}",
             f"  CUTLASS_DEVICE static void merge(float& a0, float x0) {{ {red.cxx_merge.format(a='a0', x='x0')} }}",
             "  CUTLASS_DEVICE static float finalize(float a0) {"]
    lines += [f"    {line}" for line in writer.lines]
    lines += [f"    return {value};", "  }", "};"]
    b.functors.append("\n".join(lines))
    return name


class BlockReduceScale(pat.BlockReduceScale, NodeImpl):
    header = "epic_nodes/block_reduce_scale.hpp"

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        y, scale, divide, r, mask = pat.match_block_root(b, s)
        block = r.attrs["block"]
        functor = _block_functor(b, scale, r)
        inputs = [b.compute(y), b.compute(r.args[0])] + ([b.compute(mask)] if mask is not None else [])
        scales = cls.claims(b, s)
        el, scale_arg = _block_values_pointer(b, scales, f"[M, N/{block}] block values")
        b.set_d(t, t.dtype.cutlass, t.dtype.bits, f"[M, N] {t.dtype}, scaled per 1x{block} block")
        masked = ", true" if mask is not None else ""     # per element: whether the scale applies
        _split_blocks(b, block)
        return b.add(cls, f"epic_nodes::Sm90BlockReduceScale<{block}, {functor}, {'true' if divide else 'false'}, {el}{masked}>",
                     f"{{{scale_arg}}}", inputs,
                     f"1x{block} block {r.attrs['fn']} scale -> {t.name}" + (f", values {scales[0].tensor}" if scales else ""))


class PackedInt4Store(pat.PackedInt4Store, NodeImpl):
    """i4 and e2m1 tiles: the functor gives each element's 4-bit value or code (functor.store_expr),
    which the node packs two per byte."""
    header = "epic_nodes/packed_int4_store.hpp"

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.tensors[s.tensor]
        src = b.compute(s.value, t.dtype)
        what = "int4" if t.dtype is dtypes.I4 else str(t.dtype)
        p = b.pointer("int4_store", t.name, t.dtype, f"[M, N/2] packed {what}")
        return b.add(cls, "epic_nodes::Sm90PackedInt4Store", f"{{static_cast<uint8_t*>({p})}}", [src],
                     f"store {what} {t.name}")
