"""The nodes of a gemm's epilogue as patterns: which node computes each value and performs each store,
and the shared memory each stages.

A pattern names the root ops of the items it matches (`ops`: a value's op, a store's value's op;
empty: any op), a `benefit` and a `matches(ctx, item)` test (ctx: the program's `tensors` and the
kernel `k`). For an item, the candidates are the patterns indexed under its op and those of any op;
the matching one with the largest benefit is chosen, and two matching with one benefit is a bug
(E599): the choice never depends on the order of a list. Leaves compute a value (the accumulator, a
tensor load, a scalar); stores perform a Store (an extra output tile, per-tile partials); roots
perform the one store that goes through the collective as D.

Each pattern declares what the epilogue's collective stages for it in shared memory (`stage`,
`staged_bytes`): config.py sums that over a kernel's chosen patterns, so the plan knows it before
code generation, which gives each pattern its emitter (epic/codegen/nodes/: the same names, with the
C++).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import dtypes
from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import const
from ..passes.block_quant import PACKED_TYPES, QUANT_TYPES
from ..passes.hoist_block_scale import block_dependent, root_form, select_form
from ..passes.rewrite import make
from ..shapes import Kind

LOADS = ("load",)        # the ops that read a tensor (their records' `reads` is "tensor")
SIXTEEN_BIT = (dtypes.BF16, dtypes.F16)
# what the collective can store as D (converted from the root node's float results)
D_TYPES = (dtypes.BF16, dtypes.F16, dtypes.F32, dtypes.E4M3, dtypes.E5M2, dtypes.I8)
SCALED_TYPES = (dtypes.F32, dtypes.BF16, dtypes.F16, dtypes.E4M3, dtypes.E5M2)   # fp8: D converts saturating (satfinite)


@dataclass(frozen=True)
class EpilogueTiling:
    """The epilogue subtile (m x n) and how many of them the collective stages for stores and loads."""
    m: int
    n: int
    stages_d: int
    stages_c: int


class Pattern:
    role = "leaf"                 # leaf | store | root
    covers = ""                   # what it handles, in words: the E702 hint lists these
    ops: tuple[str, ...] = ()     # the root op of the items it matches; (): any
    benefit = 0                   # of two patterns matching one item, the larger wins
    # the collective's shared memory it takes: "d" (StagesD subtiles: D and aux stores), "c" (StagesC
    # subtiles: aux loads), None (none: registers, or global memory directly)
    stage: str | None = None
    writes_d = False              # it stores the collective's D (else D is void, if no other node does)

    @classmethod
    def aux_bytes(cls, ctx, item) -> float | None:
        """Bytes per accumulator element of the element type code generation registers as an aux
        store's (the first registered sizes a void D's staging buffer); None: it registers none."""
        return None

    @classmethod
    def matches(cls, ctx, item) -> bool:
        raise NotImplementedError

    @classmethod
    def claims(cls, ctx, item) -> list:
        """Roots: the other stores this node performs itself (e.g. a block scale's scales)."""
        return []

    @classmethod
    def staged_bytes(cls, ctx, item) -> float:
        """Bytes per accumulator element of an epilogue subtile it stages in shared memory."""
        return 0.0

    @classmethod
    def smem_bytes(cls, ctx, item, epi: EpilogueTiling) -> float:
        stages = {"d": epi.stages_d, "c": epi.stages_c}.get(cls.stage, 0)
        return epi.m * epi.n * stages * cls.staged_bytes(ctx, item)


def tile_bytes(dtype: dtypes.DType, value) -> float:
    """Bytes per accumulator element a tile of this dtype stages (a half-width bf16 tile one, a
    double-width one four; 4-bit types are stored without shared memory)."""
    return 0.0 if dtype.bits < 8 else dtype.bits / 8 * float(value.shape.width)


def _reads_tensor(v) -> bool:
    return P.prim(v.op).reads == "tensor"


# ---------------------------------------------------------------- leaves
class AccFetch(Pattern):
    covers = "the accumulator (acc)"
    ops = ("acc",)

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return P.is_accumulator(v.op)


class ScalarBroadcast(Pattern):
    covers = "runtime scalars and dimension sizes"
    ops = LOADS + ("dim",)

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return v.kind is Kind.SCALAR and P.family(v.op) is P.Family.SOURCE and (_reads_tensor(v) or "dim" in v.attrs)


class AuxLoad(Pattern):
    covers = "extra [M, N] tiles of the accumulator's width (TMA through shared memory, or straight to registers)"
    ops = LOADS
    stage = "c"     # what the collective sizes, also with aux_load=direct (which leaves it unused)

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return _reads_tensor(v) and v.kind is Kind.TILE and v.shape.width == 1 and v.dtype.cutlass is not None

    @classmethod
    def staged_bytes(cls, ctx, v) -> float:
        return tile_bytes(v.dtype, v)


class DoubleWidthLoad(AuxLoad):
    covers = "tiles twice as wide as the accumulator ([M, 2N]) in bf16 or f16"

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return _reads_tensor(v) and v.kind is Kind.TILE and v.shape.width == 2 and v.dtype in SIXTEEN_BIT


class HalfWidthLoad(AuxLoad):
    covers = ("tiles half as wide as the accumulator ([M, N/2]) in bf16, f16 or f32: column pair (2k, 2k+1) "
              "reads column k")

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return (_reads_tensor(v) and v.kind is Kind.TILE and v.shape.width == Fraction(1, 2)
                and v.dtype in SIXTEEN_BIT + (dtypes.F32,))


class _VectorBroadcast(Pattern):
    """A vector read once per tile and broadcast along the rows (one value per column) or the columns."""
    kind = Kind.ROW
    ops = LOADS

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return (_reads_tensor(v) and v.kind is cls.kind and v.dtype.cutlass is not None
                and (not v.shape.has_columns or v.shape.width == 1))


class RowBroadcast(_VectorBroadcast):
    covers = "row vectors [N] (one value per column)"
    benefit = 1     # a per-head vector is a row vector too: PeriodicRowBroadcast (2) takes it


class ColBroadcast(_VectorBroadcast):
    covers = "column vectors [M] (one value per row)"
    kind = Kind.COL


class PeriodicRowBroadcast(Pattern):
    covers = "per-head vectors ([Dh] repeated along N = H*Dh columns)"
    ops = LOADS
    benefit = 2      # before the stock row broadcast (which would read it as a whole row)

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return _reads_tensor(v) and "period" in v.attrs and v.dtype.cutlass is not None


class Coordinate(Pattern):
    covers = "the coordinates row and col"
    ops = ("row_index", "col_index")

    @classmethod
    def matches(cls, ctx, v) -> bool:
        return P.prim(v.op).keyword in ("row", "col")


# ---------------------------------------------------------------- tile stores
class TileStore(Pattern):
    """A store of a tile: D or an aux store stages StagesD subtiles of it (a custom node that writes
    global memory itself declares the same, as the collective sizes D and its aux stores alike)."""
    role = "store"
    stage = "d"

    @classmethod
    def staged_bytes(cls, ctx, s) -> float:
        return tile_bytes(ctx.tensors[s.tensor].dtype, s.value)


def _tile_of(ctx, s, width, types=None) -> bool:
    t = ctx.tensors[s.tensor]
    return (s.value.kind is Kind.TILE and s.value.shape.width == width
            and (t.dtype in types if types is not None else t.dtype.cutlass is not None))


class DStore(TileStore):
    role = "root"
    writes_d = True
    covers = f"one tile of the accumulator's width in {', '.join(map(str, D_TYPES))} (the collective's D)"
    benefit = 22      # the collective's own store: before a container view of another width

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, 1, D_TYPES)


