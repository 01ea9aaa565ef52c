"""Nodes that stock CUTLASS sm90 lacks; their C++ is under templates/nodes/epic_nodes/ (one header
each, printed into the kernels that use them).

- Coordinate: the row or column index of each element (`row`, `col`; cross entropy's row_pick).
- PeriodicRowBroadcast: a per-head vector, [Dh] repeated along N = H*Dh columns (vec[col % Dh]).
- RowLsePartial: per-tile online log-sum-exp pairs (max, sum of exp(x - max)) of a row.
- BlockScaleD / BlockScaleInt4: 1xB block-scaled quantization, q = x / s with
  s = max(block amax of |x|, floor) / qmax, as the prelude's fp8_e4m3_scale, int8_block_scale and
  int4_group_scale write it; the root of the epilogue (it rewrites the subtile before D is stored,
  or packs int4 bytes itself), and it stores the scales too.
- BlockScaleHalfWidth: the same of a half-width value (SwiGLU's output, then fp8): each column pair
  carries its one value on both columns, so a 1xB block is 1x2B accumulator columns; the node stores
  one byte per pair itself.
- BlockReduceScale: q = y * s (or y / s) with s a function of one 1xB block reduction of another tile z
  (QK-norm's per-head rsqrt(mean(h * h) + eps), once hoist-block-scale has moved s to the store); the
  root, reducing z while the subtile is visited; it can store s too.
- PackedInt4Store: an i4 or e2m1 tile packed two per byte (low nibble = even column), stored directly.
"""
from __future__ import annotations

from fractions import Fraction

from ... import dtypes
from ...ir import primitives as P
from ...ir.core import const
from ...passes.hoist_block_scale import block_dependent, root_form, select_form
from ...passes.rewrite import make
from ...passes.patterns import C, Op, V
from ...shapes import Kind
from .. import functor as fn
from ..cxx import literal
from .base import NodeImpl

_BLOCK_SCALE = "epic_nodes/block_scale.hpp"
QUANT_TYPES = (dtypes.E4M3, dtypes.E5M2, dtypes.I8)


class Coordinate(NodeImpl):
    covers = "the coordinates row and col"
    header = "epic_nodes/coordinate.hpp"

    @classmethod
    def matches(cls, b, v) -> bool:
        return P.prim(v.op).keyword in ("row", "col")

    @classmethod
    def emit(cls, b, v) -> int:
        keyword = P.prim(v.op).keyword
        return b.add(cls, f"epic_nodes::Sm90Coordinate<{0 if keyword == 'row' else 1}>", "{}", [], f"{keyword} index")


class PeriodicRowBroadcast(NodeImpl):
    covers = "per-head vectors ([Dh] repeated along N = H*Dh columns)"
    header = "epic_nodes/periodic_row_broadcast.hpp"

    @classmethod
    def matches(cls, b, v) -> bool:
        return P.prim(v.op).reads == "tensor" and "period" in v.attrs and v.dtype.cutlass is not None

    @classmethod
    def emit(cls, b, v) -> int:
        t = b.program.tensors[v.attrs["tensor"]]
        p = b.pointer("row", t.name, t.dtype)
        period = b.scalar(str(v.attrs["period"]), v.attrs["period"])
        return b.add(cls, f"epic_nodes::Sm90PeriodicRowBroadcast<{t.dtype.cutlass}>",
                     f"{{static_cast<{t.dtype.cutlass} const*>({p}), int({period})}}", [],
                     f"per-head vector {t.name} (every {v.attrs['period']} columns)")


class RowLsePartial(NodeImpl):
    role = "store"
    covers = "per-tile partials of row_lse (online (max, sum-exp) pairs)"
    header = "epic_nodes/row_lse_partial.hpp"

    @classmethod
    def matches(cls, b, s) -> bool:
        v = s.value
        return P.family(v.op) is P.Family.PARTIAL and v.attrs["axis"] == "row" and v.attrs["fn"] == "lse"

    @classmethod
    def emit(cls, b, s) -> int:
        src = b.compute(s.value.args[0])
        p = b.pointer("row_partial", s.tensor, dtypes.F32, "[tiles N, M padded, 2] (max, sum-exp)")
        return b.add(cls, "epic_nodes::Sm90RowLsePartial<TileShape>", f"{{static_cast<float*>({p})}}", [src],
                     f"per-tile row lse -> {s.tensor}")


# ---------------------------------------------------------------- block-scaled quantization
def _block_fn(fn: str):
    return lambda v: v.attrs["fn"] == fn


def _scale_patterns():
    x = V("x")
    amaxes = [Op("block_reduce", Op("abs", x), bind="r", where=_block_fn("max")),
              Op("block_reduce", x, bind="r", where=_block_fn("amax"))]
    out = []
    for amax in amaxes:
        for floored in (Op("max", amax, C(bind="floor")), Op("max", C(bind="floor"), amax)):
            out.append(Op("div", x, Op("div", floored, C(bind="qmax"), bind="s")))
    return out


