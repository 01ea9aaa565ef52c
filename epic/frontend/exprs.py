"""Expressions -> typed IR values: names, literals, operators, calls of primitives (looked up in
epic/ir/primitives.py), and inlining of `def`s.

Definitions are pure, so a call with the same arguments always gives the same value: inlining
memoizes by (definition, argument values), which keeps the IR a DAG and the work linear in the
program's size (a chain of defs that each use their argument twice would otherwise expand
exponentially)."""
from __future__ import annotations

import difflib

from .. import dtypes, trampoline
from ..diagnostics import Span, error
from ..ir import primitives as P
from ..ir.core import Value, const, make
from ..shapes import COL, Kind
from . import ast


class ExprLowering:
    """Lowers the expressions of one gemm's epilogue. `scope` resolves names that are not local
    values (tensors, dimensions, the accumulator) and knows the program's definitions."""

    def __init__(self, scope):
        self.scope = scope
        self.call_stack: list[tuple[str, Span]] = []
        self.origin: int | None = None       # the outermost inlined call being expanded
        self.origins = 0
        self.inlined: dict[tuple, Value] = {}
        self.made = 0                        # values made so far (bounded: see MAX_VALUES)

    # ------------------------------------------------------------------ building values
    def span(self, e) -> Span:
        # values made inside an inlined definition point at the outermost call in the user's file
        return self.call_stack[0][1] if self.call_stack else e.span

    def _count(self, span: Span) -> None:
        self.made += 1
        if self.made > MAX_VALUES:
            raise error("E105", f"the program expands to more than {MAX_VALUES:,} operations in one gemm", span,
                        "definitions that call another twice with different arguments double at each level "
                        "(def f2(x) = f1(f1(x))): nest fewer of them, or split the work over several gemms")

    def make(self, op: str, args: tuple, attrs: dict, span: Span) -> Value:
        self._count(span)
        try:
            return make(op, args, attrs, span, origin=self.origin)
        except P.TypeRuleError as e:
            notes = [(self.scope.defs[name].span, f"in the expansion of {name}") for name, _ in reversed(self.call_stack)]
            raise error(e.code, e.message, span, e.hint or "`epic ops` lists each operation and what it takes",
                        notes) from None

    def const(self, x: float | int, span: Span, is_int: bool = False) -> Value:
        self._count(span)
        return const(int(x) if is_int else x, dtypes.I32 if is_int else dtypes.F32, span, origin=self.origin)

    # ------------------------------------------------------------------ expressions
    # A chain of 20,000 terms must not need 20,000 Python frames: each syntax node is lowered by a
    # generator (`expr`) that yields the generators for its operands (see epic/trampoline.py).
    def value(self, e, env: dict[str, Value]) -> Value:
        """The Value of expression e in env."""
        return trampoline.run(self.expr(e, env))

    def expr(self, e, env: dict[str, Value]):
        """Lowers one syntax node: a generator for trampoline.run (see `value`)."""
        if isinstance(e, ast.Num):
            return self._number(e)
        if isinstance(e, ast.Name):
            return self._name(e, env)
        if isinstance(e, ast.Neg):
            x = yield self.expr(e.operand, env)
            if P.is_literal(x):
                return self.const(-x.attrs["value"], self.span(e), x.dtype.is_int)
            return self.make("neg", (x,), {}, self.span(e))
        if isinstance(e, ast.Pow):
            return (yield from self._pow(e, env))
        if isinstance(e, ast.BinOp):
            a = yield self.expr(e.lhs, env)
            b = yield self.expr(e.rhs, env)
            return self.make(e.op, (a, b), {}, self.span(e))
        if isinstance(e, ast.Call):
            return (yield from self._call(e, env))
        raise AssertionError(f"unknown syntax node {e!r}")

    def _number(self, e: ast.Num) -> Value:
        if e.is_int and len(e.text) <= 10:
            value = int(e.text)
            if value < 2**31:
                return self.const(value, self.span(e), True)
        value = e.value
        if value != value or value in (float("inf"), float("-inf")):
            raise error("E212", f"the number {e.text[:40]} is too large for a float", e.span,
                        "numbers are f64 literals; write a finite value")
        return self.const(value, self.span(e))

    def _name(self, e: ast.Name, env: dict[str, Value]) -> Value:
        span = self.span(e)
        if e.id in env:
            return env[e.id]
        keyword = P.KEYWORDS.get(e.id)
        if keyword is not None and keyword.family is P.Family.SOURCE and keyword.name != "acc":
            return self.make(keyword.name, (), {}, span)
        if self.call_stack:
            raise error("E201", f"unknown name '{e.id}' in definition '{self.call_stack[-1][0]}'", e.span,
                        "a definition sees only its parameters, its own names and row/col")
        found = self.scope.resolve(e.id, span)
        if found is not None:
            return found
        if e.id in self.scope.defs:
            raise error("E201", f"'{e.id}' is a definition; call it: {e.id}(...)", span,
                        f"{e.id} takes arguments: write {e.id}(...)")
        raise error("E201", f"unknown name '{e.id}'", span, suggest(e.id, list(env) + self.scope.names()) or
                    f"declare it (in {e.id}: bf16[M, N]) or bind it (h = ...) before this line")

    def _pow(self, e: ast.Pow, env):
        x = yield self.expr(e.base, env)
        p = yield from self.int_literal(e.exponent, env, "the exponent",
                                        "only integer powers are built in; write exp(y * log(x)) for others")
        if abs(p) > 64:
            raise error("E212", f"exponent {p} is too large (|p| <= 64)", e.exponent.span,
                        "write exp(n * log(x)) for larger powers of a positive x")
        return self.make("powi", (x,), {"exp": p}, self.span(e))

    def int_literal(self, e, env, what: str, hint: str):
        v = yield self.expr(e, env)
        if not P.is_literal(v) or not v.dtype.is_int:
            raise error("E212", f"{what} must be an integer literal", getattr(e, "span", None), hint)
        return int(v.attrs["value"])

    def _call(self, e: ast.Call, env):
        f, span = e.func, self.span(e)
        if f in self.scope.defs:
            return (yield from self._inline(e, env))
        c = P.call(f)
        if c is None:
            if f in env or f in P.KEYWORDS or f in self.scope.names():
                raise error("E211", f"'{f}' is a value, not a function", span,
                            f"use {f} without parentheses; to multiply, write {f} * (...)")
            raise error("E211", f"unknown function '{f}'", span,
                        suggest(f, list(self.scope.defs) + sorted(P.BUILTIN_NAMES)) or
                        "`epic ops` lists the built-in functions; `def` defines new ones")
        self._arity(e, c.arity, f"{f}({', '.join(['x', 'y', 'z'][:c.primitive.arity] + list(c.literal_args))})")
        n = c.primitive.arity
        args = []
        for a in e.args[:n]:
            args.append((yield self.expr(a, env)))
        args = tuple(args)
        attrs = dict(c.attrs)
        for name, a in zip(c.literal_args, e.args[n:]):
            value = yield from self.int_literal(a, env, f"the {name} size", f"e.g. {f}(x, 128)")
            if value <= 0:
                raise error("E212", f"the {name} size must be positive", a.span, f"e.g. {f}(x, 128)")
            attrs[name] = value
        p = c.primitive
        if c.inner is not None:
            if args[0].kind is not Kind.TILE:
                other = {Kind.COL: "col", Kind.ROW: "row"}.get(args[0].kind)
                raise error("E206", f"{f} reduces a whole tile, but its operand is a {args[0].shape.describe()}",
                            span, f"{other}_{attrs['fn']}(x) reduces a vector to one number" if other else
                            "a scalar is already one number")
            args = (self.make(p.name, args, c.inner, span),)
        if p.family is P.Family.PAIR and p.pair_part is not None and args[0].kind in (Kind.COL, Kind.SCALAR):
            return args[0]   # constant along the row: both columns of every pair hold the same value
        return self.make(p.name, args, attrs, span)

    def _arity(self, e: ast.Call, n: int, signature: str) -> None:
        if e.kwargs:
            raise error("E203", f"{e.func} takes no keyword arguments", e.kwarg_spans[next(iter(e.kwargs))],
                        f"pass its arguments by position: {signature}")
        if len(e.args) != n:
            raise error("E203", f"{e.func} takes {n} argument{'s' if n != 1 else ''}, got {len(e.args)}", self.span(e),
                        f"call it as {signature} (`epic ops` lists every built-in function)")

    # ------------------------------------------------------------------ definitions
    def _inline(self, e: ast.Call, env):
        d = self.scope.defs[e.func]
        span = self.span(e)
        if any(name == d.name for name, _ in self.call_stack):
            raise error("E210", f"'{d.name}' calls itself", e.span, "definitions are inlined, so they cannot recurse",
                        [(self.call_stack[0][1], "expanded from this call")])
        names = [p.name for p in d.params]
        signature = f"{d.name}({', '.join(names)})"
        if len(e.args) > len(names):
            raise error("E203", f"{d.name} takes {len(names)} argument{'s' if len(names) != 1 else ''}, got "
                        f"{len(e.args)}", span, signature)
        bound: dict[str, Value] = {}
        spans: dict[str, Span] = {}
        for p, a in zip(d.params, e.args):
            bound[p.name], spans[p.name] = (yield self.expr(a, env)), a.span
        for key, a in e.kwargs.items():
            if key not in names:
                raise error("E203", f"{d.name} has no parameter '{key}'", e.kwarg_spans[key], signature)
            if key in bound:
                raise error("E203", f"argument '{key}' given twice", e.kwarg_spans[key],
                            f"{signature}: '{key}' is already given by position")
            bound[key], spans[key] = (yield self.expr(a, env)), a.span
        for p in d.params:
            if p.kind and p.name in bound and bound[p.name].kind.value != p.kind:
                got = bound[p.name].shape.describe()
                raise error("E206", f"argument '{p.name}' of {d.name} must be a {_KIND_WORDS[p.kind]}, got a {got}",
                            spans[p.name] if not self.call_stack else span, f"{signature}: see its definition",
                            [(p.span, f"'{p.name}' is declared `{p.name}: {p.kind}`")])
        self.call_stack.append((d.name, span))
        outermost = len(self.call_stack) == 1
        if outermost:
            self.origins += 1
            self.origin = self.origins
        try:
            for p in d.params:
                if p.name not in bound:
                    if p.default is None:
                        raise error("E203", f"{d.name} needs argument '{p.name}'", span, signature)
                    bound[p.name] = yield self.expr(p.default, {})
            key = (d.name, tuple(bound[n].id for n in names), self.origin if outermost else None)
            if key in self.inlined:
                return self.inlined[key]
            local = dict(bound)
            for let in d.lets:
                if let.name in local:
                    raise error("E202", f"'{let.name}' is assigned twice in '{d.name}'", let.span,
                                "values are immutable: pick a new name")
                local[let.name] = yield self.expr(let.expr, local)
            result = yield self.expr(d.result, local)
            self.inlined[key] = result
            return result
        finally:
            self.call_stack.pop()
            if not self.call_stack:
                self.origin = None


# Values one gemm's epilogue may expand to: 5x a sum of 3,000 terms. Definitions that double at
# each level reach it after about 16 levels (1.5 s) instead of running for hours at 30.
MAX_VALUES = 50_000

_KIND_WORDS = {"tile": "tile", "row": "row vector (one value per column, e.g. [N])",
               "col": "column vector (one value per row, e.g. [M])", "scalar": "scalar", "block": "block value"}


def suggest(name: str, candidates: list[str]) -> str | None:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f"did you mean '{close[0]}'?" if close else None
