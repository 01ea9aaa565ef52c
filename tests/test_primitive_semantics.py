"""Every primitive of the language against independent math, through the public path only.

Each case writes a small .epi program as text, analyzes it with `epic.pipeline.analyze` and runs
`epic.reference.run` on its source program. Expected values come from Python's `math` module and
float arithmetic, from torch functions applied directly, or are numbers written by hand -- never
from epic's own code -- so a primitive whose meaning drifts (in the reference interpreter, or
anywhere both sides of a rewrite-equivalence test share) fails here.

Feeding exact values: element-wise cases declare f32 tile inputs `u`, `v` (filled with one value
each) and store the expression itself, `out y: f32 = EXPR`, in exact mode (f32 stores keep their
float64 value there). Nothing is added to the result, so no `+ acc * 0` can turn -0.0 into +0.0
(-0.0 + 0.0 == +0.0 in IEEE arithmetic) or inf into nan; the GEMM operands are zeros and unused.
Where a value needs more precision than f32 (casts and stores of values between two f32
numbers), the input is `u + v` with both parts f32: the float64 sum is exact.

Where the docs had to decide a semantics (NaN through min/max and integer casts, rounding through
f32), the decision is written next to the cases that pin it.
"""
from __future__ import annotations

import functools
import importlib
import math
import operator
import pathlib
import struct

import pytest
import torch
import torch.nn.functional as F

from epic import dtypes, pipeline, reference
from epic.diagnostics import EpicError

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAMS = [ROOT / "tests" / "programs" / "every_primitive.epi",
            ROOT / "tests" / "programs" / "every_primitive_custom.epi"]

D64 = torch.float64
INF, NAN = math.inf, math.nan
M, K, N = 3, 4, 8

# Decided semantics (docs/LANGUAGE.md, "Types"), checked here with hand-written values:
# - rounded mode rounds a float64 value to a 16/8-bit float through float32, as kernels (which compute in
#   f32) do: f32(x) first, then the dtype;
# - a NaN cast or stored to an integer type becomes 0 (as the GPU's saturating cvt does);
# - min/max ignore a NaN operand (IEEE minNum/maxNum, fminf/fmaxf), and so do max/min reductions.


# ---------------------------------------------------------------------------------------- the primitives
def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@functools.lru_cache(maxsize=None)
def registry() -> tuple[frozenset, frozenset, frozenset]:
    """(op names, reduction functions, block reduction functions) that epic declares, read at test time
    from whichever tables exist (epic/ir/ops.py: _TABLE, REDUCE_FNS, BLOCK_FNS; epic/ir/primitives.py:
    PRIMITIVES, REDUCTIONS), minus the internal ops passes make: split-reductions' partial and combine,
    block-quant's block_quant (tests/test_idiom_ops.py checks its meaning)."""
    names, fns, block_fns = set(), set(), set()
    legacy = _module("epic.ir.ops")
    if legacy is not None and hasattr(legacy, "_TABLE"):
        names |= set(legacy._TABLE)
        fns |= set(getattr(legacy, "REDUCE_FNS", ()))
        block_fns |= set(getattr(legacy, "BLOCK_FNS", ()))
    records = _module("epic.ir.primitives")
    if records is not None and hasattr(records, "PRIMITIVES"):
        names |= set(records.PRIMITIVES)
        for name, r in getattr(records, "REDUCTIONS", {}).items():
            fns.add(name)
            if getattr(r, "block", False):
                block_fns.add(name)
    assert names, "no table of primitives found in epic.ir"
    return frozenset(names - {"partial", "combine", "block_quant"}), frozenset(fns), frozenset(block_fns)


def unless_primitive(name: str, kind: int = 0) -> list:
    """A skip mark for cases of a primitive this version of epic does not have (yet)."""
    return [] if name in registry()[kind] else [pytest.mark.skip(reason=f"'{name}' is not a primitive here")]


# ---------------------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=None)
def source_program(text: str):
    return pipeline.analyze(text, name="t.epi").source_program


def gemm(body: str, decls: str = "", n: str = "N") -> str:
    """A one-gemm program text: x[M, K] @ w[K, n], then the declarations and the body."""
    lines = [f"gemm g(x: bf16[M, K] @ w: bf16[K, {n}]) {{"]
    lines += ["  " + line for line in (decls + "\n" + body).strip().splitlines()]
    return "\n".join(lines + ["}", ""])


def operands(m: int, n: int, k: int = K, seed: int | None = None):
    """GEMM operands: zeros (acc == +0.0 exactly), or seeded random bf16 values."""
    if seed is None:
        return {"x": torch.zeros(m, k, dtype=torch.bfloat16), "w": torch.zeros(k, n, dtype=torch.bfloat16)}
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(m, k, generator=g).to(torch.bfloat16),
            "w": torch.randn(k, n, generator=g).to(torch.bfloat16)}


def run(text: str, exact: bool = True, n: int = N, m: int = M, seed: int | None = None, **inputs):
    feeds = operands(m, n, seed=seed)
    feeds.update(inputs)
    return reference.run(source_program(text), feeds, exact=exact)


def f32(x: float) -> float:
    """x rounded to the nearest float32 (Python's struct, independent of torch and epic)."""
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:                      # beyond the largest float32
        return math.copysign(INF, x)


def tile(value: float, m: int = M, n: int = N) -> torch.Tensor:
    assert math.isnan(value) or f32(value) == value, f"{value!r} is not a float32 value"
    return torch.full((m, n), value, dtype=torch.float32)


def fmt(x: float) -> str:
    if x != 0 and math.isfinite(x):
        e = math.log2(abs(x))
        if e == int(e) and abs(e) >= 8:
            return f"{'-' if x < 0 else ''}2**{int(e)}"
    return repr(x)


def same(got: float, want: float, rel: float = 1e-12, signed_zero: bool = True) -> bool:
    """IEEE-aware equality: nan matches nan, infinities and (optionally) the sign of zero match."""
    if math.isnan(want):
        return math.isnan(got)
    if math.isinf(want) or want == 0:
        if got != want:
            return False
        return not (signed_zero and want == 0) or math.copysign(1, got) == math.copysign(1, want)
    return math.isclose(got, want, rel_tol=rel, abs_tol=0.0)


def assert_all(y: torch.Tensor, want: float, **kw) -> None:
    bad = [float(g) for g in y.reshape(-1).tolist() if not same(g, want, **kw)]
    assert not bad, f"want {want!r}, got {sorted(set(map(repr, bad)))[:4]}"


def close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-12) -> None:
    want = want.to(D64)
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "nan positions differ"
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf]), "infinities differ"
    ok = ~torch.isnan(want) & ~inf
    err = (got[ok] - want[ok]).abs().max().item() if ok.any() else 0.0
    assert err <= rel * (want[ok].abs().max().item() if ok.any() else 0.0), (err, got, want)


def rand(m: int, n: int, seed: int, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, n, generator=g) * scale + offset).to(torch.float32)


