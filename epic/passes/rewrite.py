"""Tools every pass uses: build well-typed values, and rebuild a kernel through a rewrite function.

Passes never mutate values: `rebuild` walks a kernel in topological order, gives each value its
already-rewritten operands, and lets the pass return a replacement. Dead values disappear because
the new kernel is re-collected from its stores. Every value is built by the typed constructor
(ir.core.make), so its dtype and shape come from its primitive's rule.
"""
from __future__ import annotations

from typing import Callable

from ..diagnostics import error
from ..dtypes import F32
from ..ir import core
from ..ir.core import Store, Value, topo_order
from ..ir.typing import TypeRuleError


def make(op: str, args: tuple, attrs: dict | None = None, like: Value | None = None, name: str | None = None) -> Value:
    """A new value with its type inferred; span/origin are inherited from `like` (the value it replaces)."""
    try:
        return core.make(op, tuple(args), attrs, like.span if like else None, name,
                         like.origin if like else None)
    except TypeRuleError as e:   # a pass built an ill-typed value: a bug in the pass
        raise error("E599", f"internal: a pass built an ill-typed {op}: {e.message} (a bug in epic)",
                    like.span if like else None) from None


def copy_with(v: Value, args: tuple) -> Value:
    """v with new operands (same op and attributes, type re-derived); v itself when nothing changed."""
    if all(a is b for a, b in zip(args, v.args)):
        return v
    out = make(v.op, args, v.attrs, like=v, name=v.name)
    return out


Rewrite = Callable[[Value, tuple], Value | None]


def rebuild(kernel, fn: Rewrite, extra_stores: list[Store] | None = None):
    """Apply fn to every value (operands first). fn(v, new_args) returns a replacement or None (keep)."""
    new: dict[int, Value] = {}
    for v in kernel.values:
        args = tuple(new[a.id] for a in v.args)
        out = fn(v, args)
        if out is None:
            out = copy_with(v, args)
        new[v.id] = out
    stores = [Store(s.tensor, new[s.value.id], s.span) for s in kernel.stores] + list(extra_stores or [])
    return kernel.with_values(topo_order([s.value for s in stores]), stores)


def product(factors: list[tuple[Value, int]], like: Value) -> Value | None:
    """The value prod(f ** e) of (value, integer exponent) pairs: a product of the positive powers over
    a product of the negative ones (1 / ... when there are only negative ones; None when empty)."""
    num = [f if e == 1 else make("powi", (f,), {"exp": e}, like) for f, e in factors if e > 0]
    den = [f if e == -1 else make("powi", (f,), {"exp": -e}, like) for f, e in factors if e < 0]
    acc = None
    for f in num:
        acc = f if acc is None else make("mul", (acc, f), like=like)
    if den:
        d = den[0]
        for f in den[1:]:
            d = make("mul", (d, f), like=like)
        one = core.const(1.0, F32, like.span)
        acc = make("div", (acc if acc is not None else one, d), like=like)
    return acc
