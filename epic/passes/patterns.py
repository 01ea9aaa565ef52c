"""Patterns over IR values and rewrite rules as data, applied by one driver (passes/rewrite.py).

    Rule("add-zero", Op("add", V("x"), C(0)), lambda b, v: b["x"], when=same_type("x"))

A pattern names an op (or any), sub-patterns for the operands, an optional literal value for
constants, and a name to bind the matched value to; a name bound twice must match the same value
(Op("select", V("c"), V("x"), V("x")) matches select(c, x, x)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir.core import Value


@dataclass(frozen=True)
class Pat:
    op: str | None = None                 # None: any op
    args: tuple["Pat", ...] | None = None  # None: operands not looked at
    bind: str | None = None
    value: float | None = None            # constants only: the literal's value
    where: Callable[[Value], bool] | None = None

    def match(self, v: Value, binds: dict[str, Value]) -> bool:
        if self.op is not None and v.op != self.op:
            return False
        if self.value is not None and float(v.attrs["value"]) != self.value:
            return False
        if self.where is not None and not self.where(v):
            return False
        if self.args is not None:
            if len(self.args) != len(v.args) or not all(p.match(a, binds) for p, a in zip(self.args, v.args)):
                return False
        if self.bind is not None:
            if binds.setdefault(self.bind, v) is not v:
                return False
        return True


def V(name: str, where: Callable[[Value], bool] | None = None) -> Pat:
    """Any value, bound to `name`."""
    return Pat(bind=name, where=where)


def C(value: float | None = None, bind: str | None = None) -> Pat:
    """A literal (of the given value)."""
    return Pat("const", bind=bind, value=value)


def Op(op: str, *args: Pat, bind: str | None = None, where: Callable[[Value], bool] | None = None) -> Pat:
    return Pat(op, tuple(args), bind, None, where)


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Pat
    rewrite: Callable[[dict[str, Value], Value], Value | None]   # (bindings, matched value) -> replacement
    when: Callable[[dict[str, Value], Value], bool] | None = None

    def apply(self, v: Value) -> Value | None:
        binds: dict[str, Value] = {}
        if not self.pattern.match(v, binds):
            return None
        if self.when is not None and not self.when(binds, v):
            return None
        return self.rewrite(binds, v)