# ---------------------------------------------------------------------------------------- unary
def pown(x: float, p: int) -> float:
    """x ** p for an integer p with IEEE pown rules, written out by hand for the special cases."""
    if p == 0:
        return 1.0                                            # pown(x, 0) == 1 for every x, even nan
    if math.isnan(x):
        return NAN
    odd = p % 2 == 1
    if x == 0:
        if p < 0:
            return math.copysign(INF, x) if odd else INF     # 1/(+-0)^p
        return x if odd else 0.0
    if math.isinf(x):
        if p > 0:
            return x if odd else INF
        return math.copysign(0.0, x) if odd else 0.0
    return x ** p


# name -> (expression, math function for ordinary points, ordinary points, hand-written edges)
UNARY = {
    "neg": ("-v", lambda x: -x, [1.5, -2.5, 1e30],
            [(0.0, -0.0), (-0.0, 0.0), (INF, -INF), (-INF, INF), (NAN, NAN)]),
    "abs": ("abs(v)", abs, [-2.5, 3.0, -1e-30],
            [(0.0, 0.0), (-0.0, 0.0), (-INF, INF), (INF, INF), (NAN, NAN)]),
    "exp": ("exp(v)", math.exp, [-2.5, -1.0, 0.25, 1.0, 3.75, 80.0, 709.0],
            [(0.0, 1.0), (-0.0, 1.0), (710.0, INF), (1000.0, INF), (-1000.0, 0.0), (INF, INF), (-INF, 0.0),
             (NAN, NAN)]),
    "log": ("log(v)", math.log, [0.25, 0.5, 2.0, 10.0, 1e30, 1e-30],
            [(1.0, 0.0), (0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN)]),
    "log1p": ("log1p(v)", math.log1p, [1e-10, -0.5, 0.25, 3.0, 1e30],
              [(0.0, 0.0), (-0.0, -0.0), (-1.0, -INF), (-2.0, NAN), (INF, INF), (NAN, NAN)]),
    "expm1": ("expm1(v)", math.expm1, [1e-10, -1e-10, -0.5, 0.25, 3.0, 80.0],
              [(0.0, 0.0), (-0.0, -0.0), (-INF, -1.0), (-1000.0, -1.0), (1000.0, INF), (INF, INF), (NAN, NAN)]),
    "sigmoid": ("sigmoid(v)", lambda x: 1 / (1 + math.exp(-x)), [-30.0, -3.0, -0.5, 0.0, 0.25, 5.0, 30.0],
                [(-1000.0, 0.0), (1000.0, 1.0), (-INF, 0.0), (INF, 1.0), (NAN, NAN)]),
    "sqrt": ("sqrt(v)", math.sqrt, [0.25, 2.0, 9.0, 1e-30, 1e30],
             [(0.0, 0.0), (-0.0, -0.0), (-1.0, NAN), (INF, INF), (-INF, NAN), (NAN, NAN)]),
    "rsqrt": ("rsqrt(v)", lambda x: 1 / math.sqrt(x), [0.25, 2.0, 4.0, 1e-30, 1e30],
              [(0.0, INF), (-0.0, -INF), (-1.0, NAN), (INF, 0.0), (NAN, NAN)]),
    "tanh": ("tanh(v)", math.tanh, [-3.0, -0.5, 0.25, 1.0, 5.0],
             [(0.0, 0.0), (-0.0, -0.0), (20.0, 1.0), (-20.0, -1.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN)]),
    "erf": ("erf(v)", math.erf, [-2.0, -0.5, 0.25, 1.0, 3.0],
            [(0.0, 0.0), (-0.0, -0.0), (INF, 1.0), (-INF, -1.0), (NAN, NAN)]),
    "sin": ("sin(v)", math.sin, [-2.0, -0.5, 0.25, 1.0, 3.0, 100.0, f32(math.pi)],
            [(0.0, 0.0), (-0.0, -0.0), (INF, NAN), (-INF, NAN), (NAN, NAN)]),
    "cos": ("cos(v)", math.cos, [-2.0, -0.5, 0.25, 1.0, 3.0, 100.0, f32(math.pi / 2)],
            [(0.0, 1.0), (-0.0, 1.0), (INF, NAN), (-INF, NAN), (NAN, NAN)]),
    # round: to nearest integer, ties to even (IEEE roundToIntegralTiesToEven), sign of zero kept
    "round": ("round(v)", None, [],
              [(0.5, 0.0), (1.5, 2.0), (2.5, 2.0), (3.5, 4.0), (-0.5, -0.0), (-1.5, -2.0), (-2.5, -2.0),
               (-0.25, -0.0), (0.49999997, 0.0), (3.7, 4.0), (-3.7, -4.0), (4194304.5, 4194304.0),
               (1e10, 1e10), (0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN)]),
    "exp2": ("exp2(v)", lambda x: 2.0 ** x, [-2.5, -1.0, 0.5, 3.0, 10.0, 100.0],
             [(0.0, 1.0), (-0.0, 1.0), (1.0, 2.0), (-1.0, 0.5), (-127.0, 2.0**-127), (127.0, 2.0**127),
              (1024.0, INF), (-1100.0, 0.0), (INF, INF), (-INF, 0.0), (NAN, NAN)]),
    "log2": ("log2(v)", math.log2, [0.25, 3.0, 10.0, 1e30, 1e-30],
             [(1.0, 0.0), (2.0**-127, -127.0), (2.0**100, 100.0), (0.0, -INF), (-0.0, -INF), (-1.0, NAN),
              (INF, INF), (-INF, NAN), (NAN, NAN)]),
    # ceil/floor: IEEE roundToIntegralTowardPositive/Negative (ceilf/floorf), sign of zero kept
    "ceil": ("ceil(v)", None, [],
             [(0.5, 1.0), (-0.5, -0.0), (1.0, 1.0), (1.0000001, 2.0), (-1.5, -1.0), (2.5, 3.0), (4194304.5, 4194305.0),
              (1e10, 1e10), (0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN)]),
    "floor": ("floor(v)", None, [],
              [(0.5, 0.0), (-0.5, -1.0), (1.9999999, 1.0), (-1.5, -2.0), (2.5, 2.0), (-4194304.5, -4194305.0),
               (1e10, 1e10), (0.0, 0.0), (-0.0, -0.0), (INF, INF), (-INF, -INF), (NAN, NAN)]),
    # sign: -1, 0 or +1; zero keeps its sign, nan stays nan
    "sign": ("sign(v)", None, [],
             [(3.5, 1.0), (-2.0, -1.0), (1e-30, 1.0), (-1e-30, -1.0), (0.0, 0.0), (-0.0, -0.0), (INF, 1.0),
              (-INF, -1.0), (NAN, NAN)]),
}
POWERS = (-3, -1, 0, 1, 2, 3, 5)
KNOWN_BUGS: dict = {}


def _unary_cases():
    for name, (expr, fn, points, edges) in UNARY.items():
        marks = unless_primitive(name) or KNOWN_BUGS.get(name, [])
        for x in points:
            x = f32(x)
            yield pytest.param(expr, x, fn(x), marks=marks, id=f"{name}({fmt(x)})")
        for x, want in edges:
            yield pytest.param(expr, f32(x), want, marks=marks, id=f"{name}({fmt(x)})")
    for p in POWERS:
        for x in (1.5, -2.0, 0.75, -0.5, 3.0, 0.0, -0.0, INF, -INF, NAN):
            yield pytest.param(f"v ** {p}", x, pown(x, p), id=f"pow({fmt(x)}**{p})")


