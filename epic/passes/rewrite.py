"""Tools every pass uses: build well-typed values, and rebuild a kernel through a rewrite function.

Passes never mutate values: `rebuild` walks a kernel in topological order, gives each value its
already-rewritten operands, and lets the pass return a replacement. Dead values disappear because
the new kernel is re-collected from its stores.
"""
from __future__ import annotations

from typing import Callable

from ..diagnostics import EpicError, Diagnostic
from ..ir.core import Store, Value, topo_order
from ..ir.typing import TypeRuleError, infer


def make(op: str, args: tuple, attrs: dict | None = None, like: Value | None = None, name: str | None = None) -> Value:
    """A new value with its type inferred; span/origin are inherited from `like` (the value it replaces)."""
    attrs = dict(attrs or {})
    try:
        dtype, shape = infer(op, tuple(args), attrs)
    except TypeRuleError as e:   # a pass built an ill-typed value: a bug in the pass
        raise EpicError(Diagnostic("E599", f"internal: pass built an ill-typed {op}: {e.message}",
                                   like.span if like else None)) from None
    return Value(op, tuple(args), attrs, dtype, shape, like.span if like else None,
                 name if name is not None else None, like.origin if like else None)


def copy_with(v: Value, args: tuple) -> Value:
    """v with new operands (same op/attrs/type); returns v itself when nothing changed."""
    if all(a is b for a, b in zip(args, v.args)):
        return v
    return Value(v.op, args, v.attrs, v.dtype, v.shape, v.span, v.name, v.origin)


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

