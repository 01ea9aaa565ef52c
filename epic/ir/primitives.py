"""One record per primitive operation and per reduction function: everything epic knows about each.

Every stage reads these records and nothing else dispatches on op names: the front end (surface
names, arity), typing (the type rule), the reference interpreter (float64 semantics), constant
folding, the IR dump, the functor writer (C++ of one element), the combine kernels and reduction
nodes (identity, merge, finalize), the byte ledger (cost) and the docs (`epic ops` prints the table;
a test holds docs/LANGUAGE.md to it). Adding a primitive is adding a record (plus tests and a doc
line); adding a reduction function is adding a `Reduction`.

What the C++ may call: CUDA math functions (`logf`, `__expf`, ...) and the device helpers of
epic/codegen/functor.py (`epic_tanh`, ...), which are printed only into kernels that use them.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable

from .. import dtypes
from ..dtypes import BOOL, F32, I32, DType
from ..lazy import torch
from ..shapes import COL, SCALAR, TILE, Dim, Kind, Shape, broadcast


class TypeRuleError(Exception):
    """Why a primitive cannot take these operands: a diagnostic code and message, without a span
    (the caller knows where the value came from and adds it)."""

    def __init__(self, code: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.code, self.message, self.hint = code, message, hint


class Family(enum.Enum):
    """How a primitive relates to the tile: it decides the type rule's shape, how the interpreter
    aligns operands, and which kind of code-generation node computes it."""
    SOURCE = "source"            # no operands: the accumulator, a tensor load, a literal, a size, a coordinate
    ELEMENTWISE = "elementwise"  # one value per element from the operands' elements
    COMPARE = "compare"          # element-wise, result bool (usable only in select)
    SELECT = "select"
    CAST = "cast"                # round to a dtype (saturating for fp8 and integers)
    PAIR = "pair"                # over adjacent column pairs (2k, 2k+1): the width changes
    REDUCE = "reduce"            # a whole row (-> column vector) or column (-> row vector)
    BLOCK = "block"              # each 1xB block of a row
    PARTIAL = "partial"          # per-tile partial results of a reduction (made by split-reductions)
    COMBINE = "combine"          # partials merged (in a combine kernel)


COSTLY = 4   # cost at which a value shared by several outputs is computed once, not recomputed


# ------------------------------------------------------------------------------------------ attributes
# What a record's attributes may hold: name -> a check of the value (None when it fits, else why not).
# The typed constructor (ir.typing.infer, so ir.core.make and the IR verifier) refuses a value whose
# attributes are unknown to its record, missing, or of the wrong type.
def _is(*types):
    names = "/".join(t.__name__ for t in types)
    return lambda x: None if isinstance(x, types) and not isinstance(x, bool) else f"a {names}, not {x!r}"


def _one_of(*choices):
    return lambda x: None if x in choices else f"one of {', '.join(map(str, choices))}, not {x!r}"


def _reduction_name(x):
    return None if x in REDUCTIONS else f"a reduction function ({', '.join(REDUCTIONS)}), not {x!r}"


def _power_of_two(x):
    return None if isinstance(x, int) and not isinstance(x, bool) and x > 0 and not x & (x - 1) else \
        f"a power of two, not {x!r}"


def _positive_int(x):
    return None if isinstance(x, int) and not isinstance(x, bool) and x > 0 else f"a positive integer, not {x!r}"


def _integer_exponent(x):
    return None if isinstance(x, int) and not isinstance(x, bool) and -64 <= x <= 64 else \
        f"an integer from -64 to 64, not {x!r}"


_NUMBER = _is(int, float)
_SIZE = lambda x: None if isinstance(x, (Dim, int)) and not isinstance(x, bool) else f"a size, not {x!r}"   # noqa: E731
_WIDTH = lambda x: None if isinstance(x, (int, float)) or type(x).__name__ == "Fraction" else \
    f"a width (a fraction of N), not {x!r}"  # noqa: E731
OPTIONAL = "?"    # a schema name ending in this is optional


def attribute_problem(op: str, attrs: dict) -> str | None:
    """Why `attrs` do not fit the record of `op` (None when they do)."""
    schema = PRIMITIVES[op].attrs
    known = {k.rstrip(OPTIONAL) for k in schema}
    for key in attrs:
        if key not in known:
            return f"{op} has no attribute '{key}' (it has: {', '.join(sorted(known)) or 'none'})"
    for key, check in schema.items():
        name = key.rstrip(OPTIONAL)
        if name not in attrs:
            if key.endswith(OPTIONAL):
                continue
            return f"{op} needs the attribute '{name}'"
        why = check(attrs[name])
        if why:
            return f"{op}'s attribute '{name}' must be {why}"
    return None


@dataclass(frozen=True)
class Primitive:
    name: str                           # the op name in the IR
    family: Family
    arity: int
    rule: Callable                      # (args, attrs) -> (DType, Shape); raises TypeRuleError
    # float64 semantics. Pure ops: (xs, attrs) -> tensor, xs already aligned to one shape.
    # context=True: (interpreter, value, xs) -> tensor, for ops that need sizes, tensors or the tile.
    ref: Callable | None = None
    context: bool = False
    cxx: str | Callable | None = None   # C++ of one element: "expf({0})", or (operands, attrs) -> str
    cxx_fast: str | None = None         # used when the result feeds only stores of <= 8 mantissa bits
    cxx_helpers: tuple[str, ...] = ()   # device functions its C++ calls (names in HELPERS below)
    surface: tuple[str, ...] = ()       # names users call: exp(x); dtype names call cast
    operator: str | None = None         # infix or prefix spelling: "+", "-x", "**"
    keyword: str | None = None          # a bare name that means this value: `row`, `col`
    cost: int = 1                       # per element, in FMA-equivalents (a MUFU op ~4)
    fold: bool = False                  # constant folding may evaluate it
    int_results: bool = False           # integer operands give an integer (neg, abs, powi, sign)
    reads: str | None = None            # attribute naming the tensor it reads (load, combine)
    pair_part: int | None = None        # PAIR: 0 = even columns, 1 = odd columns, None = interleave
    algebra: str | None = None          # for the scale-moving passes: product, quotient, negation, power, sum
    # reverse-mode derivative: (b, g) -> one cotangent per operand (None: no gradient flows there), built
    # with the epic/autodiff/builder.py helpers b (b.x(i) the operands, b.y the result); None: a leaf
    vjp: Callable | None = None
    attrs: dict = field(default_factory=dict)   # attribute name ("name?" optional) -> check (see above)
    show: Callable = field(default=lambda attrs: "")   # attribute text in IR dumps
    doc: str = ""

    @property
    def costly(self) -> bool:
        return self.cost >= COSTLY


@dataclass(frozen=True)
class Reduction:
    """A reduction function: how it reduces a whole row, a column or a block, how deterministic
    per-tile partials of it are made and merged (reference and C++). A partial is one float per tile:
    row_lse's is the tile's log-sum-exp (its node computes it online from (max, sum of exp(x - max))
    pairs, epic_nodes/row_lse_partial.hpp)."""
    name: str
    identity: float                     # what an empty tile holds
    ref: Callable                       # (x, dim) -> the reduction along dim, keepdim
    ref_partial: Callable               # (x [..., size]) -> the partial over the last dim ([...])
    ref_merge: Callable                 # (partials, dim) -> the value, partials merged along dim (keepdim)
    cxx_merge: str                      # C++ merging partial {x} into accumulator {a}
    cxx_finalize: str                   # C++ of the result from the accumulator {a}
    cxx_op: str | None = None           # CUTLASS functor of a stock Sm90Row/ColReduction (None: custom node)
    pre: str | None = None              # primitive applied to each element first (amax: abs)
    by_width: bool = False              # mean: the merged sum is divided by the reduced width
    axes: tuple[str, ...] = ("row", "col")
    block: bool = True                  # block_NAME(x, B) exists
    # reverse-mode derivative: (b, g) -> the cotangent of the reduced operand b.x(0), from the cotangent
    # g of the result b.y (broadcast back over the reduced elements)
    vjp: Callable | None = None
    doc: str = ""


# ------------------------------------------------------------------------------------------ type rules
def _numeric(v, what: str) -> None:
    if v.dtype is BOOL:
        raise TypeRuleError("E205", f"{what} needs a number, got a comparison result (bool)",
                            "use select(cond, a, b) to turn a condition into a value")


def _lined_up(what: str, *shapes: Shape) -> Shape:
    shape = shapes[0]
    for s in shapes[1:]:
        shape = broadcast(shape, s)
        if isinstance(shape, str):
            raise TypeRuleError("E207", f"operands of {what} do not line up: {shape}",
                                "both sides must have the same width: after even/odd or swiglu a tile is "
                                "half as wide as the accumulator")
    return shape


def _unary_rule(name: str, int_results: bool):
    def rule(args, attrs):
        (x,) = args
        _numeric(x, name)
        return (I32 if int_results and x.dtype.is_int else F32), x.shape
    return rule


def _binary_rule(name: str, always_float: bool = False):
    def rule(args, attrs):
        a, b = args
        _numeric(a, name)
        _numeric(b, name)
        shape = _lined_up(name, a.shape, b.shape)
        return (F32 if always_float else dtypes.promote(a.dtype, b.dtype)), shape
    return rule


def _compare_rule(name: str):
    def rule(args, attrs):
        a, b = args
        if (a.dtype is BOOL) != (b.dtype is BOOL):
            raise TypeRuleError("E205", "comparison of a bool with a number")
        return BOOL, _lined_up(name, a.shape, b.shape)
    return rule


def _select_rule(args, attrs):
    c, a, b = args
    if c.dtype is not BOOL:
        raise TypeRuleError("E205", "the first argument of select must be a comparison", "write select(x > 0, a, b)")
    _numeric(a, "select")
    _numeric(b, "select")
    return dtypes.promote(a.dtype, b.dtype), _lined_up("select", c.shape, a.shape, b.shape)


def _cast_rule(args, attrs):
    (x,) = args
    _numeric(x, "a cast")
    return attrs["to"], x.shape


def _pair_rule(name: str, part: int | None):
    def rule(args, attrs):
        for x in args:
            _numeric(x, name)
        shape = _lined_up(name, *(x.shape for x in args))
        if not shape.has_columns or shape.kind is Kind.BLOCK:
            raise TypeRuleError("E206", f"{name} works on adjacent column pairs (2k, 2k+1), but its operand is a "
                                f"{shape.describe()}", "apply it to a tile or a row vector")
        if part is None:
            return dtypes.promote(args[0].dtype, args[1].dtype), Shape(shape.kind, shape.width * 2)
        return args[0].dtype, Shape(shape.kind, shape.width / 2)
    return rule


def _reduce_rule(args, attrs):
    (x,) = args
    axis = attrs["axis"]
    what = f"{axis}_{attrs['fn']}"
    _numeric(x, what)
    if is_whole_tensor_reduce(x.kind, axis):
        return F32, SCALAR    # the last step of a whole-tensor reduction: col_f(row_f(x)) = all_f(x)
    if x.kind is not Kind.TILE:
        other = "col" if axis == "row" else "row"
        hint = (f"{other}_{attrs['fn']} reduces it to one number (all_{attrs['fn']}(x) reduces a whole tile at once)"
                if x.kind in (Kind.COL, Kind.ROW) else
                "a scalar is already one number" if x.kind is Kind.SCALAR else "reduce the tile before the blocks")
        raise TypeRuleError("E206", f"{what} reduces a tile, but its operand is a {x.shape.describe()}", hint)
    return F32, (COL if axis == "row" else Shape(Kind.ROW, x.shape.width))


def is_whole_tensor_reduce(operand_kind: Kind, axis: str) -> bool:
    """col_f of a column vector (one value per row) or row_f of a row vector: one number for the tensor."""
    return (operand_kind, axis) in ((Kind.COL, "col"), (Kind.ROW, "row"))


def _block_rule(args, attrs):
    (x,) = args
    _numeric(x, f"block_{attrs['fn']}")
    if x.kind is not Kind.TILE:
        raise TypeRuleError("E206", f"block_{attrs['fn']} reduces 1x{attrs['block']} blocks of a tile's rows, "
                            f"but its operand is a {x.shape.describe()}")
    return F32, Shape(Kind.BLOCK, x.shape.width, attrs["block"])


PARTIAL_SHAPE = Shape(Kind.PARTIAL)


def _partial_rule(args, attrs):
    (x,) = args
    if x.kind is not Kind.TILE:
        raise TypeRuleError("E206", "per-tile partials reduce a tile")
    return F32, PARTIAL_SHAPE


def _combine_rule(args, attrs):
    if attrs["axis"] == "all":
        return F32, SCALAR
    return F32, (COL if attrs["axis"] == "row" else Shape(Kind.ROW, attrs["of_width"]))


def _fixed(dtype: DType, shape: Shape):
    return lambda args, attrs: (dtype, shape)


def _from_attrs(args, attrs):
    return attrs["dtype"], attrs["shape"]


# ------------------------------------------------------------------------------------------ reference
def _powi(x, p: int):
    return x ** p if p >= 0 else 1.0 / x ** (-p)


def _cxx_powi(xs, attrs) -> str:
    p = attrs["exp"]
    if p == 0:
        return "1.0f"
    prod = " * ".join([xs[0]] * abs(p))
    return f"({prod})" if p > 0 else f"(1.0f / ({prod}))"


def _fmt_num(x) -> str:
    return repr(int(x)) if float(x) == int(x) and abs(x) < 2**53 else repr(float(x))


def _elementwise(name, arity, ref, cxx, *, vjp, cost=1, cxx_fast=None, helpers=(), surface=(), operator=None,
                 algebra=None, int_results=False, doc=""):
    rule = _unary_rule(name, int_results) if arity == 1 else _binary_rule(name, always_float=name == "div")
    return Primitive(name, Family.ELEMENTWISE, arity, rule, ref=ref, cxx=cxx, cxx_fast=cxx_fast,
                     cxx_helpers=tuple(helpers), surface=surface, operator=operator, cost=cost, fold=True,
                     int_results=int_results, algebra=algebra, vjp=vjp, doc=doc)


_FLAT = lambda b, g: (None,)    # piecewise constant (round, floor, sign): zero derivative almost everywhere
_LN2 = math.log(2.0)


# Device functions a primitive's C++ may call: printed into a generated kernel only when it calls
# them (so adding one does not change, and rebuild, every cached kernel). name -> (code, needs).
HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "epic_reduce_2pi": (r"""
// sin/cos of large angles (RoPE: position * frequency): Cody-Waite reduction by 2*pi, then the fast
// intrinsic; absolute error ~1e-7 for |x| < 1e5, far below bf16 output precision.
__device__ __forceinline__ float epic_reduce_2pi(float x) {
  float k = rintf(x * 0.15915494309189535f);
  x = fmaf(-k, 6.28318548202514648f, x);
  return fmaf(-k, -1.7484556e-07f, x);
}""", ()),
    "epic_sin": (r"""