@pytest.mark.parametrize("expr, x, want", list(_unary_cases()))
def test_unary(expr, x, want):
    text = gemm(f"out y: f32 = {expr}", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, u=tile(0.0), v=tile(x))["y"]
    assert_all(y, want)


# ---------------------------------------------------------------------------------------- binary
def _ieee(fn):
    def call(a, b):
        try:
            return fn(a, b)
        except (ZeroDivisionError, OverflowError):   # Python raises where IEEE gives a value: see edges
            raise AssertionError("write this case by hand")
    return call


# name -> (expression, Python float operation for ordinary points, hand-written edges)
BINARY = {
    "add": ("u + v", operator.add,
            [(-0.0, -0.0, -0.0), (-0.0, 0.0, 0.0), (0.0, -0.0, 0.0), (INF, -INF, NAN), (INF, 1.0, INF),
             (-INF, -INF, -INF), (NAN, 1.0, NAN), (1.0, NAN, NAN), (f32(3e38), f32(3e38), 2 * f32(3e38))]),
    "sub": ("u - v", operator.sub,
            [(0.0, 0.0, 0.0), (-0.0, 0.0, -0.0), (0.0, -0.0, 0.0), (-0.0, -0.0, 0.0), (1.5, 1.5, 0.0),
             (INF, INF, NAN), (-INF, INF, -INF), (1.0, INF, -INF), (NAN, 1.0, NAN)]),
    "mul": ("u * v", operator.mul,
            [(-0.0, 5.0, -0.0), (-0.0, -0.0, 0.0), (0.0, -3.0, -0.0), (0.0, INF, NAN), (-2.0, INF, -INF),
             (-INF, -INF, INF), (NAN, 0.0, NAN), (f32(1e30), f32(1e30), f32(1e30) ** 2)]),
    "div": ("u / v", operator.truediv,
            [(1.0, 0.0, INF), (1.0, -0.0, -INF), (-1.0, 0.0, -INF), (-1.0, -0.0, INF), (0.0, 0.0, NAN),
             (INF, INF, NAN), (5.0, INF, 0.0), (-5.0, INF, -0.0), (5.0, -INF, -0.0), (0.0, -3.0, -0.0),
             (INF, 0.0, INF), (INF, -2.0, -INF), (NAN, 1.0, NAN), (1.0, NAN, NAN)]),
    # min/max with a NaN operand: the other operand (IEEE minNum/maxNum, as fminf/fmaxf in kernels).
    # The sign of min(-0.0, 0.0) is left unspecified.
    "min": ("min(u, v)", min,
            [(-INF, 0.0, -INF), (INF, 5.0, 5.0), (-INF, INF, -INF), (NAN, 1.0, 1.0), (1.0, NAN, 1.0),
             (NAN, NAN, NAN)]),
    "max": ("max(u, v)", max,
            [(-INF, 0.0, 0.0), (INF, 5.0, INF), (-INF, INF, INF), (NAN, 1.0, 1.0), (1.0, NAN, 1.0),
             (NAN, NAN, NAN)]),
}
BINARY_POINTS = [(1.5, -2.25), (-3.0, 0.5), (1e30, 7.0), (0.1, 0.2), (-4.0, -4.0), (2.0, 3.0), (-7.5, 1e-20),
                 (5.0, 3.0), (7.0, 10.0)]   # the last two: u / v != u * (1 / v)


def _binary_cases():
    for name, (expr, fn, edges) in BINARY.items():
        for a, b in BINARY_POINTS:
            a, b = f32(a), f32(b)
            yield pytest.param(expr, a, b, _ieee(fn)(a, b), id=f"{name}({fmt(a)},{fmt(b)})")
        for a, b, want in edges:
            yield pytest.param(expr, a, b, want, id=f"{name}({fmt(a)},{fmt(b)})")


@pytest.mark.parametrize("expr, a, b, want", list(_binary_cases()))
def test_binary(expr, a, b, want):
    text = gemm(f"out y: f32 = {expr}", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, u=tile(a), v=tile(b))["y"]
    assert_all(y, want, rel=0.0)     # IEEE float64 + - * / are correctly rounded: exactly Python's result


# ---------------------------------------------------------------------------------------- comparisons
COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge}
COMPARE_POINTS = [(1.0, 2.0), (2.0, 1.0), (2.0, 2.0), (-0.0, 0.0), (NAN, NAN), (NAN, 1.0), (1.0, NAN),
                  (INF, INF), (-INF, INF), (-1e-30, 0.0)]


@pytest.mark.parametrize("op, a, b", [pytest.param(op, a, b, id=f"({fmt(a)}{op}{fmt(b)})")
                                      for op in COMPARE for a, b in COMPARE_POINTS])
def test_compare(op, a, b):
    text = gemm(f"out y: f32 = select(u {op} v, 1, 0)", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, u=tile(f32(a)), v=tile(f32(b)))["y"]
    assert_all(y, 1.0 if COMPARE[op](f32(a), f32(b)) else 0.0)   # Python float comparisons are IEEE


# ---------------------------------------------------------------------------------------- select
@pytest.mark.parametrize("expr, a, b, want", [
    pytest.param("select(u > 0, u, v)", 2.0, 5.0, 2.0, id="true-picks-first"),
    pytest.param("select(u > 0, u, v)", -2.0, 5.0, 5.0, id="false-picks-second"),
    pytest.param("select(u > 0, u, v)", 1.0, NAN, 1.0, id="unpicked-nan-does-not-leak"),
    pytest.param("select(u > 0, u, v)", -1.0, NAN, NAN, id="picked-nan"),
    pytest.param("select(u > 0, v, u)", NAN, 3.0, NAN, id="nan-condition-is-false"),
    pytest.param("select(u == 0, u, v)", -0.0, 1.0, -0.0, id="keeps-signed-zero"),
    pytest.param("select(u < v, -0.0, 1)", 1.0, 2.0, -0.0, id="constant-negative-zero-branch"),
    pytest.param("select(u >= v, 2.5, 7)", 1.0, 2.0, 7.0, id="integer-literal-branch"),
])
def test_select(expr, a, b, want):
    text = gemm(f"out y: f32 = {expr}", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, u=tile(a), v=tile(b))["y"]
    assert_all(y, want)


def test_select_broadcasts_tile_row_and_column_operands():
    text = gemm("out y: f32 = select(v > 0, b, s)\nout z: f32 = select(s > 0, v, b)",
                "in v: f32[M, N]\nin b: f32[N]\nin s: f32[M]")
    v, b, s = rand(M, N, 1), rand(1, N, 2).reshape(N), rand(M, 1, 3).reshape(M)
    out = run(text, v=v, b=b, s=s)
    v, b, s = v.double(), b.double(), s.double()
    close(out["y"], torch.where(v > 0, b[None, :].expand(M, N), s[:, None].expand(M, N)))
    close(out["z"], torch.where(s[:, None] > 0, v, b[None, :].expand(M, N)))


