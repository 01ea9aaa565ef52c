"""Canonicalization: constant folding, algebraic identities and redundant casts, as rules (data).

The driver applies the first matching rule to every value, operands first, and repeats until
nothing changes. Constant folding evaluates with the primitives' own float64 semantics (their
records' `ref`), so folding cannot disagree with the reference interpreter; a result that is not
representable in its type (an integer overflow) is left unfolded rather than raising.
`epic ir --after simplify --rules` lists which rule fired where.
"""
from __future__ import annotations

import math

from ..dtypes import F32
from ..ir import primitives as P
from ..ir.core import Value, const
from ..lazy import torch     # only a constant fold imports it
from .patterns import C, Op, Pat, Rule, V
from .rewrite import copy_with, make, rebuild


def _same_type(x: Value, v: Value) -> bool:
    """x can stand in for v: same shape, and both floating point or both integer (a bf16 load's value
    is exact in the f32 compute type, but an int value may not replace a float one)."""
    return x.shape == v.shape and x.dtype.is_float == v.dtype.is_float and x.dtype.is_int == v.dtype.is_int


def _keeps(name: str):
    return lambda b, v: _same_type(b[name], v)


def _foldable(v: Value) -> bool:
    return P.prim(v.op).fold and bool(v.args) and all(P.is_literal(a) for a in v.args)


def _fold(b, v: Value) -> Value | None:
    xs = [torch.tensor(float(a.attrs["value"]), dtype=torch.float64) for a in v.args]
    value = float(P.prim(v.op).ref(xs, v.attrs))
    if v.dtype.is_int:
        if not math.isfinite(value) or abs(value) >= 2**31:
            return None          # overflows i32: leave it to the kernel/interpreter
        value = int(value)
    return const(value, v.dtype, v.span, v.name, v.origin)


def _exact_in(x: Value, v: Value) -> bool:
    """A cast of x to v's dtype changes nothing: x already holds a value of that dtype (a load of
    such a tensor, an earlier cast to it, or any f32 value)."""
    p = P.prim(x.op)
    return x.dtype is v.dtype and (v.dtype is F32 or p.family is P.Family.CAST or p.reads == "tensor")


X, Y = V("x"), V("y")

RULES = [
    Rule("fold-constants", Pat(where=_foldable), _fold),
    Rule("add-zero", Op("add", X, C(0)), lambda b, v: b["x"], _keeps("x")),
    Rule("zero-add", Op("add", C(0), X), lambda b, v: b["x"], _keeps("x")),
    Rule("sub-zero", Op("sub", X, C(0)), lambda b, v: b["x"], _keeps("x")),
    Rule("mul-one", Op("mul", X, C(1)), lambda b, v: b["x"], _keeps("x")),
    Rule("one-mul", Op("mul", C(1), X), lambda b, v: b["x"], _keeps("x")),
    Rule("div-one", Op("div", X, C(1)), lambda b, v: b["x"], _keeps("x")),
    Rule("neg-neg", Op("neg", Op("neg", X)), lambda b, v: b["x"], _keeps("x")),
    Rule("add-neg", Op("add", X, Op("neg", Y)), lambda b, v: make("sub", (b["x"], b["y"]), like=v, name=v.name)),
    Rule("sub-neg", Op("sub", X, Op("neg", Y)), lambda b, v: make("add", (b["x"], b["y"]), like=v, name=v.name)),
    Rule("pow-one", Op("powi", X, where=lambda v: v.attrs["exp"] == 1), lambda b, v: b["x"], _keeps("x")),
    Rule("select-same", Op("select", V("c"), X, X), lambda b, v: b["x"], _keeps("x")),
    Rule("redundant-cast", Op("cast", X), lambda b, v: b["x"], lambda b, v: _exact_in(b["x"], v)),
]

MAX_ROUNDS = 64   # each round only shrinks the kernel; real programs settle in 2 or 3


def _first_rule(v: Value) -> tuple[Value, str] | None:
    for rule in RULES:
        out = rule.apply(v)
        if out is not None:
            return out, rule.name
    return None


def applicable(kernel) -> list[tuple[Value, str]]:
    """(value, rule) for every value some rule would still rewrite: empty when canonical."""
    return [(v, hit[1]) for v in kernel.values if (hit := _first_rule(v)) is not None]


def run(program, trace: list[str] | None = None):
    kernels = []
    for k in program.kernels:
        for _ in range(MAX_ROUNDS):
            fired = []

            def apply(v, args):
                candidate = copy_with(v, args)
                hit = _first_rule(candidate)
                if hit is None:
                    return candidate
                fired.append((hit[1], v))
                return hit[0]

            k = rebuild(k, apply)
            if trace is not None:
                trace.extend(f"{k.name}: {rule} at {_where(v)}" for rule, v in fired)
            if not fired:
                break
        kernels.append(k)
    return program.replace_kernels(kernels)


def _where(v: Value) -> str:
    loc = f"{v.span.line}:{v.span.column}" if v.span else "?"
    return f"{loc} ({v.name or v.op})"