__device__ __forceinline__ float epic_sin(float x) { return __sinf(epic_reduce_2pi(x)); }""", ("epic_reduce_2pi",)),
    "epic_cos": (r"""
__device__ __forceinline__ float epic_cos(float x) { return __cosf(epic_reduce_2pi(x)); }""", ("epic_reduce_2pi",)),
    "epic_tanh": (r"""
// tanh from one fast exponential: 1 - 2 / (exp(2|x|) + 1) keeps ~1e-7 absolute error near +-1 (so
// 1 + tanh(x) stays accurate in GELU's tail, unlike tanh.approx), and a short series near 0.
__device__ __forceinline__ float epic_tanh(float x) {
  float a = fabsf(x);
  float t = a < 0.004f ? a * (1.f - a * a * (1.f / 3.f)) : 1.f - 2.f / (__expf(2.f * a) + 1.f);
  return copysignf(t, x);
}""", ()),
    "epic_sign": (r"""
// -1 or +1, and x itself at +-0 and nan (so the sign of zero is kept and nan stays nan)
__device__ __forceinline__ float epic_sign(float x) { return x > 0.f ? 1.f : (x < 0.f ? -1.f : x); }""", ()),
}


def _sign(xs, a):
    # -1, +1, and the operand itself at 0, -0 and nan (so the sign of zero is kept)
    x = xs[0]
    return torch.where(x > 0, torch.ones_like(x), torch.where(x < 0, -torch.ones_like(x), x))


def _block_quant_rule(args, attrs):
    x, s = args
    if x.kind is not Kind.TILE or s.shape != Shape(Kind.BLOCK, x.shape.width, attrs["block"]):
        raise TypeRuleError("E206", f"block_quant divides a tile by its 1x{attrs['block']} block scale, not a "
                            f"{x.shape.describe()} by a {s.shape.describe()}")
    return F32, x.shape


def _block_quant_ref(xs, attrs):
    x, s = xs       # s: one value per block of x's row (the last block may be partial)
    return x / s.repeat_interleave(attrs["block"], dim=-1)[..., :x.shape[-1]]


_PRIMS = [
    # ---- sources (operand-free values); their meaning needs the interpreter's context
    Primitive("acc", Family.SOURCE, 0, lambda args, attrs: (attrs.get("dtype", F32), TILE),
              attrs={"dtype?": _is(DType)},
              ref=lambda it, v, xs: it.accumulator(), context=True, keyword="acc",
              doc="the accumulator tile of the gemm (f32; i32 for int8 x int8 gemms)"),
    Primitive("load", Family.SOURCE, 0, _from_attrs, ref=lambda it, v, xs: it.load(v), context=True,
              attrs={"tensor": _is(str), "dtype": _is(DType), "shape": _is(Shape), "period?": _is(Dim)},
              reads="tensor", show=lambda a: a["tensor"] + (f" every {a['period']} columns" if "period" in a else ""),
              doc="a program input or an earlier gemm's stored tensor"),
    Primitive("const", Family.SOURCE, 0, lambda args, attrs: (attrs["dtype"], SCALAR),
              attrs={"value": _NUMBER, "dtype": _is(DType)},
              ref=lambda it, v, xs: it.constant(float(v.attrs["value"])), context=True,
              show=lambda a: _fmt_num(a["value"]) if a["dtype"].is_int else repr(float(a["value"])),
              doc="a literal number"),
    Primitive("dim", Family.SOURCE, 0, _fixed(I32, SCALAR), attrs={"dim": _is(Dim)}, ref=lambda it, v, xs: it.dim_value(v.attrs["dim"]),
              context=True, show=lambda a: str(a["dim"]), doc="a dimension's size (D, 2*F) used as a value"),
    Primitive("row_index", Family.SOURCE, 0, _fixed(I32, COL), ref=lambda it, v, xs: it.coordinate("row"),
              context=True, keyword="row", cost=0,
              doc="the row index of each element (a column vector); a float in the epilogue, so M is at most 2^24 "
                  "(else E607)"),
    Primitive("col_index", Family.SOURCE, 0, _fixed(I32, Shape(Kind.ROW)), ref=lambda it, v, xs: it.coordinate("col"),
              context=True, keyword="col", cost=0,
              doc="the column index of each element (a row vector); a float in the epilogue, so N is at most 2^24 "
                  "(else E607)"),

    # ---- element-wise: unary
    _elementwise("neg", 1, lambda xs, a: -xs[0], "(-{0})", operator="-x", algebra="negation", int_results=True,
                 vjp=lambda b, g: (b.neg(g),),
                 doc="negation"),
    _elementwise("abs", 1, lambda xs, a: xs[0].abs(), "fabsf({0})", surface=("abs",), int_results=True,
                 vjp=lambda b, g: (b.mul(g, b.op('sign', b.x(0))),),
                 doc="absolute value"),
    _elementwise("exp", 1, lambda xs, a: xs[0].exp(), "__expf({0})", cost=4, surface=("exp",), vjp=lambda b, g: (b.mul(g, b.y),),
                 doc="e ** x"),
    _elementwise("log", 1, lambda xs, a: xs[0].log(), "logf({0})", cost=8, surface=("log",),
                 vjp=lambda b, g: (b.div(g, b.x(0)),),
                 doc="natural logarithm (-inf at 0, nan below)"),
    _elementwise("log1p", 1, lambda xs, a: torch.log1p(xs[0]), "log1pf({0})", cost=8, surface=("log1p",),
                 vjp=lambda b, g: (b.div(g, b.add(b.c(1.0), b.x(0))),),
                 doc="log(1 + x), accurate near 0"),
    _elementwise("expm1", 1, lambda xs, a: torch.expm1(xs[0]), "expm1f({0})", cost=8, surface=("expm1",),
                 vjp=lambda b, g: (b.mul(g, b.add(b.y, b.c(1.0))),),
                 doc="exp(x) - 1, accurate near 0"),
    _elementwise("exp2", 1, lambda xs, a: torch.exp2(xs[0]), "exp2f({0})", cost=4, surface=("exp2",),
                 vjp=lambda b, g: (b.mul(g, b.mul(b.y, b.c(_LN2))),),
                 doc="2 ** x (exact powers of two at integers: MX block scales)"),
    _elementwise("log2", 1, lambda xs, a: torch.log2(xs[0]), "log2f({0})", cost=8, surface=("log2",),
                 vjp=lambda b, g: (b.div(g, b.mul(b.x(0), b.c(_LN2))),),
                 doc="base-2 logarithm (exact integers at powers of two; -inf at 0, nan below)"),
    # a primitive (not a prelude def) so that its derivative is y * (1 - y): differentiating
    # 1 / (1 + exp(-x)) gives 0 * inf = nan where exp(-x) overflows
    _elementwise("sigmoid", 1, lambda xs, a: torch.sigmoid(xs[0]), "(1.0f / (1.0f + __expf(-{0})))", cost=8,
                 cxx_fast="__fdividef(1.0f, 1.0f + __expf(-{0}))", surface=("sigmoid",),
                 vjp=lambda b, g: (b.mul(g, b.mul(b.y, b.sub(b.c(1.0), b.y))),),
                 doc="the logistic function 1 / (1 + exp(-x))"),
    _elementwise("sqrt", 1, lambda xs, a: xs[0].sqrt(), "sqrtf({0})", cost=4, surface=("sqrt",), vjp=lambda b, g: (b.div(g, b.mul(b.c(2.0), b.y)),),
                 doc="square root"),
    _elementwise("rsqrt", 1, lambda xs, a: xs[0].rsqrt(), "rsqrtf({0})", cost=4, surface=("rsqrt",),
                 vjp=lambda b, g: (b.mul(g, b.mul(b.c(-0.5), b.op('powi', b.y, exp=3))),),
                 doc="1 / sqrt(x)"),
    _elementwise("tanh", 1, lambda xs, a: xs[0].tanh(), "epic_tanh({0})", cost=6, helpers=("epic_tanh",), surface=("tanh",),
                 vjp=lambda b, g: (b.mul(g, b.sub(b.c(1.0), b.mul(b.y, b.y))),),
                 doc="hyperbolic tangent"),
    _elementwise("erf", 1, lambda xs, a: torch.erf(xs[0]), "erff({0})", cost=8, surface=("erf",),
                 vjp=lambda b, g: (b.mul(g, b.mul(b.c(2.0 / math.sqrt(math.pi)), b.op('exp', b.neg(b.mul(b.x(0), b.x(0)))))),),
                 doc="error function"),
    _elementwise("sin", 1, lambda xs, a: xs[0].sin(), "epic_sin({0})", cost=6, helpers=("epic_sin",), surface=("sin",),
                 vjp=lambda b, g: (b.mul(g, b.op('cos', b.x(0))),),
                 doc="sine (radians)"),
    _elementwise("cos", 1, lambda xs, a: xs[0].cos(), "epic_cos({0})", cost=6, helpers=("epic_cos",), surface=("cos",),
                 vjp=lambda b, g: (b.neg(b.mul(g, b.op('sin', b.x(0)))),),
                 doc="cosine (radians)"),
    _elementwise("round", 1, lambda xs, a: torch.round(xs[0]), "rintf({0})", surface=("round",),
                 vjp=_FLAT,
                 doc="round to the nearest integer, ties to even"),
    _elementwise("ceil", 1, lambda xs, a: torch.ceil(xs[0]), "ceilf({0})", surface=("ceil",),
                 vjp=_FLAT,
                 doc="the smallest integer >= x"),
    _elementwise("floor", 1, lambda xs, a: torch.floor(xs[0]), "floorf({0})", surface=("floor",),
                 vjp=_FLAT,
                 doc="the largest integer <= x"),
    _elementwise("sign", 1, _sign, "epic_sign({0})", helpers=("epic_sign",), surface=("sign",), int_results=True,
                 vjp=_FLAT,
                 doc="-1, 0 or +1 (zero keeps its sign; nan stays nan)"),
    Primitive("powi", Family.ELEMENTWISE, 1, _unary_rule("powi", True),
              ref=lambda xs, a: _powi(xs[0], a["exp"]), cxx=_cxx_powi, operator="x ** n", fold=True,
              int_results=True, algebra="power", show=lambda a: str(a["exp"]), attrs={"exp": _integer_exponent},
              vjp=lambda b, g: (None if b.v.attrs["exp"] == 0 else b.mul(g, b.mul(
                  b.c(float(b.v.attrs["exp"])), b.op("powi", b.x(0), exp=b.v.attrs["exp"] - 1)
                  if b.v.attrs["exp"] > -64 else b.div(b.y, b.x(0)))),),      # x ** -65 is not a powi
              doc="integer power (n an integer literal from -64 to 64)"),

    # ---- element-wise: binary
    _elementwise("add", 2, lambda xs, a: xs[0] + xs[1], "({0} + {1})", operator="+", algebra="sum", vjp=lambda b, g: (g, g),
                 doc="addition"),
    _elementwise("sub", 2, lambda xs, a: xs[0] - xs[1], "({0} - {1})", operator="-", algebra="sum",
                 vjp=lambda b, g: (g, b.neg(g)),
                 doc="subtraction"),
    _elementwise("mul", 2, lambda xs, a: xs[0] * xs[1], "({0} * {1})", operator="*", algebra="product",
                 vjp=lambda b, g: (b.mul(g, b.x(1)), b.mul(g, b.x(0))),
                 doc="multiplication"),
    _elementwise("div", 2, lambda xs, a: xs[0] / xs[1], "({0} / {1})", cxx_fast="__fdividef({0}, {1})", cost=4,
                 operator="/", algebra="quotient", vjp=lambda b, g: (b.div(g, b.x(1)), b.neg(b.div(b.mul(g, b.y), b.x(1)))),
                 doc="division (always f32)"),
    _elementwise("min", 2, lambda xs, a: torch.fmin(xs[0], xs[1]), "fminf({0}, {1})", surface=("min",),
                 vjp=lambda b, g: (b.where(b.cmp('le', b.x(0), b.x(1)), g), b.where(b.cmp('gt', b.x(0), b.x(1)), g)),
                 doc="the smaller operand (a NaN operand is ignored, as IEEE minNum / fminf)"),
    _elementwise("max", 2, lambda xs, a: torch.fmax(xs[0], xs[1]), "fmaxf({0}, {1})", surface=("max",),
                 vjp=lambda b, g: (b.where(b.cmp('ge', b.x(0), b.x(1)), g), b.where(b.cmp('lt', b.x(0), b.x(1)), g)),
                 doc="the larger operand (a NaN operand is ignored, as IEEE maxNum / fmaxf)"),

    # ---- comparisons (bool results, usable in select)
    *[Primitive(n, Family.COMPARE, 2, _compare_rule(n), ref=r, cxx=f"({{0}} {s} {{1}})", operator=s,
                vjp=lambda b, g: (None, None), doc=f"comparison {s}")
      for n, s, r in (("eq", "==", lambda xs, a: xs[0] == xs[1]), ("ne", "!=", lambda xs, a: xs[0] != xs[1]),
                      ("lt", "<", lambda xs, a: xs[0] < xs[1]), ("le", "<=", lambda xs, a: xs[0] <= xs[1]),
                      ("gt", ">", lambda xs, a: xs[0] > xs[1]), ("ge", ">=", lambda xs, a: xs[0] >= xs[1]))],
    Primitive("select", Family.SELECT, 3, _select_rule, ref=lambda xs, a: torch.where(xs[0], xs[1], xs[2]),
              cxx="({0} ? {1} : {2})", surface=("select",),
              vjp=lambda b, g: (None, b.where(b.x(0), g), b.where(b.x(0), None, g)), doc="select(cond, a, b): a where cond holds, else b"),

    # ---- casts: surface names are the dtype names (f32(x), bf16(x), e4m3(x), ...)
    Primitive("cast", Family.CAST, 1, _cast_rule, attrs={"to": _is(DType)}, ref=lambda it, v, xs: it.round(xs[0], v.attrs["to"]),
              context=True, show=lambda a: str(a["to"]), vjp=lambda b, g: (b.through_rounding(g),),
              doc="round to a dtype: fp8 and integer casts saturate, integers round half to even"),

    # ---- pairwise maps over adjacent columns
    Primitive("even", Family.PAIR, 1, _pair_rule("even", 0), ref=lambda it, v, xs: it.pair_part(v, xs[0], 0),
              context=True, surface=("even",), pair_part=0, cost=0,
              vjp=lambda b, g: (b.op("interleave", g, b.c(0.0)),), doc="columns 2k (the width halves)"),
    Primitive("odd", Family.PAIR, 1, _pair_rule("odd", 1), ref=lambda it, v, xs: it.pair_part(v, xs[0], 1),
              context=True, surface=("odd",), pair_part=1, cost=0,
              vjp=lambda b, g: (b.op("interleave", b.c(0.0), g),), doc="columns 2k+1 (the width halves)"),
    Primitive("interleave", Family.PAIR, 2, _pair_rule("interleave", None),
              ref=lambda xs, a: torch.stack(torch.broadcast_tensors(xs[0], xs[1]), dim=-1).flatten(-2),
              surface=("interleave",), cost=0,
              vjp=lambda b, g: (b.op("even", g), b.op("odd", g)) if g.shape.has_columns else (g, g), doc="columns a0 b0 a1 b1 ... (the width doubles)"),

    # ---- reductions; the function (sum, max, ...) is an attribute naming a Reduction below
    Primitive("reduce", Family.REDUCE, 1, _reduce_rule, attrs={"axis": _one_of("row", "col"), "fn": _reduction_name}, ref=lambda it, v, xs: it.reduce(v, xs[0]), context=True,
              show=lambda a: f"{a['axis']} {a['fn']}", vjp=lambda b, g: (b.reduction_vjp(g),), doc="a whole row (-> column vector) or column (-> row vector)"),
    # (a block size that is not a power of two is the user's: the layout check says E404)
    Primitive("block_reduce", Family.BLOCK, 1, _block_rule, attrs={"fn": _reduction_name, "block": _positive_int}, ref=lambda it, v, xs: it.block_reduce(v, xs[0]),
              context=True, show=lambda a: f"{a['fn']} 1x{a['block']}", vjp=lambda b, g: (b.reduction_vjp(g),),
              doc="each 1xB block of a row"),
    Primitive("partial", Family.PARTIAL, 1, _partial_rule,
              attrs={"axis": _one_of("row", "col"), "fn": _reduction_name, "buffer": _is(str)}, ref=lambda it, v, xs: it.partial(v, xs[0]),
              context=True, show=lambda a: f"{a['axis']} {a['fn']} -> {a['buffer']}",
              doc="per-tile partials of a reduction (split-reductions)"),
    Primitive("combine", Family.COMBINE, 0, _combine_rule,
              attrs={"axis": _one_of("row", "col", "all"), "fn": _reduction_name, "buffer": _is(str), "width": _SIZE,
                     "of_width": _WIDTH, "pick?": _is(str)}, ref=lambda it, v, xs: it.combine(v), context=True,
              reads="buffer", show=lambda a: f"{a['axis']} {a['fn']} <- {a['buffer']}"
                                             + (f" (one tile: column {a['pick']})" if "pick" in a else ""),
              doc="partials merged in tile order (a combine kernel); pick: a row sum of select(col == L, x, 0) "
                  "for an integer input L, whose one nonzero partial is in the tile of column L"),
    # ---- idioms as internal ops (made by passes, never written): code generation matches the op
    Primitive("block_quant", Family.BLOCK, 2, _block_quant_rule, ref=_block_quant_ref,
              cxx="{0} / {1}",   # one element over its block's scale (the decode tail's code, codegen/tail.py)
              attrs={"block": _power_of_two, "floor": _NUMBER, "qmax": _NUMBER},
              show=lambda a: f"1x{a['block']} floor {_fmt_num(a['floor'])} qmax {_fmt_num(a['qmax'])}",
              doc="x / s for a tile x and its 1xB block scale s = max(block_amax(x, B), floor) / qmax "
                  "(the block-quant pass; attributes block, floor, qmax)"),
]

PRIMITIVES: dict[str, Primitive] = {p.name: p for p in _PRIMS}


# ------------------------------------------------------------------------------------------ reductions
def _lse_partial(x: torch.Tensor) -> torch.Tensor:
    """A tile's log-sum-exp: -inf for a tile with nothing in it (all elements -inf)."""
    return torch.logsumexp(x, -1)