# ---------------------------------------------------------------------------------------- casts, stores
# dtype -> [(u, v, value rounded to the dtype)]: the input is u + v (exact in float64). Rounded values
# are written by hand from the formats: bf16 8 significant bits, f16 11 (subnormal step 2**-24, max
# 65504, overflow -> inf), e4m3 4 bits (max 448, subnormal step 2**-9), e5m2 3 bits (max 57344,
# subnormal step 2**-16); fp8 and integers saturate (docs/LANGUAGE.md), integers round half to even.
Z = -0.0   # u + (-0.0) == u for every u, -0.0 included
CAST_POINTS = {
    "f32": [(1.0, 2.0**-30, 1.0), (1.0, 2.0**-24, 1.0), (1.0, 3 * 2.0**-24, 1.0 + 2.0**-22),
            (1.0, 2.0**-24 + 2.0**-40, 1.0 + 2.0**-23), (f32(3e38), f32(3e38), INF), (f32(-3e38), f32(-3e38), -INF),
            (0.5, Z, 0.5), (-0.0, Z, -0.0), (INF, Z, INF), (NAN, Z, NAN)],
    "bf16": [(1.0, 2.0**-8, 1.0), (1.0, 3 * 2.0**-8, 1.0 + 2.0**-6), (1.0 + 2.0**-8, 2.0**-20, 1.0 + 2.0**-7),
             (1.0 + 2.0**-8, 2.0**-40, 1.0 + 2.0**-7),
             (-1.0, -(2.0**-8), -1.0), (3.3895313892515355e38, Z, 3.3895313892515355e38),
             (f32(3.4e38), Z, INF), (2.0**-134, Z, 0.0), (3 * 2.0**-135, Z, 2.0**-133),
             (-0.0, Z, -0.0), (-INF, Z, -INF), (NAN, Z, NAN)],
    "f16": [(65504.0, Z, 65504.0), (65519.0, Z, 65504.0), (65520.0, Z, INF), (1e5, Z, INF), (-1e5, Z, -INF),
            (1.0, 2.0**-11, 1.0), (1.0, 3 * 2.0**-11, 1.0 + 2.0**-9), (1.0 + 2.0**-11, 2.0**-40, 1.0 + 2.0**-10),
            (2.0**-25, Z, 0.0),
            (3 * 2.0**-26, Z, 2.0**-24), (2.0**-24, Z, 2.0**-24), (-0.0, Z, -0.0), (NAN, Z, NAN)],
    "e4m3": [(1000.0, Z, 448.0), (-1000.0, Z, -448.0), (448.0, Z, 448.0), (470.0, Z, 448.0),
             (INF, Z, 448.0), (-INF, Z, -448.0), (17.0, Z, 16.0), (19.0, Z, 20.0), (17.0, 2.0**-30, 18.0),
             (250.0, Z, 256.0),
             (f32(0.1), Z, 0.1015625), (2.0**-10, Z, 0.0), (3 * 2.0**-11, Z, 2.0**-9), (-0.0, Z, -0.0),
             (NAN, Z, NAN)],
    "e5m2": [(57344.0, Z, 57344.0), (1e5, Z, 57344.0), (-1e6, Z, -57344.0), (61440.0, Z, 57344.0),
             (INF, Z, 57344.0), (1.125, Z, 1.0), (1.375, Z, 1.5), (1.125, 2.0**-40, 1.25), (2.0**-17, Z, 0.0),
             (3 * 2.0**-18, Z, 2.0**-16), (-0.0, Z, -0.0), (NAN, Z, NAN)],
    "i32": [(2.5, Z, 2.0), (3.5, Z, 4.0), (-2.5, Z, -2.0), (-3.5, Z, -4.0), (0.5, Z, 0.0), (-0.5, Z, 0.0),
            (1.0, -(2.0**-24), 1.0), (1e9, 0.5, 1e9), (1e9, 1.5, 1e9 + 2), (3e9, Z, 2147483647.0),
            (-3e9, Z, -2147483648.0), (INF, Z, 2147483647.0), (-INF, Z, -2147483648.0), (NAN, Z, None)],
    "i8": [(300.0, Z, 127.0), (-300.0, Z, -128.0), (2.5, Z, 2.0), (3.5, Z, 4.0), (-2.5, Z, -2.0),
           (1.5, Z, 2.0), (0.5, Z, 0.0), (127.5, Z, 127.0), (126.5, Z, 126.0), (-128.5, Z, -128.0),
           (-127.5, Z, -128.0), (INF, Z, 127.0), (-INF, Z, -128.0), (NAN, Z, None)],
    "i4": [(7.5, Z, 7.0), (6.5, Z, 6.0), (-8.5, Z, -8.0), (-7.5, Z, -8.0), (100.0, Z, 7.0), (-100.0, Z, -8.0),
           (2.5, Z, 2.0), (1.5, Z, 2.0), (-0.5, Z, 0.0), (NAN, Z, None)],
    # e8m0: |x| rounded up to a power of two, saturating to [2**-127, 2**127]; NaN stays NaN (as
    # __nv_fp8_e8m0 / cvt.rp.satfinite); rounded in both modes (it holds powers of two only)
    "e8m0": [(1.0, Z, 1.0), (1.5, Z, 2.0), (3.0, Z, 4.0), (4.0, Z, 4.0), (0.75, Z, 1.0), (0.5, Z, 0.5),
             (f32(1.0000001), Z, 2.0), (-3.0, Z, 4.0), (0.0, Z, 2.0**-127), (-0.0, Z, 2.0**-127), (2.0**-130, Z, 2.0**-127),
             (3 * 2.0**-128, Z, 2.0**-126), (2.0**127, Z, 2.0**127), (f32(3e38), Z, 2.0**127), (INF, Z, 2.0**127),
             (-INF, Z, 2.0**127), (NAN, Z, NAN)],
    # e2m1: 0 0.5 1 1.5 2 3 4 6, nearest with ties to the even code, saturating to +-6; NaN becomes +6
    # (as __nv_cvt_float_to_fp4); exact mode only saturates
    "e2m1": [(0.25, Z, 0.0), (f32(0.3), Z, 0.5), (0.75, Z, 1.0), (1.25, Z, 1.0), (1.25, 2.0**-20, 1.5), (1.75, Z, 2.0),
             (2.5, Z, 2.0), (2.75, Z, 3.0), (3.5, Z, 4.0), (5.0, Z, 4.0), (5.5, Z, 6.0), (7.0, Z, 6.0), (f32(1e30), Z, 6.0),
             (-2.5, Z, -2.0), (f32(-0.1), Z, -0.0), (-0.0, Z, -0.0), (INF, Z, 6.0), (-INF, Z, -6.0), (NAN, Z, 6.0)],
}
RANGE = {"e4m3": 448.0, "e5m2": 57344.0, "i32": (-(2**31), 2**31 - 1), "i8": (-128, 127), "i4": (-8, 7)}


