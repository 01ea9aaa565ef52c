"""Binding a program's symbolic dimensions (M, D, F, ...) to sizes, from tensors or `M=..,D=..`,
and checking the arguments of a call (names, scalar values).

Shared by the reference interpreter, the plan (byte ledger) and the runtime's argument checks.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

from .diagnostics import Diagnostic, EpicError, error
from .ir import primitives as P
from .ir.core import Program, Tensor
from .shapes import Dim


def parse_shape_arg(text: str) -> dict[str, int]:
    """'M=8192,D=4096' -> {'M': 8192, 'D': 4096}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not name.isidentifier() or not (value.isascii() and value.isdigit()) or int(value) <= 0:
            raise EpicError(Diagnostic("E607", f"bad size '{part}'", None, "write sizes as M=8192,D=4096"))
        if name in out:
            raise EpicError(Diagnostic("E607", f"size of {name} given twice", None, "give each dimension once"))
        out[name] = int(value)
    return out


def check_complete(program: Program, sizes: dict[str, int], others_too: bool = False) -> None:
    """E607 for a dimension without a size, and (unless others_too) for a size of no dimension."""
    unknown = [d for d in sizes if d not in program.dims]
    if unknown and not others_too:
        raise EpicError(Diagnostic("E607", f"the program has no dimension {', '.join(unknown)}", None,
                                   f"its dimensions are {', '.join(program.dims)}"))
    missing = [d for d in program.dims if d not in sizes]
    if missing:
        raise EpicError(Diagnostic("E607", f"no size given for {', '.join(missing)}", None,
                                   "give every dimension, e.g. --shape " + ",".join(f"{d}=..." for d in program.dims)))


# What the kernels can index. The gemm template passes M, N and K to CUTLASS as C++ ints; the combine
# kernel runs one warp per row (or column) and computes that index as blockIdx.x * blockDim.x in 32
# bits (256-thread blocks: 2^32 / 32 warps).
GEMM_MAX = 2**31 - 1
COMBINE_MAX = 2**27
# A gemm epilogue's row or column index (`row`, `col`: row_pick's select(col == label, ...)) is a
# float (epic_nodes/coordinate.hpp), exact up to 2^24: past it two columns would compare equal.
INDEX_MAX = 2**24


def check_indexable(program: Program, sizes: dict[str, int]) -> None:
    """E607 for sizes a kernel of the program cannot index, before anything is planned or launched."""
    for k in program.kernels:
        if k.kind == "gemm":
            why = "indexes M, N and K as 32-bit ints"
            limits = [("M", k.rows, GEMM_MAX, why), ("N", k.n, GEMM_MAX, why), ("K", k.k, GEMM_MAX, why)]
            axes = {P.coordinate_axis(v) for v in k.values}
            limits += [(what, dim, INDEX_MAX, f"computes each element's {name} index as a float, exact that far")
                       for what, dim, axis, name in (("M", k.rows, "row", "row"), ("N", k.n, "col", "column"))
                       if axis in axes]
        else:
            what, dim = ("rows", k.rows) if k.axis == "row" else ("columns", k.n)
            limits = [(what, dim, COMBINE_MAX, f"runs one warp per {what[:-1]} with a 32-bit thread index")]
        for what, dim, limit, why in limits:
            n = evaluate(dim, sizes)
            if n > limit:
                label = what if str(dim) == what else f"{what} ({dim})"
                raise error("E607", f"{k.kind} kernel '{k.name}': {label} = {n:,}, but the kernel {why} "
                            f"(at most {limit:,})", k.span,
                            "split the rows over several calls" if what in ("M", "rows") else
                            f"split {what} over several gemms")


# The one place a symbolic dimension meets sizes. Its value is exact, a Fraction (N/128 at N=200 is
# 25/16); what a tensor, a kernel or the reference needs is a whole number, and a size that leaves
# one fractional is the caller's sizes at fault: E607. The layout checks read the exact value so
# that their own diagnostics (E403, E404, ...) can say which rule it breaks and what it came to.
def exact(dim: Dim, sizes: dict[str, int]) -> Fraction:
    """dim's value at these sizes, exactly (a KeyError for a name sizes lacks)."""
    return dim.coef * _product(dim, sizes)


def evaluate(dim: Dim, sizes: dict[str, int]) -> int:
    """dim's value at these sizes as a whole number; E607 when the sizes leave it fractional."""
    v = exact(dim, sizes)
    if v.denominator != 1:
        raise EpicError(Diagnostic("E607", f"dimension {dim} = {v} is not a whole number", None,
                                   "pick sizes that divide evenly"))
    return int(v)


def evaluate_integer(dim: Dim, sizes: dict[str, object]):
    """evaluate() in integer arithmetic only, for sizes that may be torch SymInts (torch.compile's
    fake tensors), which a Fraction cannot hold. Assumes the sizes were validated (whole results)."""
    return dim.coef.numerator * _product(dim, sizes) // dim.coef.denominator


def _product(dim: Dim, sizes: dict):
    v = 1
    for n in dim.names:
        v = v * sizes[n]
    return v


