"""Binding a program's symbolic dimensions (M, D, F, ...) to sizes, from tensors or `M=..,D=..`.

Shared by the reference interpreter, the plan (byte ledger) and the runtime's argument checks.
"""
from __future__ import annotations

from fractions import Fraction

from .diagnostics import Diagnostic, EpicError
from .ir.core import Program, Tensor
from .shapes import Dim


def parse_shape_arg(text: str) -> dict[str, int]:
    """'M=8192,D=4096' -> {'M': 8192, 'D': 4096}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.strip().isidentifier() or not value.strip().isdigit() or int(value) <= 0:
            raise EpicError(Diagnostic("E607", f"bad size '{part}'", None, "write sizes as M=8192,D=4096"))
        out[name.strip()] = int(value)
    return out


def check_complete(program: Program, sizes: dict[str, int]) -> None:
    unknown = [d for d in sizes if d not in program.dims]
    if unknown:
        raise EpicError(Diagnostic("E607", f"the program has no dimension {', '.join(unknown)}", None,
                                   f"its dimensions are {', '.join(program.dims)}"))
    missing = [d for d in program.dims if d not in sizes]
    if missing:
        raise EpicError(Diagnostic("E607", f"no size given for {', '.join(missing)}", None,
                                   "give every dimension, e.g. --shape " + ",".join(f"{d}=..." for d in program.dims)))


def evaluate(dim: Dim, sizes: dict[str, int]) -> int:
    v = dim.evaluate(sizes)
    if v.denominator != 1:
        raise EpicError(Diagnostic("E607", f"dimension {dim} = {v} is not a whole number", None,
                                   "pick sizes that divide evenly"))
    return int(v)


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
                                       f"({t.describe()}), got shape {tuple(shape)}", t.span))
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
                expect = d.evaluate(sizes)
                if expect != n:
                    raise EpicError(Diagnostic("E602", f"'{t.name}' dimension {i} is {n}, but {d} = {expect} "
                                               f"(from {_origin(d, source)})", t.span,
                                               f"'{t.name}' is declared {t.describe()}"))
                continue
            name = unknown[0]
            power = d.names.count(name)
            known = Dim(d.coef, tuple(x for x in d.names if x != name)).evaluate(sizes)
            value = Fraction(n) / known
            root = round(float(value) ** (1 / power)) if value > 0 else 0
            if value <= 0 or Fraction(root) ** power != value:
                raise EpicError(Diagnostic("E602", f"'{t.name}' dimension {i} is {n}, which is not {d} for any "
                                           f"whole {name}", t.span))
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


def evaluate_integer(dim: Dim, sizes: dict[str, object]):
    v = dim.coef.numerator
    for n in dim.names:
        v = v * sizes[n]
    return v // dim.coef.denominator