_SUM = dict(ref=lambda x, d: x.sum(d, keepdim=True), ref_partial=lambda x: x.sum(-1),
            ref_merge=lambda s, d: s.sum(d, keepdim=True), cxx_merge="{a} += {x};", cxx_op="cutlass::plus")
def _ignoring_nan(x: torch.Tensor, fill: float) -> torch.Tensor:
    """max/min reductions ignore NaN, as fmaxf/fminf (and CUTLASS's maximum/minimum) do."""
    return torch.nan_to_num(x, nan=fill, posinf=math.inf, neginf=-math.inf)


_MAX = dict(ref=lambda x, d: _ignoring_nan(x, -math.inf).amax(d, keepdim=True),
            ref_partial=lambda x: _ignoring_nan(x, -math.inf).amax(-1),
            ref_merge=lambda s, d: s.amax(d, keepdim=True), cxx_merge="{a} = fmaxf({a}, {x});",
            cxx_op="cutlass::maximum")

def _at_extreme(b, g, of=lambda b, x: x, times=None):
    # the elements at the max (min) share the gradient evenly, as torch's amax does: with bf16 or rounded
    # inputs a row's max is often tied, and giving each tie all of it would count it k times
    at = b.cmp("eq", of(b, b.x(0)), b.y)
    ties = b.op(b.v.op, b.where(at, b.c(1.0)), **{**b.v.attrs, "fn": "sum"})
    share = b.div(g, ties)
    return b.where(at, share if times is None else b.mul(share, times(b, b.x(0))))