class HalfWidthD(TileStore):
    role = "root"
    writes_d = True
    covers = "a tile half as wide as the accumulator (swiglu) in bf16, f16 or f32, as D"
    benefit = 21

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, Fraction(1, 2), SIXTEEN_BIT + (dtypes.F32,))


class HalfWidthPairD(TileStore):
    """The kernel's one store, half as wide as the accumulator in a 16-bit type: its own node stores it
    with stmatrix into the collective's (otherwise unused) D staging buffer and a TMA store of [M, N/2]
    (templates/nodes/epic_nodes/half_width_pair_store.hpp). D is void; its staging buffer is of bytes,
    one per accumulator column, exactly the half-width subtile. With other stores in the kernel the
    buffer is not the node's alone: HalfWidthD takes the store then."""
    role = "root"
    covers = ("a tile half as wide as the accumulator (swiglu) in bf16 or f16, the gemm's only output "
              "(stmatrix and TMA store)")
    benefit = 23      # before HalfWidthD's bytes through the collective

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return len(ctx.k.stores) == 1 and _tile_of(ctx, s, Fraction(1, 2), SIXTEEN_BIT)

    @classmethod
    def aux_bytes(cls, ctx, s) -> float | None:
        return cls.staged_bytes(ctx, s)     # the void D's bytes: one per accumulator column

    @classmethod
    def smem_bytes(cls, ctx, s, epi: EpilogueTiling) -> float:
        return 0.0                          # it writes the void D's staging buffer