def bind_from_tensors(program: Program, shapes: dict[str, tuple[int, ...]],
                      given: dict[str, int] | None = None) -> dict[str, int]:
    """Solve every dimension from the shapes of the tensors handed in."""
    sizes = dict(given or {})
    source: dict[str, str] = {k: "given" for k in sizes}
    pending: list[tuple[Tensor, int, Dim, int]] = []
    for t in program.inputs():
        if t.name not in shapes:
            continue
        shape = shapes[t.name]
        if len(shape) != len(t.dims):
            raise EpicError(Diagnostic("E602", f"'{t.name}' should have {len(t.dims)} dimension(s) "
                                       f"({t.describe()}), got shape {tuple(shape)}", t.span,
                                       f"pass a tensor of {t.describe()}"))
        for i, (d, n) in enumerate(zip(t.dims, shape)):
            pending.append((t, i, d, int(n)))
    progress = True
    while progress:
        progress = False
        for item in list(pending):
            t, i, d, n = item
            unknown = [x for x in d.names if x not in sizes]
            if len(set(unknown)) > 1:
                continue
            pending.remove(item)
            progress = True
            if not unknown:
                expect = exact(d, sizes)
                if expect != n:
                    raise EpicError(Diagnostic("E602", f"'{t.name}' dimension {i} is {n}, but {d} = {expect} "
                                               f"(from {_origin(d, source)})", t.span,
                                               f"'{t.name}' is declared {t.describe()}"))
                continue
            name = unknown[0]
            power = d.names.count(name)
            known = exact(Dim(d.coef, tuple(x for x in d.names if x != name)), sizes)
            value = Fraction(n) / known
            root = round(float(value) ** (1 / power)) if value > 0 else 0
            if value <= 0 or Fraction(root) ** power != value:
                raise EpicError(Diagnostic("E602", f"'{t.name}' dimension {i} is {n}, which is not {d} for any "
                                           f"whole {name}", t.span, f"'{t.name}' is declared {t.describe()}"))
            sizes[name] = root
            source[name] = f"'{t.name}' dimension {i}"
    return sizes


def _origin(d: Dim, source: dict[str, str]) -> str:
    return ", ".join(f"{n} from {source.get(n, '?')}" for n in dict.fromkeys(d.names)) or "a literal"


def solve_integer(program: Program, shapes: dict[str, tuple]) -> dict[str, object]:
    """Dimension sizes from tensor shapes with integer arithmetic only, so that the sizes may be
    torch SymInts (torch.compile's fake tensors). Assumes the shapes were validated before."""
    sizes: dict[str, object] = {}
    progress = True
    while progress:
        progress = False
        for t in program.inputs():
            for d, n in zip(t.dims, shapes.get(t.name, ())):
                unknown = [x for x in dict.fromkeys(d.names) if x not in sizes]
                if len(unknown) != 1 or d.names.count(unknown[0]) != 1:
                    continue
                known = 1
                for x in d.names:
                    if x != unknown[0]:
                        known = known * sizes[x]
                sizes[unknown[0]] = n * d.coef.denominator // (d.coef.numerator * known)
                progress = True
    return sizes


def check_names(program: Program, args: dict) -> None:
    """Every argument of a call names an input of the program."""
    expected = [t.name for t in program.inputs()]
    unknown = [str(k) for k in args if k not in expected]
    if unknown:
        raise error("E601", f"unexpected argument(s) {', '.join(unknown)}", None,
                    "the program takes " + ", ".join(expected))


def not_dense(x) -> str | None:
    """What kind of tensor x is when it is not a dense (strided) one -- "nested", "sparse_coo",
    "sparse_csr", ... -- whose sizes or strides would throw; None for a dense tensor."""
    if x.is_nested:
        return "nested"
    layout = str(x.layout).removeprefix("torch.")       # torch imported lazily, as in scalar_value
    return None if layout == "strided" else layout


def scalar_value(t: Tensor, value, finite: bool = True) -> float:
    """A runtime scalar argument as a float (None means: use the default). finite=False lets nan and
    inf through (the reference interpreter defines what they do; kernels refuse them)."""
    import torch
    hint = f"pass {t.name}=<a finite number>" + (f", or leave it out for the default {t.default:g}"
                                                  if t.default is not None else "")
    if value is None:
        if t.default is None:
            raise error("E601", f"missing scalar '{t.name}'", t.span, hint)
        return float(t.default)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool or value.is_meta:
            raise error("E603", f"scalar '{t.name}' must be one real number, got a {value.dtype} "
                        f"{'meta ' if value.is_meta else ''}tensor of shape {tuple(value.shape)}", t.span, hint)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error("E603", f"scalar '{t.name}' must be a real number, got {type(value).__name__}", t.span, hint)
    try:
        value = float(value)
    except (OverflowError, ValueError):        # an integer beyond float's range
        value = (math.inf if value > 0 else -math.inf) if isinstance(value, numbers.Integral) else math.nan
    if finite and not math.isfinite(value):
        raise error("E603", f"scalar '{t.name}' must be finite, got {value}", t.span, hint)
    return value