def _exact_value(dt: str, x: float, rounded):
    """What exact=True gives per the docs: floats keep their value (fp8 saturates), integers round."""
    if dt in ("e4m3", "e5m2"):
        return x if math.isnan(x) else max(-RANGE[dt], min(RANGE[dt], x))
    if dt in ("f32", "bf16", "f16"):
        return x
    if dt == "e2m1":
        return 6.0 if math.isnan(x) else max(-6.0, min(6.0, x))
    return rounded


def _via_f32(dt: str, x: float) -> float:
    """x rounded to f32, then to dtype dt (saturating fp8): torch's conversions, applied directly."""
    t = torch.tensor(f32(x), dtype=torch.float32)
    if dt in RANGE:
        t = t.clamp(-RANGE[dt], RANGE[dt])
    torch_dt = {"bf16": torch.bfloat16, "f16": torch.float16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[dt]
    return float(t.to(torch_dt).to(torch.float64))


def _cast_cases(kind: str):
    for dt, points in CAST_POINTS.items():
        for u, v, rounded in points:
            assert math.isnan(u) or (f32(u) == u and f32(v) == v), (u, v)
            x = u + v
            label = fmt(u) if v == 0 else f"{fmt(u)}+{fmt(v)}"
            for exact in (True, False):
                want = _exact_value(dt, x, rounded) if exact else rounded
                marks = []
                if not exact and dt in ("bf16", "f16", "e4m3", "e5m2") and not math.isnan(x) and x != f32(x):
                    want = _via_f32(dt, x)     # rounded mode rounds through f32, as kernels do
                if want is None:     # NaN to an integer type: 0
                    want = 0.0
                mode = "exact" if exact else "rounded"
                yield pytest.param(dt, u, v, want, exact, marks=marks, id=f"{kind}-{mode}-{dt}({label})")


def _check_dtype_value(y: torch.Tensor, dt: str, want) -> None:
    if want is None:
        lo, hi = RANGE[dt]
        vals = y.reshape(-1).tolist()
        assert all(lo <= t <= hi and t == math.floor(t) for t in vals), f"not an {dt} value: {vals[:3]}"
        return
    # integers have no signed zero; float results keep the sign of zero
    assert_all(y, want, rel=0.0, signed_zero=dt not in RANGE or dt in ("e4m3", "e5m2"))


@pytest.mark.parametrize("dt, u, v, want, exact", list(_cast_cases("cast")))
def test_cast(dt, u, v, want, exact):
    # integer casts are stored as i32 (integers in range pass an i32 store unchanged; an f32 store
    # would round 2**31 - 1 in rounded mode); float casts as f32 (every value of those types is one)
    store = "i32" if dt.startswith("i") else "f32"
    text = gemm(f"out y: {store} = {dt}(u + v)", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, exact=exact, u=tile(u), v=tile(v))["y"]
    _check_dtype_value(y, dt, want)


def unpack_i4(packed: torch.Tensor) -> torch.Tensor:
    """A packed i4 tensor (two's complement nibbles, two per byte, low nibble = even column: docs/LANGUAGE.md)
    as its values."""
    p = packed.to(torch.int64)
    lo, hi = p & 0xF, p >> 4 & 0xF
    vals = torch.stack((lo, hi), dim=-1).flatten(-2)
    return torch.where(vals >= 8, vals - 16, vals).to(D64)


@pytest.mark.parametrize("dt, u, v, want, exact", list(_cast_cases("store")))
def test_store(dt, u, v, want, exact):
    text = gemm(f"out y: {dt} = u + v", "in u: f32[M, N]\nin v: f32[M, N]")
    y = run(text, exact=exact, u=tile(u), v=tile(v))["y"]
    if dt == "i4" and y.dtype == torch.uint8:      # the reference may return the packed form
        y = unpack_i4(y)
    assert y.shape == (M, N)
    _check_dtype_value(y, dt, want)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "rounded"])
def test_cast_keeps_shape_kind_and_feeds_arithmetic(exact):
    # a cast of a row vector broadcasts like the vector; its rounded value is what arithmetic sees
    text = gemm("out y: f32 = v + i8(b) * 1000 + bf16(s)", "in v: f32[M, N]\nin b: f32[N]\nin s: f32[M]")
    v = rand(M, N, 4)
    b = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 200.0, -200.0, 0.0])
    s = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -3.0])
    out = run(text, exact=exact, v=v, b=b, s=s)["y"]
    ib = torch.tensor([0.0, 2.0, 2.0, 0.0, -2.0, 127.0, -128.0, 0.0], dtype=D64)
    bs = torch.tensor([1.0, 1.0 + 2.0**-6, -3.0], dtype=D64) if not exact else s.double()
    want = v.double() + ib[None, :] * 1000 + bs[:, None]
    if not exact:                      # the f32 store rounds too
        want = want.to(torch.float32).to(D64)
    close(out, want, rel=0.0)


# ---------------------------------------------------------------------------------------- pairwise maps
def test_even_odd_interleave():
    text = gemm("out e: f32 = even(v)\nout o: f32 = odd(v)\nout i: f32 = interleave(u, v)\n"
                "out sw: f32 = interleave(odd(v), even(v))\nout rt: f32 = interleave(even(v), odd(v))",
                "in u: f32[M, N]\nin v: f32[M, N]")
    u, v = rand(M, N, 5), rand(M, N, 6)
    out = run(text, u=u, v=v)
    u, v = u.double(), v.double()
    close(out["e"], v[:, 0::2], rel=0.0)
    close(out["o"], v[:, 1::2], rel=0.0)
    close(out["i"], torch.stack((u, v), dim=-1).flatten(1), rel=0.0)
    want_sw = torch.empty(M, N, dtype=D64)
    want_sw[:, 0::2], want_sw[:, 1::2] = v[:, 1::2], v[:, 0::2]
    close(out["sw"], want_sw, rel=0.0)
    close(out["rt"], v, rel=0.0)