class DoubleWidthD(TileStore):
    role = "root"
    writes_d = True
    covers = "a tile twice as wide as the accumulator (swiglu_bwd) in bf16 or f16, as D"
    benefit = 20

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, Fraction(2), SIXTEEN_BIT)


class _TmaAuxStore(TileStore):
    """An Sm90AuxStore: an [M, N] tile of one element type staged in shared memory and stored by TMA."""

    @classmethod
    def aux_bytes(cls, ctx, s) -> float | None:
        return cls.staged_bytes(ctx, s)


class AuxStore(_TmaAuxStore):
    covers = "extra tiles of the accumulator's width (TMA store)"

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, 1)


class E8m0Store(_TmaAuxStore):
    covers = "e8m0 tiles of the accumulator's width (their exponent bytes, TMA store)"

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, 1, (dtypes.E8M0,))


class HalfWidthAux(_TmaAuxStore):
    covers = "extra tiles half as wide as the accumulator in bf16, f16 or f32"

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return HalfWidthD.matches(ctx, s)


class DoubleWidthAux(_TmaAuxStore):
    covers = "extra tiles twice as wide as the accumulator in bf16 or f16"

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return DoubleWidthD.matches(ctx, s)


class PackedInt4Store(TileStore):
    covers = "i4 and e2m1 tiles, packed two per byte (low nibble = even column)"

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, 1, dtypes.PACKED)


# ---------------------------------------------------------------- per-tile partials
class _StockPartial(Pattern):
    """Per-tile partials of a one-state reduction through a stock CUTLASS row/column reduction."""
    role = "store"
    ops = ("partial",)
    axis = ""

    @classmethod
    def matches(cls, ctx, s) -> bool:
        v = s.value
        return v.attrs["axis"] == cls.axis and P.reduction(v.attrs["fn"]).cxx_op is not None


class RowPartial(_StockPartial):
    covers = "per-tile partials of a row reduction (sum, mean, max, min, amax)"
    axis = "row"


class ColPartial(_StockPartial):
    covers = "per-tile partials of a column reduction (sum, mean, max, min, amax)"
    axis = "col"


class RowLsePartial(Pattern):
    role = "store"
    covers = "per-tile partials of row_lse (each tile's log-sum-exp, computed online)"
    ops = ("partial",)

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return s.value.attrs["axis"] == "row" and s.value.attrs["fn"] == "lse"


# ---------------------------------------------------------------- block-scaled quantization
class _BlockScale(TileStore):
    """block_quant(x, s) (the block-quant pass made it from x / s): the node computes s from x itself
    and performs the stores of s."""
    role = "root"
    ops = ("block_quant",)
    types: tuple = ()
    width = Fraction(1)      # of the quantized tile, in the accumulator's columns

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return _tile_of(ctx, s, cls.width, cls.types)

    @classmethod
    def claims(cls, ctx, s) -> list:
        return [o for o in ctx.k.stores if o.value is s.value.args[1]]


class BlockScaleD(_BlockScale):
    covers = ("1xB block-scaled e4m3/e5m2/i8 tiles, q = x / s with s = max(block_amax(x, B), floor) / qmax "
              "(fp8_e4m3_scale, int8_block_scale), and their scales")
    types = QUANT_TYPES
    writes_d = True
    benefit = 42     # a root that must be the root (it rewrites the subtile D is stored from)


class _BlockScaleBytes(_BlockScale):
    """A block-scale root that writes its quantized bytes to global memory itself: it stages nothing,
    D is void, and code generation registers uint8_t (one byte) as its aux element."""
    stage = None

    @classmethod
    def aux_bytes(cls, ctx, s) -> float | None:
        return 1.0


class BlockScaleInt4(_BlockScaleBytes):
    covers = "1xB block-scaled i4 tiles (int4_group_scale), packed two per byte, and their scales"
    types = PACKED_TYPES
    benefit = 41     # it stores the bytes itself: the root all the same


class BlockScaleHalfWidth(_BlockScaleBytes):
    covers = ("1xB block-scaled e4m3/e5m2/i8 tiles half as wide as the accumulator (swiglu's output), "
              "stored one byte per column pair, and their scales")
    types = QUANT_TYPES
    width = Fraction(1, 2)
    benefit = 40


# ---------------------------------------------------------------- block statistics scaling a tile
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
    if len(found) != 1:
        return None
    return found[0]


def match_block_root(ctx, s):
    """(y, s, divide, block reduction, mask) when a store is y * s / y / s of a block statistic s (mask
    None), or select(c, y' * s, w) (either order; y = select(c, y', w), the mask 1 where the scale
    applies, else 0), or None."""
    v = s.value
    dep = block_dependent(ctx.k)
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