_QUANT_PATTERNS = _scale_patterns()


def match_block_quant(v):
    """(x, block, floor, qmax, scale value) when v = x / (max(block amax of |x|, floor) / qmax)."""
    for pattern in _QUANT_PATTERNS:
        binds: dict = {}
        if pattern.match(v, binds):
            return (binds["x"], binds["r"].attrs["block"], float(binds["floor"].attrs["value"]),
                    float(binds["qmax"].attrs["value"]), binds["s"])
    return None


class _BlockScale(NodeImpl):
    role = "root"
    header = _BLOCK_SCALE
    output = 0
    types: tuple = ()
    width = Fraction(1)      # of the quantized tile, in the accumulator's columns

    @classmethod
    def matches(cls, b, s) -> bool:
        t = b.program.tensors[s.tensor]
        return (s.value.kind is Kind.TILE and s.value.shape.width == cls.width and t.dtype in cls.types
                and match_block_quant(s.value) is not None and floor_ok(s.value))

    @classmethod
    def claims(cls, b, s) -> list:
        """The stores of the scale: this node writes them."""
        scale = match_block_quant(s.value)[4]
        return [o for o in b.k.stores if o.value is scale]

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.program.tensors[s.tensor]
        x, block, floor, qmax, _ = match_block_quant(s.value)
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
        return b.add(cls, f"epic_nodes::Sm90BlockScale<{block}, {el}, false, 0, {cls.output}{element_q}>",
                     f"{{{scale_arg}, {literal(qmax)}, {literal(floor)}, {q_arg}{_pair_slots(b, block)}}}", [src],
                     f"1x{block} block scale -> {t.name}" + (f", scales {scales[0].tensor}" if scales else ""))


def _block_values_pointer(b, stores: list, note: str) -> tuple[str, str]:
    """(element type, Arguments pointer) of the [M, N/B] block values a segment root stores (nullptr:
    none are stored)."""
    if not stores:
        return "float", "nullptr"
    t = b.program.tensors[stores[0].tensor]
    p = b.pointer("block_scale", t.name, t.dtype, note)
    el = dtypes.E8M0_CUTLASS if t.dtype is dtypes.E8M0 else t.dtype.cutlass   # e8m0: rounded up, as the reference
    return el, f"static_cast<{el}*>({p})"


def _pair_slots(b, block: int) -> str:
    """Split segments (the tile half a block wide, a 1x2 cluster: codegen checks the configuration in
    plan/config.py): the Arguments field of the pair exchange's words, ", ptr"; else nothing."""
    if b.cfg.tile_n >= block:
        return ""
    tm = b.cfg.tile_m
    p = b.scratch_pointer("pair_slots", f"(long long)((sizes[0] + {tm} - 1) / {tm} * {tm}) * "
                          f"((sizes[1] + {block} - 1) / {block}) * 16",
                          "null: the library's own per-stream words for the split blocks' exchange")
    return f", static_cast<uint64_t*>({p})"


def floor_ok(v) -> bool:
    """The node needs a positive floor (an all-zero block would divide 0 by 0)."""
    m = match_block_quant(v)
    return m is not None and m[2] > 0 and m[3] > 0


class BlockScaleD(_BlockScale):
    covers = ("1xB block-scaled e4m3/e5m2/i8 tiles, q = x / s with s = max(block_amax(x, B), floor) / qmax "
              "(fp8_e4m3_scale, int8_block_scale), and their scales")
    output = 0
    types = QUANT_TYPES


class BlockScaleInt4(_BlockScale):
    covers = "1xB block-scaled i4 tiles (int4_group_scale), packed two per byte, and their scales"
    output = 1
    types = (dtypes.I4,)


class BlockScaleHalfWidth(_BlockScale):
    covers = ("1xB block-scaled e4m3/e5m2/i8 tiles half as wide as the accumulator (swiglu's output), "
              "stored one byte per column pair, and their scales")
    output = 2
    types = QUANT_TYPES
    width = Fraction(1, 2)


# ---------------------------------------------------------------- block statistics scaling a tile
SCALED_TYPES = (dtypes.F32, dtypes.BF16, dtypes.F16, dtypes.E4M3, dtypes.E5M2)   # fp8: D converts saturating (satfinite)


def block_statistic(s):
    """The one block reduction a block value s is computed from (with literal numbers only), or None."""
    found, stack, seen = [], [s], set()
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        if P.family(v.op) is P.Family.BLOCK:
            found.append(v)
        elif P.is_literal(v):
            continue
        elif v.kind is Kind.BLOCK and P.family(v.op) is P.Family.ELEMENTWISE and P.prim(v.op).cxx is not None:
            stack.extend(v.args)
        else:
            return None      # a runtime scalar, a size, a column vector...: not in the finalize functor
    if len(found) != 1 or P.reduction(found[0].attrs["fn"]).state != 1:
        return None
    return found[0]