def test_pairwise_maps_of_vectors():
    # even/odd of a row vector pick its columns; of a column vector (constant along the row) it is the
    # vector itself; interleave broadcasts a column vector down to every pair
    text = gemm("out e: f32[N/2] = even(b)\nout o: f32[N/2] = odd(b)\nout c: f32 = v + even(s)\n"
                "out i: f32 = interleave(even(v), s)",
                "in v: f32[M, N]\nin b: f32[N]\nin s: f32[M]")
    v, b, s = rand(M, N, 7), rand(1, N, 8).reshape(N), rand(M, 1, 9).reshape(M)
    out = run(text, v=v, b=b, s=s)
    v, b, s = v.double(), b.double(), s.double()
    close(out["e"], b[0::2], rel=0.0)
    close(out["o"], b[1::2], rel=0.0)
    close(out["c"], v + s[:, None], rel=0.0)
    close(out["i"], torch.stack((v[:, 0::2], s[:, None].expand(M, N // 2)), dim=-1).flatten(1), rel=0.0)


def test_pairwise_map_of_odd_width_is_a_diagnostic():
    text = gemm("out y: f32 = even(v)", "in v: f32[M, N]")
    with pytest.raises(EpicError) as info:
        run(text, n=5, v=rand(M, 5, 0))
    assert info.value.codes == ["E401"]


# ---------------------------------------------------------------------------------------- reductions
def _data(kind: str, m: int, n: int, seed: int) -> torch.Tensor:
    if kind == "normal":
        return rand(m, n, seed)
    if kind == "negative":        # every row and column all negative: max must not be 0
        return -(rand(m, n, seed).abs() + 1.0)
    if kind == "large":           # exp overflows without the max shift; sums lose nothing at this scale
        return rand(m, n, seed, scale=30.0, offset=1000.0)
    if kind == "large-negative":
        return rand(m, n, seed, scale=30.0, offset=-1000.0)
    raise AssertionError(kind)


REDUCE_TORCH = {"sum": lambda x, d: x.sum(d), "max": lambda x, d: x.amax(d), "min": lambda x, d: x.amin(d),
                "mean": lambda x, d: x.mean(d), "lse": lambda x, d: torch.logsumexp(x, d),
                "amax": lambda x, d: x.abs().amax(d)}


@pytest.mark.parametrize("m, n", [(3, 8), (5, 13)], ids=["3x8", "5x13"])
@pytest.mark.parametrize("data", ["normal", "negative", "large", "large-negative"])
@pytest.mark.parametrize("fn", [pytest.param(f, marks=unless_primitive(f, 1)) for f in REDUCE_TORCH])
@pytest.mark.parametrize("axis", ["row", "col"])
def test_reduce(axis, fn, data, m, n):
    out_dims = "f32[M]" if axis == "row" else "f32[N]"
    text = gemm(f"out r: {out_dims} = {axis}_{fn}(v)", "in v: f32[M, N]")
    v = _data(data, m, n, seed=m * 100 + n)
    got = run(text, m=m, n=n, v=v)["r"]
    want = REDUCE_TORCH[fn](v.double(), 1 if axis == "row" else 0)
    assert torch.isfinite(got).all()
    close(got, want, rel=1e-13)


@pytest.mark.parametrize("c", [0.0, 1000.0, -1000.0, 80.0])
def test_lse_of_equal_values_is_value_plus_log_count(c):
    text = gemm("out r: f32[M] = row_lse(v)\nout k: f32[N] = col_lse(v)", "in v: f32[M, N]")
    out = run(text, v=tile(c))
    assert_all(out["r"], c + math.log(N), rel=1e-14)
    assert_all(out["k"], c + math.log(M), rel=1e-14)


def test_reductions_by_hand():
    # v[i, j] = 10 i + j - 3: row sums 10 i * 8 + 28 - 24, column sums 30 + 3 j - 9
    text = gemm("out rs: f32[M] = row_sum(v)\nout rm: f32[M] = row_mean(v)\nout rx: f32[M] = row_max(v)\n"
                "out rn: f32[M] = row_min(v)\nout cs: f32[N] = col_sum(v)\nout cm: f32[N] = col_mean(v)\n"
                "out cx: f32[N] = col_max(v)\nout cn: f32[N] = col_min(v)\n"
                "out rl: f32[M] = row_lse(w0)\nout cl: f32[N] = col_lse(w0)",
                "in v: f32[M, N]\nin w0: f32[M, N]")
    v = torch.tensor([[10.0 * i + j - 3 for j in range(N)] for i in range(M)])
    w0 = torch.full((M, N), -INF)
    w0[:, 0] = 2.0                                   # masked logits: one finite entry per row
    out = run(text, v=v, w0=w0)
    assert out["rs"].tolist() == [4.0, 84.0, 164.0]
    assert out["rm"].tolist() == [0.5, 10.5, 20.5]
    assert out["rx"].tolist() == [4.0, 14.0, 24.0]
    assert out["rn"].tolist() == [-3.0, 7.0, 17.0]
    assert out["cs"].tolist() == [21.0 + 3 * j for j in range(N)]
    assert out["cm"].tolist() == [7.0 + j for j in range(N)]
    assert out["cx"].tolist() == [17.0 + j for j in range(N)]
    assert out["cn"].tolist() == [-3.0 + j for j in range(N)]
    assert out["rl"].tolist() == [2.0, 2.0, 2.0]
    assert_all(out["cl"][:1], 2.0 + math.log(M), rel=1e-14)
    assert out["cl"][1:].tolist() == [-INF] * (N - 1)


def test_reduction_vector_math_and_broadcast():
    # vector math after a reduction (runs in a combine kernel) and reductions of broadcast operands
    text = gemm("out r: f32[M] = row_max(v) - row_min(v) + row_sum(v * b) / N\n"
                "out c: f32[N] = col_sum(v * s) + col_mean(v) * M",
                "in v: f32[M, N]\nin b: f32[N]\nin s: f32[M]")
    v, b, s = rand(M, N, 10), rand(1, N, 11).reshape(N), rand(M, 1, 12).reshape(M)
    out = run(text, v=v, b=b, s=s)
    v, b, s = v.double(), b.double(), s.double()
    close(out["r"], v.amax(1) - v.amin(1) + (v * b).sum(1) / N)
    close(out["c"], (v * s[:, None]).sum(0) + v.mean(0) * M)


# ---------------------------------------------------------------------------------------- block reductions
BLOCK_TORCH = {"sum": lambda x: x.sum(1), "max": lambda x: x.amax(1), "min": lambda x: x.amin(1),
               "amax": lambda x: x.abs().amax(1)}


@pytest.mark.parametrize("n, block", [(8, 8), (16, 8), (12, 8), (12, 16), (40, 32)],
                         ids=["N8-B8", "N16-B8", "N12-B8-ragged", "N12-B16-ragged", "N40-B32-ragged"])
@pytest.mark.parametrize("fn", [pytest.param(f, marks=unless_primitive(f, 2)) for f in BLOCK_TORCH])
def test_block_reduce(fn, n, block):
    text = gemm(f"out s: f32 = block_{fn}(v, {block})\nout y: f32 = v - block_{fn}(v, {block})",
                "in v: f32[M, N]")
    # data that a wrong fill of a ragged block would change: all negative for max (a 0 fill wins), all
    # positive for min, tiny for amax (any fill above the identity 0 wins)
    v = rand(M, n, seed=n + block)
    v = {"max": -(v.abs() + 1), "min": v.abs() + 1, "amax": v * 1e-3}.get(fn, v)
    out = run(text, n=n, v=v)
    vd = v.double()
    blocks = [BLOCK_TORCH[fn](vd[:, j:j + block]) for j in range(0, n, block)]   # slicing keeps ragged ones
    want = torch.stack(blocks, dim=1)
    close(out["s"], want, rel=1e-14)
    spread = torch.cat([b[:, None].expand(M, min(block, n - j)) for b, j in zip(blocks, range(0, n, block))], 1)
    close(out["y"], vd - spread, rel=1e-14)


# ---------------------------------------------------------------------------------------- sources
def test_acc_is_the_float64_product_of_the_operands():
    text = gemm("out y: f32 = acc\nout e: f32 = exp(acc / 8) - acc ** 2", "")
    feeds = operands(M, N, seed=13)
    out = reference.run(source_program(text), feeds)
    a = feeds["x"].double() @ feeds["w"].double()
    close(out["y"], a, rel=0.0)
    close(out["e"], torch.exp(a / 8) - a * a)


def test_loads_of_every_kind_broadcast():
    # bf16 tile, f32 row vector (per column), f32 column vector (per row), scalar literal
    text = gemm("out y: f32 = z + b * 10 + s * 100 + 0.5", "in z: bf16[M, N]\nin b: f32[N]\nin s: f32[M]")
    z = rand(M, N, 14).to(torch.bfloat16)
    b, s = rand(1, N, 15).reshape(N), rand(M, 1, 16).reshape(M)
    out = run(text, z=z, b=b, s=s)["y"]
    close(out, z.double() + b.double()[None, :] * 10 + s.double()[:, None] * 100 + 0.5, rel=0.0)


def test_coordinates_row_and_col():
    text = gemm("out r: f32 = acc * 0 + row\nout c: f32 = acc * 0 + col\nout rc: f32 = row * 100 + col\n"
                "out h: f32 = even(v) * 0 + even(col)", "in v: f32[M, N]")
    out = run(text, m=5, n=12, v=rand(5, 12, 0))
    i = torch.arange(5, dtype=D64)[:, None].expand(5, 12)
    j = torch.arange(12, dtype=D64)[None, :].expand(5, 12)
    close(out["r"], i, rel=0.0)
    close(out["c"], j, rel=0.0)
    close(out["rc"], i * 100 + j, rel=0.0)
    close(out["h"], j[:, 0::2], rel=0.0)       # even(col): the index of each pair's even column


def test_dimension_names_are_values():
    text = gemm("out y: f32 = acc * 0 + N\nout a: f32 = acc * 0 + N * 1000 + M * 100 + K\n"
                "out d: f32 = acc / N + 1 / M", "")
    for m, k, n in ((3, 4, 8), (7, 16, 24)):
        feeds = operands(m, n, k=k, seed=m)
        out = reference.run(source_program(text), feeds)
        assert_all(out["y"], float(n), rel=0.0)
        assert_all(out["a"], float(n * 1000 + m * 100 + k), rel=0.0)
        close(out["d"], feeds["x"].double() @ feeds["w"].double() / n + 1 / m)


def test_runtime_scalars_default_and_override():
    text = gemm("out y: f32 = acc * 0 + alpha * 10 + beta + gamma",
                "in alpha: f32 = 2.5\nin beta: f32\nin gamma: f32 = -0.125")
    assert_all(run(text, beta=1.0)["y"], 26.0 - 0.125, rel=0.0)
    assert_all(run(text, alpha=-0.5, beta=1.0)["y"], -4.0 - 0.125, rel=0.0)
    assert_all(run(text, alpha=torch.tensor(3.0), beta=0.0, gamma=2.0)["y"], 32.0, rel=0.0)
    with pytest.raises(EpicError) as info:
        run(text)                                   # beta has no default
    assert info.value.codes == ["E601"]


# ---------------------------------------------------------------------------------------- prelude
def _dsilu(x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.silu(x).sum(), x)
    return g


# name -> (expression of v, torch reference of v (float64))
PRELUDE_ELEMENTWISE = {
    "relu": ("relu(v)", F.relu),
    "sigmoid": ("sigmoid(v)", torch.sigmoid),
    "silu": ("silu(v)", F.silu),
    "dsilu": ("dsilu(v)", _dsilu),
    "gelu": ("gelu(v)", lambda x: F.gelu(x, approximate="none")),
    "gelu_tanh": ("gelu_tanh(v)", lambda x: F.gelu(x, approximate="tanh")),
    "softplus": ("softplus(v)", lambda x: torch.logaddexp(x, torch.zeros_like(x))),
    "clamp": ("clamp(v, -0.5, 0.75)", lambda x: torch.clamp(x, -0.5, 0.75)),
    "square": ("square(v)", torch.square),
}


@pytest.mark.parametrize("scale", [1.0, 8.0], ids=["N(0,1)", "N(0,64)"])
@pytest.mark.parametrize("name", list(PRELUDE_ELEMENTWISE))
def test_prelude_elementwise(name, scale):
    expr, want = PRELUDE_ELEMENTWISE[name]
    text = gemm(f"out y: f32 = {expr}", "in v: f32[M, N]")
    v = rand(M, N, seed=17, scale=scale)
    close(run(text, v=v)["y"], want(v.double()), rel=1e-12)


@pytest.mark.parametrize("name, x, want", [
    ("relu", -3.0, 0.0), ("relu", 2.5, 2.5), ("relu", INF, INF),
    ("sigmoid", 0.0, 0.5), ("sigmoid", 1000.0, 1.0), ("sigmoid", -1000.0, 0.0), ("sigmoid", -INF, 0.0),
    ("silu", 0.0, 0.0), ("silu", -1000.0, -0.0), ("silu", 1000.0, 1000.0),
    ("dsilu", 0.0, 0.5), ("dsilu", 1000.0, 1.0),
    ("gelu", 0.0, 0.0), ("gelu", 10.0, 10.0), ("gelu", -10.0, -0.0),
    ("gelu_tanh", 0.0, 0.0), ("gelu_tanh", 10.0, 10.0),
    ("softplus", 0.0, math.log(2)), ("softplus", 1000.0, 1000.0), ("softplus", -1000.0, 0.0),
    ("softplus", 30.0, 30.0 + math.log1p(math.exp(-30.0))),
    ("square", -3.0, 9.0), ("square", -INF, INF),
], ids=lambda p: fmt(p) if isinstance(p, float) else p)
def test_prelude_by_hand(name, x, want):
    text = gemm(f"out y: f32 = {PRELUDE_ELEMENTWISE[name][0]}", "in v: f32[M, N]")
    assert_all(run(text, v=tile(x))["y"], want, rel=1e-15, signed_zero=False)


def test_prelude_row_statistics():
    text = gemm("out ss: f32[M] = row_sumsq(v)\nout am: f32[M] = row_amax(v)\nout rms: f32[M] = row_rms(v)\n"
                "out rms2: f32[M] = row_rms(v, eps=0.5)\nout pick: f32[M] = row_pick(v, label)\n"
                "out i8s: f32[M] = int8_row_scale(v)",
                "in v: f32[M, N]\nin label: i32[M]")
    v = rand(M, N, 18) * 3
    v[1] = 0.0                                     # an all-zero row: int8_row_scale floors at 1e-12
    label = torch.tensor([5, 0, 7], dtype=torch.int32)
    out = run(text, v=v, label=label)
    v = v.double()
    close(out["ss"], (v * v).sum(1))
    close(out["am"], v.abs().amax(1), rel=0.0)
    close(out["rms"], torch.sqrt((v * v).mean(1) + 1e-6))
    close(out["rms2"], torch.sqrt((v * v).mean(1) + 0.5))
    close(out["pick"], v.gather(1, label.long()[:, None])[:, 0], rel=0.0)
    close(out["i8s"], v.abs().amax(1).clamp_min(1e-12) / 127)
    assert out["i8s"][1].item() == pytest.approx(1e-12 / 127, rel=1e-12, abs=0)


@pytest.mark.parametrize("eps", [None, 0.25])
def test_prelude_rmsnorm(eps):
    # rmsnorm needs the whole row, so it feeds a later gemm (row-scale deferral makes that legal); the
    # later gemm multiplies by an identity matrix, which in exact mode returns the stored value exactly
    call = "rmsnorm(v, gamma)" if eps is None else f"rmsnorm(v, gamma, eps={eps})"
    text = (f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) {{\n  in v: f32[M, N]\n  in gamma: f32[N]\n"
            f"  tmp n: bf16 = {call}\n}}\n"
            "gemm ident(n @ eye: bf16[N, N]) {\n  out y: f32 = acc\n}\n")
    v, gamma = rand(M, N, 19) * 2, rand(1, N, 20).reshape(N)
    feeds = dict(operands(M, N), v=v, gamma=gamma, eye=torch.eye(N, dtype=torch.bfloat16))
    y = reference.run(source_program(text), feeds)["y"]
    close(y, F.rms_norm(v.double(), (N,), gamma.double(), eps=1e-6 if eps is None else eps))


def test_prelude_swiglu_and_backward():
    text = gemm("out y: f32 = swiglu(v)\nout dh: f32 = swiglu_bwd(dy, v)", "in v: f32[M, N]\nin dy: f32[M, N/2]")
    v, dy = rand(M, N, 21) * 2, rand(M, N // 2, 22)
    out = run(text, v=v, dy=dy)
    h = v.double().requires_grad_(True)
    y = F.silu(h[:, 0::2]) * h[:, 1::2]
    (dh,) = torch.autograd.grad(y, h, dy.double())
    close(out["y"], y.detach())
    close(out["dh"], dh)


def test_prelude_rotate_and_rope():
    text = gemm("out r: f32 = rotate(v, c, s)\nout q: f32 = rope(v, pos, freq)",
                "in v: f32[M, N]\nin c: f32[M, N]\nin s: f32[M, N]\nin pos: f32[M]\nin freq: f32[N]")
    v, c, s = rand(M, N, 23), rand(M, N, 24), rand(M, N, 25)
    pos = torch.tensor([0.0, 1.0, 17.0])
    freq = torch.tensor([1.0, 9.0, 0.1, 5.0, 0.0, 3.0, 0.01, 7.0])   # odd columns unused
    out = run(text, v=v, c=c, s=s, pos=pos, freq=freq)
    # a pair (a, b) as the complex number a + ib, rotated by multiplying with c + is (or e^(i theta))
    z = torch.complex(v.double()[:, 0::2], v.double()[:, 1::2])
    rot = z * torch.complex(c.double()[:, 0::2], s.double()[:, 0::2])
    close(out["r"], torch.view_as_real(rot).flatten(1))
    theta = pos.double()[:, None] * freq.double()[None, 0::2]
    rot = z * torch.polar(torch.ones_like(theta), theta)
    close(out["q"], torch.view_as_real(rot).flatten(1))


@pytest.mark.parametrize("helper, top", [("fp8_e4m3_scale", 448.0), ("fp8_e5m2_scale", 57344.0),
                                         ("int8_block_scale", 127.0), ("int4_group_scale", 7.0)])
def test_prelude_block_scales(helper, top):
    text = gemm(f"out s: f32 = {helper}(v, 8)\nout q: f32 = v / {helper}(v, 8)", "in v: f32[M, N]", n="N")
    n = 24
    v = rand(M, n, 26) * 5
    v[0, 8:16] = 0.0                              # an all-zero block: the scale floors at 1e-12
    out = run(text, n=n, v=v)
    vd = v.double().unflatten(1, (n // 8, 8))
    want = vd.abs().amax(-1).clamp_min(1e-12) / top
    close(out["s"], want)
    close(out["q"], (vd / want[..., None]).flatten(1))
    assert out["q"].abs().max().item() == pytest.approx(top, rel=1e-12, abs=0)
    assert out["s"][0, 1].item() == pytest.approx(1e-12 / top, rel=1e-12, abs=0)   # the zero block


# ---------------------------------------------------------------------------------------- completeness
# the primitives this file checks; a primitive added to epic fails test_every_primitive_has_a_case until it
# gets cases with independent expectations here
COVERED_OPS = (set(UNARY) | {"powi"} | set(BINARY) | {"eq", "ne", "lt", "le", "gt", "ge", "select", "cast"}
               | {"even", "odd", "interleave", "reduce", "block_reduce"}
               | {"acc", "load", "const", "dim", "row_index", "col_index"})


def test_every_primitive_has_a_case():
    names, fns, block_fns = registry()
    assert not names - COVERED_OPS, f"primitives without semantics cases here: {sorted(names - COVERED_OPS)}"
    assert not fns - set(REDUCE_TORCH), f"reductions without cases here: {sorted(fns - set(REDUCE_TORCH))}"
    assert not block_fns - set(BLOCK_TORCH), f"block reductions without cases: {sorted(block_fns - set(BLOCK_TORCH))}"


def _ops_used(program) -> set[str]:
    used = set()
    for k in program.kernels:
        for v in k.values:
            used.add(v.op)
            if v.op == "reduce":
                used.add(f"reduce:{v.attrs['fn']}")
            elif v.op == "block_reduce":
                used.add(f"block:{v.attrs['fn']}")
            elif v.op == "cast":
                used.add(f"cast:{v.attrs['to'].name}")
    return used


def _required() -> set[str]:
    """Every primitive op (read now, so a new primitive fails the test until a program uses it), every
    reduction function in a whole-row or whole-column reduction, every block function, a cast to every dtype."""
    names, fns, block_fns = registry()
    need = set(names) | {f"reduce:{fn}" for fn in fns} | {f"block:{fn}" for fn in block_fns}
    need |= {f"cast:{d.name}" for d in dtypes.ALL.values() if d.is_int or d.is_float}
    return need


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "rounded"])
@pytest.mark.parametrize("path", [
    pytest.param(PROGRAMS[0], id="every_primitive"),
    pytest.param(PROGRAMS[1], id="every_primitive_custom"),
])
def test_every_primitive_program_runs(path, exact):
    # both programs pass the checks (this is what `epic check` runs) and together use every primitive
    used: set[str] = set()
    for p in PROGRAMS:
        used |= _ops_used(pipeline.analyze(str(p)).source_program)
    missing = _required() - used
    assert not missing, f"primitives no program in tests/programs/every_primitive*.epi uses: {sorted(missing)}"
    # the reference runs the program on random inputs and every output is finite and not all zeros
    program = pipeline.analyze(str(path)).source_program
    sizes = dict(M=16, K=32, N=64)
    inputs = reference.random_inputs(program, sizes, seed=1)
    out = reference.run(program, inputs, exact=exact, sizes=sizes)
    assert out
    for name, y in out.items():
        assert torch.isfinite(y).all(), f"{path.name}: '{name}' is not finite"
        assert y.abs().max() > 0, f"{path.name}: '{name}' is all zeros"
