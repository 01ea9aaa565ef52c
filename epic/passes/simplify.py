"""Canonicalization: constant folding, algebraic identities and redundant casts, as a list of rules.

Each rule is (name, function(value, operands) -> replacement or None). The driver applies the
rules to every value, operands first, until nothing changes. Constant folding evaluates with the
reference interpreter's own op table, so folding cannot disagree with the semantics.
"""
from __future__ import annotations

import torch

from .. import reference
from ..dtypes import F32, I32
from ..ir import ops
from ..ir.core import Value
from ..shapes import SCALAR
from .rewrite import make, rebuild


def _const(x: Value, value: float | None = None) -> bool:
    return x.op == "const" and (value is None or float(x.attrs["value"]) == value)


def _same_type(x: Value, v: Value) -> bool:
    """x can stand in for v: same shape, and both floating point or both integer (a bf16 load's value
    is exact in the f32 compute type, but an int value may not replace a float one)."""
    return x.shape == v.shape and x.dtype.is_float == v.dtype.is_float and x.dtype.is_int == v.dtype.is_int


def _fold(v: Value, args: tuple) -> Value | None:
    cat = ops.category(v.op) if v.op in ops._TABLE else None
    if cat not in ("unary", "binary") or not args or not all(_const(a) for a in args):
        return None
    xs = [torch.tensor(float(a.attrs["value"]), dtype=torch.float64) for a in args]
    if cat == "unary":
        r = reference._UNARY[v.op](xs[0], v.attrs)
    else:
        r = reference._BINARY[v.op](xs[0], xs[1])
    value = float(r)
    if v.dtype is I32:
        value = int(value)
    return Value("const", (), {"value": value}, v.dtype, SCALAR, v.span, v.name, v.origin)


def _identity(v: Value, args: tuple) -> Value | None:
    op = v.op
    if op in ("add", "sub") and _const(args[1], 0.0) and _same_type(args[0], v):
        return args[0]
    if op == "add" and _const(args[0], 0.0) and _same_type(args[1], v):
        return args[1]
    if op in ("mul", "div") and _const(args[1], 1.0) and _same_type(args[0], v):
        return args[0]
    if op == "mul" and _const(args[0], 1.0) and _same_type(args[1], v):
        return args[1]
    if op == "neg" and args[0].op == "neg":
        return args[0].args[0]
    if op == "add" and args[1].op == "neg":
        return make("sub", (args[0], args[1].args[0]), like=v, name=v.name)
    if op == "sub" and args[1].op == "neg":
        return make("add", (args[0], args[1].args[0]), like=v, name=v.name)
    if op == "powi" and v.attrs["exp"] == 1 and _same_type(args[0], v):
        return args[0]
    if op == "select" and args[1] is args[2] and _same_type(args[1], v):
        return args[1]
    return None


def _redundant_cast(v: Value, args: tuple) -> Value | None:
    if v.op != "cast":
        return None
    (x,) = args
    # already of that type: a load of a bf16 tensor, or a value cast to it before
    if x.dtype is v.dtype and (x.op in ("load", "cast") or v.dtype is F32):
        return x
    return None


RULES = [
    ("fold-constants", _fold),
    ("algebraic-identities", _identity),
    ("redundant-casts", _redundant_cast),
]


def run(program):
    kernels = []
    for k in program.kernels:
        for _ in range(8):   # each round shrinks the kernel; 8 is far more than any sample needs
            changed = False

            def apply(v, args):
                nonlocal changed
                for _name, rule in RULES:
                    out = rule(v, args)
                    if out is not None:
                        changed = True
                        return out
                return None

            k = rebuild(k, apply)
            if not changed:
                break
        kernels.append(k)
    return program.replace_kernels(kernels)