REDUCTIONS: dict[str, Reduction] = {r.name: r for r in (
    Reduction("sum", 0.0, cxx_finalize="{a}", vjp=lambda b, g: g, doc="sum", **_SUM),
    Reduction("mean", 0.0, cxx_finalize="{a}", by_width=True, block=False, doc="mean",
              vjp=lambda b, g: b.div(g, b.reduced_width()),
              **dict(_SUM, ref=lambda x, d: x.mean(d, keepdim=True))),
    Reduction("max", -math.inf, cxx_finalize="{a}", vjp=_at_extreme, doc="largest value (NaN ignored)", **_MAX),
    Reduction("min", math.inf, ref=lambda x, d: _ignoring_nan(x, math.inf).amin(d, keepdim=True),
              ref_partial=lambda x: _ignoring_nan(x, math.inf).amin(-1),
              ref_merge=lambda s, d: s.amin(d, keepdim=True), cxx_merge="{a} = fminf({a}, {x});",
              cxx_finalize="{a}", cxx_op="cutlass::minimum", vjp=_at_extreme, doc="smallest value (NaN ignored)"),
    Reduction("amax", 0.0, cxx_finalize="{a}", pre="abs",
              vjp=lambda b, g: _at_extreme(b, g, of=lambda b, x: b.op("abs", x), times=lambda b, x: b.op("sign", x)),
              doc="largest absolute value, max(abs(x)) (NaN ignored)",
              **dict(_MAX, ref=lambda x, d: _ignoring_nan(x.abs(), 0.0).amax(d, keepdim=True))),
    Reduction("lse", -math.inf, ref=lambda x, d: torch.logsumexp(x, d, keepdim=True),
              ref_partial=_lse_partial, ref_merge=lambda s, d: torch.logsumexp(s, d, keepdim=True), block=False,
              # log(exp(a) + exp(x)) against the larger side; symmetric bit for bit, so lanes that merge
              # each other's values end with the same bits. An empty side (-inf) adds nothing, two +inf
              # give +inf, and a NaN side gives NaN (comparisons, not fmaxf/fminf, which drop a NaN)
              cxx_merge=("{{ const float hi_ = {a} > {x} ? {a} : {x}, lo_ = {a} > {x} ? {x} : {a}; "
                         "{a} = (lo_ == -INFINITY || lo_ == INFINITY) ? hi_ : hi_ + log1pf(__expf(lo_ - hi_)); }}"),
              cxx_finalize="{a}",
              vjp=lambda b, g: b.mul(g, b.op("exp", b.sub(b.x(0), b.y))),
              doc="log-sum-exp, merged from per-tile log-sum-exps"),
)}