class BlockReduceScale(TileStore):
    role = "root"
    writes_d = True
    covers = ("a tile times (or divided by) a function of one 1xB block reduction of a tile, e.g. QK-norm's "
              "h * rsqrt(block_mean(h * h, Dh) + eps) (bf16/f16/f32/e4m3/e5m2 outputs), and that block value; "
              "also selected against a tile without it (select(col < n, head_rmsnorm(acc, g, 128), acc))")
    ops = ("mul", "div", "select")
    benefit = 30     # must be the root too; a block_quant store is its own node (40-42)

    @classmethod
    def matches(cls, ctx, s) -> bool:
        return ctx.tensors[s.tensor].dtype in SCALED_TYPES and match_block_root(ctx, s) is not None

    @classmethod
    def claims(cls, ctx, s) -> list:
        """The stores of the block value itself: this node writes them."""
        scale = match_block_root(ctx, s)[1]
        return [o for o in ctx.k.stores if o.value is scale]


LEAVES: list[type[Pattern]] = [AccFetch, ScalarBroadcast, AuxLoad, PeriodicRowBroadcast, RowBroadcast, ColBroadcast,
                               DoubleWidthLoad, HalfWidthLoad, Coordinate]
ROOTS: list[type[Pattern]] = [BlockScaleD, BlockScaleInt4, BlockScaleHalfWidth, BlockReduceScale, DStore, HalfWidthD,
                              HalfWidthPairD, DoubleWidthD]
STORES: list[type[Pattern]] = [AuxStore, E8m0Store, HalfWidthAux, DoubleWidthAux, PackedInt4Store, RowPartial,
                               ColPartial, RowLsePartial]


# ---------------------------------------------------------------- choice
class Patterns:
    """The patterns of one role, indexed by the root op they match, largest benefit first (the lists'
    order is only the order of the E702 hint)."""

    def __init__(self, patterns: list[type[Pattern]]):
        def ranked(op):
            return sorted((p for p in patterns if not p.ops or op in p.ops), key=lambda p: -p.benefit)
        self.patterns = patterns
        self.by_op = {op: ranked(op) for p in patterns for op in p.ops}
        self.any_op = ranked(None)

    def best(self, ctx, item, op: str) -> type[Pattern] | None:
        found = None
        for p in self.by_op.get(op, self.any_op):
            if found is not None and p.benefit < found.benefit:
                break
            if p.matches(ctx, item):
                if found is not None:
                    raise error("E599", f"internal: node patterns {found.__name__} and {p.__name__} both match "
                                f"a {op} with benefit {p.benefit} (a bug in epic)", getattr(item, "span", None))
                found = p
        return found


LEAF_PATTERNS, ROOT_PATTERNS, STORE_PATTERNS = Patterns(LEAVES), Patterns(ROOTS), Patterns(STORES)


def leaf(ctx, v) -> type[Pattern] | None:
    """The leaf pattern of value v, or None (the functor computes it)."""
    return LEAF_PATTERNS.best(ctx, v, v.op)


def store_nodes(ctx) -> tuple[tuple[type[Pattern], object] | None, list[tuple[type[Pattern] | None, object]]]:
    """(root, stores) of kernel ctx.k: the root (pattern, store) -- the store whose pattern has the
    largest benefit, the first such store -- or None; then every other store that the root does not
    perform itself, with its pattern (None: there is none), in the kernel's order."""
    root = None
    for s in ctx.k.stores:
        p = ROOT_PATTERNS.best(ctx, s, s.value.op)
        if p is not None and (root is None or p.benefit > root[0].benefit):
            root = (p, s)
    claimed = {id(c) for c in root[0].claims(ctx, root[1])} if root else set()
    rest = [(STORE_PATTERNS.best(ctx, s, s.value.op), s) for s in ctx.k.stores
            if (root is None or s is not root[1]) and id(s) not in claimed]
    return root, rest


@dataclass
class Context:
    tensors: dict
    k: object


def chosen(kernel, tensors: dict) -> list[tuple[type[Pattern], Context, object]]:
    """(pattern, ctx, item) of each node a gemm's epilogue gets: its stores' (in store order), then its
    leaves' (a store or value code generation refuses has none)."""
    ctx = Context(tensors, kernel)
    root, rest = store_nodes(ctx)
    order = {id(s): i for i, s in enumerate(kernel.stores)}
    stores = sorted(([root] if root else []) + [r for r in rest if r[0] is not None], key=lambda r: order[id(r[1])])
    leaves = [(p, v) for v in kernel.values if (p := leaf(ctx, v)) is not None]
    return [(p, ctx, item) for p, item in stores + leaves]