def match_block_root(b, s):
    """(y, s, divide, block reduction, mask) when a store is y * s / y / s of a block statistic s (mask
    None), or select(c, y' * s, w) (either order; y = select(c, y', w), the mask 1 where the scale
    applies, else 0), or None."""
    v = s.value
    dep = block_dependent(b.k)
    form, mask = root_form(v, dep), None
    if form is None and (sel := select_form(v, dep)) is not None:
        c, i, (y, scale, divide) = sel
        args = [c, v.args[1], v.args[2]]
        args[i] = y
        bits = [const(0.0, span=v.span), const(0.0, span=v.span)]
        bits[i - 1] = const(1.0, span=v.span)
        form = make("select", tuple(args), like=v), scale, divide
        mask = make("select", (c, *bits), like=v)
    if form is None or v.shape.width != 1:
        return None
    y, scale, divide = form
    r = block_statistic(scale)
    return None if r is None else (y, scale, divide, r, mask)


def _block_functor(b, scale, r) -> str:
    """The struct the node calls: the reduction's identity, pre-map, merge, and s from the statistic."""
    red = P.reduction(r.attrs["fn"])
    pre = P.prim(red.pre).cxx.format("x") if red.pre else "x"
    writer = fn.ExprWriter(pairwise=False)
    writer.bind(r, ("a0",))
    value = writer.emit(scale)[0]
    name = f"epic_block{len(b.functors)}"
    lines = [f"struct {name} {{  // {red.name} over 1x{r.attrs['block']} blocks, then the scale",
             f"  CUTLASS_DEVICE static float identity() {{ return {literal(red.identity[0])}; }}",
             f"  CUTLASS_DEVICE static float pre(float x) {{ return {pre}; }}",
             f"  CUTLASS_DEVICE static void merge(float& a0, float x0) {{ {red.cxx_merge.format(a0='a0', x0='x0')} }}",
             "  CUTLASS_DEVICE static float finalize(float a0) {"]
    lines += [f"    {line}" for line in writer.lines]
    lines += [f"    return {value};", "  }", "};"]
    b.functors.append("\n".join(lines))
    return name


class BlockReduceScale(NodeImpl):
    role = "root"
    covers = ("a tile times (or divided by) a function of one 1xB block reduction of a tile, e.g. QK-norm's "
              "h * rsqrt(block_mean(h * h, Dh) + eps) (bf16/f16/f32/e4m3/e5m2 outputs), and that block value; "
              "also selected against a tile without it (select(col < n, head_rmsnorm(acc, g, 128), acc))")
    header = "epic_nodes/block_reduce_scale.hpp"

    @classmethod
    def matches(cls, b, s) -> bool:
        return b.program.tensors[s.tensor].dtype in SCALED_TYPES and match_block_root(b, s) is not None

    @classmethod
    def claims(cls, b, s) -> list:
        """The stores of the block value itself: this node writes them."""
        scale = match_block_root(b, s)[1]
        return [o for o in b.k.stores if o.value is scale]

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.program.tensors[s.tensor]
        y, scale, divide, r, mask = match_block_root(b, s)
        block = r.attrs["block"]
        functor = _block_functor(b, scale, r)
        inputs = [b.compute(y), b.compute(r.args[0])] + ([b.compute(mask)] if mask is not None else [])
        scales = cls.claims(b, s)
        el, scale_arg = _block_values_pointer(b, scales, f"[M, N/{block}] block values")
        b.set_d(t, t.dtype.cutlass, t.dtype.bits, f"[M, N] {t.dtype}, scaled per 1x{block} block")
        masked = ", true" if mask is not None else ""     # per element: whether the scale applies
        return b.add(cls, f"epic_nodes::Sm90BlockReduceScale<{block}, {functor}, {'true' if divide else 'false'}, {el}{masked}>",
                     f"{{{scale_arg}{_pair_slots(b, block)}}}", inputs,
                     f"1x{block} block {r.attrs['fn']} scale -> {t.name}" + (f", values {scales[0].tensor}" if scales else ""))


class PackedInt4Store(NodeImpl):
    """i4 and e2m1 tiles: the functor gives each element's 4-bit value or code (functor.store_expr),
    which the node packs two per byte."""
    role = "store"
    covers = "i4 and e2m1 tiles, packed two per byte (low nibble = even column)"
    header = "epic_nodes/packed_int4_store.hpp"

    @classmethod
    def matches(cls, b, s) -> bool:
        t = b.program.tensors[s.tensor]
        return s.value.kind is Kind.TILE and s.value.shape.width == 1 and t.dtype in dtypes.PACKED

    @classmethod
    def emit(cls, b, s) -> int:
        t = b.program.tensors[s.tensor]
        src = b.compute(s.value, t.dtype)
        what = "int4" if t.dtype is dtypes.I4 else str(t.dtype)
        p = b.pointer("int4_store", t.name, t.dtype, f"[M, N/2] packed {what}")
        return b.add(cls, "epic_nodes::Sm90PackedInt4Store", f"{{static_cast<uint8_t*>({p})}}", [src],
                     f"store {what} {t.name}")