# ------------------------------------------------------------------------------------------ lookups
def prim(op: str) -> Primitive:
    return PRIMITIVES[op]


def family(op: str) -> Family:
    return PRIMITIVES[op].family


def reduction(fn: str) -> Reduction:
    return REDUCTIONS[fn]


def is_accumulator(op: str) -> bool:
    return op == "acc"


def is_load(v) -> bool:
    """A tensor read (a `load` value): the tensor is v.attrs["tensor"]."""
    return PRIMITIVES[v.op].reads == "tensor"


def selected_column(v):
    """(L, x) for v = select(col == L, x, 0) (either side of ==: the body of row_pick), else None."""
    if v.op != "select" or v.args[0].op != "eq" or not is_literal(v.args[2]) or v.args[2].attrs["value"] != 0:
        return None
    others = [a for a in v.args[0].args if a.op != "col_index"]
    return (others[0], v.args[1]) if len(others) == 1 else None


def coordinate_axis(v) -> str | None:
    """"row" or "col" for a row or column index value (the epilogue computes it as a float), else None."""
    k = PRIMITIVES[v.op].keyword
    return k if k in ("row", "col") else None


def is_literal(v) -> bool:
    """A literal number (a `const` value): its value is v.attrs["value"]."""
    return v.op == "const"


@dataclass(frozen=True)
class Call:
    """What a function name written in a program means: a primitive with fixed attributes, and the
    names of trailing integer-literal arguments that become attributes (block_max(x, 128))."""
    primitive: Primitive
    attrs: dict
    literal_args: tuple[str, ...] = ()
    inner: dict | None = None           # applied first, with these attributes (all_f(x) = col_f(row_f(x)))

    @property
    def arity(self) -> int:
        return self.primitive.arity + len(self.literal_args)


def _calls() -> dict[str, Call]:
    out: dict[str, Call] = {}
    for p in _PRIMS:
        for s in p.surface:
            out[s] = Call(p, {})
    for dt in dtypes.ALL.values():
        if dt is not BOOL:
            out[dt.name] = Call(PRIMITIVES["cast"], {"to": dt})
    for r in REDUCTIONS.values():
        for axis in r.axes:
            out[f"{axis}_{r.name}"] = Call(PRIMITIVES["reduce"], {"axis": axis, "fn": r.name})
        out[f"all_{r.name}"] = Call(PRIMITIVES["reduce"], {"axis": "col", "fn": r.name},
                                    inner={"axis": "row", "fn": r.name})
        if r.block:
            out[f"block_{r.name}"] = Call(PRIMITIVES["block_reduce"], {"fn": r.name}, ("block",))
    return out


CALLS: dict[str, Call] = _calls()
KEYWORDS: dict[str, Primitive] = {p.keyword: p for p in _PRIMS if p.keyword}
BUILTIN_NAMES = set(CALLS) | set(KEYWORDS)
RESERVED = {"acc", "row", "col", "in", "out", "tmp", "def", "gemm", "with", "use", "return"}


def call(name: str) -> Call | None:
    """The primitive a function name calls (dtype names call the cast), or None."""
    if name in CALLS:
        return CALLS[name]
    dt = dtypes.lookup(name)
    if dt is not None and dt is not BOOL:
        return Call(PRIMITIVES["cast"], {"to": dt})
    return None

