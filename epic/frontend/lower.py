"""Syntax tree -> typed IR: name resolution, inlining of `def`s, dtype and shape inference.

Errors here are E2xx diagnostics at the user's span. Definitions are inlined at their call site
(the language has no function values), so every value in the IR is a primitive.
"""
from __future__ import annotations

import functools
import os
from importlib import resources

from .. import dtypes
from ..diagnostics import Diagnostic, EpicError, Span
from ..ir import ops
from ..ir.core import GemmKernel, Program, Store, Tensor, Value, topo_order
from ..ir.typing import TypeRuleError, check_storable, infer
from ..plan.config import AUX_LOADS, RASTERS, SCHEDULES
from ..shapes import COL, SCALAR, TILE, Dim, Kind, Shape
from . import ast
from .parser import parse



def _err(code: str, message: str, span: Span | None, hint: str | None = None, notes=None) -> EpicError:
    return EpicError(Diagnostic(code, message, span, hint, notes or []))


@functools.lru_cache(maxsize=1)
def _prelude() -> ast.Module:
    text = resources.files("epic").joinpath("prelude.epi").read_text()
    return parse(text, "<prelude>")


def load_program(text: str, name: str = "<string>", base_dir: str | None = None) -> Program:
    module = parse(text, name)
    return Lowering(module, base_dir if base_dir is not None else os.path.dirname(os.path.abspath(name))).run()


class Lowering:
    def __init__(self, module: ast.Module, base_dir: str):
        self.module = module
        self.base_dir = base_dir
        self.defs: dict[str, ast.Def] = {}
        self.tensors: dict[str, Tensor] = {}
        self.dims: dict[str, Span] = {}
        self.kernels: list[GemmKernel] = []
        self.rows: Dim | None = None

    # ------------------------------------------------------------------ program
    def run(self) -> Program:
        for d in _prelude().items:
            if isinstance(d, ast.Def):
                self.defs[d.name] = d
        user_defs: dict[str, ast.Def] = {}
        self._collect_defs(self.module, user_defs, set())
        self.defs.update(user_defs)
        for item in self.module.items:
            if isinstance(item, ast.InDecl):
                self._declare_input(item)
            elif isinstance(item, ast.Gemm):
                self.kernels.append(self._gemm(item))
        if not self.kernels:
            raise _err("E213", "the program has no gemm", Span(self.module.source, 1, 1),
                       "a program is one or more `gemm NAME(A @ B) { ... }` blocks")
        return Program(self.module.source.name, self.tensors, self.kernels, list(self.dims))

    def _collect_defs(self, module: ast.Module, into: dict, visiting: set) -> None:
        for item in module.items:
            if isinstance(item, ast.Use):
                path = item.path if os.path.isabs(item.path) else os.path.join(self.base_dir, item.path)
                key = os.path.abspath(path)
                if key in visiting:
                    continue
                try:
                    with open(path) as f:
                        text = f.read()
                except OSError as e:
                    raise _err("E201", f"cannot read '{item.path}': {e.strerror}", item.span) from None
                visiting.add(key)
                sub = parse(text, path)
                for it in sub.items:
                    if isinstance(it, (ast.Gemm, ast.InDecl)):
                        raise _err("E202", f"'{item.path}' may only hold definitions (def) and use lines",
                                   it.span if hasattr(it, "span") else item.span)
                self._collect_defs(sub, into, visiting)
            elif isinstance(item, ast.Def):
                if item.name in into:
                    raise _err("E202", f"'{item.name}' is defined twice", item.span,
                               notes=[(into[item.name].span, "first definition")])
                if item.name in ops.BUILTIN_NAMES or item.name in ops.RESERVED or dtypes.lookup(item.name):
                    raise _err("E202", f"'{item.name}' is a built-in name and cannot be redefined", item.span)
                into[item.name] = item

    # ------------------------------------------------------------------ declarations
    def _dim(self, d: ast.DimExpr) -> Dim:
        def atom(a: ast.DimAtom) -> Dim:
            if a.text.isdigit():
                return Dim.const(int(a.text))
            if not a.text.isidentifier() or a.text in ops.RESERVED:
                raise _err("E208", f"'{a.text}' is not a dimension", a.span)
            if a.text in self.tensors:
                raise _err("E202", f"'{a.text}' names a tensor; dimensions need their own names", a.span)
            self.dims.setdefault(a.text, a.span)
            return Dim.of(a.text)

        out = atom(d.first)
        for op, a in d.rest:
            rhs = atom(a)
            if op == "*":
                out = out * rhs
            else:
                if rhs.names or rhs.coef == 0:
                    raise _err("E208", "a dimension can only be divided by a positive integer", a.span)
                out = out / rhs
        return out

    def _dtype(self, spec: ast.TypeSpec) -> dtypes.DType:
        dt = dtypes.lookup(spec.dtype)
        if dt is None or dt is dtypes.BOOL:
            raise _err("E204", f"unknown dtype '{spec.dtype}'", spec.dtype_span,
                       "dtypes: " + ", ".join(n for n in dtypes.ALL if n != "bool"))
        return dt

    def _new_tensor(self, name: str, span: Span, **kw) -> Tensor:
        if name in ops.RESERVED or name in ops.BUILTIN_NAMES:
            raise _err("E202", f"'{name}' is a reserved name", span)
        if name in self.tensors:
            raise _err("E202", f"'{name}' is declared twice", span, notes=[(self.tensors[name].span, "first declared here")])
        if name in self.dims:
            raise _err("E202", f"'{name}' already names a dimension", span)
        t = Tensor(name=name, span=span, **kw)
        self.tensors[name] = t
        return t

    def _declare_input(self, d: ast.InDecl) -> Tensor:
        dt = self._dtype(d.type)
        dims = tuple(self._dim(x) for x in d.type.dims) if d.type.dims else ()
        if len(dims) > 2:
            raise _err("E208", f"'{d.name}' has {len(dims)} dimensions; epilogue operands have at most 2", d.type.span)
        if d.default is not None and dims:
            raise _err("E208", "only scalars take a default value", d.span)
        if dims and dt is dtypes.I4:
            raise _err("E205", "int4 inputs are not supported (int4 is an output format)", d.type.dtype_span)
        return self._new_tensor(d.name, d.span, dtype=dt, dims=dims, role="scalar" if not dims else "input",
                                default=d.default)

    def _operand(self, op: ast.Operand, which: str) -> Tensor:
        if op.type is not None:
            if op.type.dims is None or len(op.type.dims) != 2:
                raise _err("E208", f"GEMM operand '{op.name}' needs two dimensions, e.g. {op.name}: bf16[M, K]",
                           op.type.span)
            dt = self._dtype(op.type)
            t = self._new_tensor(op.name, op.span, dtype=dt, dims=tuple(self._dim(x) for x in op.type.dims),
                                 role="input", layout="kmajor" if which == "B" else "row")
        else:
            t = self.tensors.get(op.name)
            if t is None:
                raise _err("E201", f"unknown tensor '{op.name}'", op.span,
                           f"declare it here with a type, e.g. {op.name}: bf16[M, K], or store it in an earlier gemm")
            if len(t.dims) != 2 or t.block:
                raise _err("E209", f"'{op.name}' is a {t.describe()}, not a matrix", op.span)
            if which == "B" and t.role != "input":
                raise _err("E209", f"the B operand '{op.name}' must be a program input (weights)", op.span)
        if t.dtype not in dtypes.GEMM_OPERAND:
            raise _err("E205", f"GEMM operand '{op.name}' is {t.dtype}; the mainloop multiplies bf16, f16, e4m3 or e5m2",
                       op.type.dtype_span if op.type else op.span,
                       "store the earlier result as bf16 (tmp x: bf16 = ...)" if t.role in ("out", "tmp") else None)
        return t

    # ------------------------------------------------------------------ kernels
    def _gemm(self, g: ast.Gemm) -> GemmKernel:
        if any(k.name == g.name for k in self.kernels):
            raise _err("E202", f"gemm '{g.name}' is defined twice", g.span)
        a = self._operand(g.a, "A")
        b = self._operand(g.b, "B")
        rows, k = a.dims
        k2, n = b.dims
        if k != k2:
            raise _err("E209", f"inner dimensions differ: {a.name} is [{rows}, {k}] but {b.name} is [{k2}, {n}]",
                       g.b.span, "A[M, K] @ B[K, N]: the second dimension of A is the first of B")
        if (a.dtype.bits == 8) != (b.dtype.bits == 8) or (a.dtype.bits == 16 and a.dtype is not b.dtype):
            raise _err("E205", f"cannot multiply {a.dtype} by {b.dtype}", g.b.span,
                       "use the same 16-bit type on both sides, or fp8 (e4m3/e5m2) on both")
        if self.rows is None:
            self.rows = rows
        elif rows != self.rows:
            raise _err("E209", f"'{a.name}' has {rows} rows but the program's rows are {self.rows}", g.a.span,
                       "in a chain every GEMM keeps the row count M: a later GEMM's A is an earlier output [M, X]")
        kernel = _KernelBuilder(self, g, a, b, rows, k, n)
        return kernel.build()


class _KernelBuilder:
    def __init__(self, low: Lowering, g: ast.Gemm, a: Tensor, b: Tensor, rows: Dim, k: Dim, n: Dim):
        self.low, self.g, self.a, self.b = low, g, a, b
        self.rows, self.k, self.n = rows, k, n
        self.loads: dict[str, Value] = {}
        self.env: dict[str, Value] = {}
        self.stores: list[Store] = []
        self.acc = Value("acc", (), {}, dtypes.F32, TILE, g.span, "acc")
        self.call_stack: list[tuple[str, Span]] = []
        self.origin: int | None = None       # the outermost inlined call being expanded
        self.origins = 0

    def build(self) -> GemmKernel:
        options = self._options()
        for stmt in self.g.body:
            if isinstance(stmt, ast.InDecl):
                self.low._declare_input(stmt)
            elif isinstance(stmt, ast.Let):
                self._bind(stmt.name, stmt.span)
                v = self.expr(stmt.expr, self.env)
                if v.name is None:
                    v.name = stmt.name
                self.env[stmt.name] = v
            elif isinstance(stmt, ast.Store):
                self._store(stmt)
        if not self.stores:
            raise _err("E213", f"gemm '{self.g.name}' stores nothing", self.g.span,
                       "add `out NAME: bf16 = acc` (returned) or `tmp NAME: bf16 = ...` (read by a later gemm)")
        values = topo_order([s.value for s in self.stores])
        return GemmKernel(self.g.name, self.a.name, self.b.name, self.rows, self.k, self.n, values,
                          self.stores, options, self.g.span)

    # gemm options: sizes written like 128x256x64 (allowed part counts, example), or one of a set
    _SIZE_OPTIONS = {"tile": ((2, 3), "128x128x64"), "cluster": ((2,), "2x1"), "epi_tile": ((2,), "128x64")}
    _CHOICE_OPTIONS = {"schedule": SCHEDULES, "aux_load": AUX_LOADS, "raster": RASTERS, "swizzle": ("1", "2", "4", "8")}

    def _options(self) -> dict:
        """The `with ...` options of a gemm; values are range-checked again by plan.config.validate."""
        out = {}
        for key, (text, span) in self.g.options.items():
            if key in self._SIZE_OPTIONS:
                counts, example = self._SIZE_OPTIONS[key]
                parts = [int(p) for p in text.split("x")] if "x" in text else []
                if len(parts) not in counts:
                    raise _err("E215", f"{key} must look like {example}, got '{text}'", span)
                out[key] = tuple(parts) + ((64,) if key == "tile" and len(parts) == 2 else ())
            elif key in self._CHOICE_OPTIONS:
                choices = self._CHOICE_OPTIONS[key]
                if text not in choices:
                    raise _err("E215", f"{key} must be one of {', '.join(choices)}, got '{text}'", span)
                out[key] = int(text) if key == "swizzle" else text
            else:
                raise _err("E215", f"unknown gemm option '{key}'", span,
                           "options: " + ", ".join([*self._SIZE_OPTIONS, *self._CHOICE_OPTIONS]))
        return out

    def _bind(self, name: str, span: Span) -> None:
        if name in ops.RESERVED:
            raise _err("E202", f"'{name}' is a reserved name", span)
        if name in self.env:
            raise _err("E202", f"'{name}' is assigned twice", span, "values are immutable: pick a new name")
        if name in self.low.tensors or name in self.low.dims:
            raise _err("E202", f"'{name}' already names a tensor or dimension", span)

    def _store(self, s: ast.Store) -> None:
        dt = self.low._dtype(s.type)
        v = self.expr(s.expr, self.env)
        try:
            check_storable(dt, v.shape)
        except TypeRuleError as e:
            raise _err(e.code, f"'{s.name}': {e.message}", s.span, e.hint) from None
        if v.dtype is dtypes.BOOL:
            raise _err("E205", f"'{s.name}' is a comparison result (bool)", s.span, "store select(cond, 1, 0)")
        dims = v.shape.dims(self.rows, self.n)
        if s.type.dims is not None:
            declared = tuple(self.low._dim(d) for d in s.type.dims)
            if declared != dims:
                raise _err("E208", f"'{s.name}' is declared [{', '.join(map(str, declared))}] but its value is "
                           f"a {v.shape.describe(self.rows, self.n)}", s.type.span)
        if dt is dtypes.I4 and v.shape.width.denominator != 1 and (v.shape.width * 2).denominator != 1:
            raise _err("E405", f"'{s.name}': int4 packs column pairs and needs an even width", s.span)
        self.low._new_tensor(s.name, s.span, dtype=dt, dims=dims, role=s.role, producer=self.g.name,
                             block=v.shape.block)
        if v.name is None:
            v.name = s.name
        self.stores.append(Store(s.name, v, s.span))

    # ------------------------------------------------------------------ expressions
    def _span(self, e) -> Span:
        # Values made inside an inlined definition point at the outermost call in the user's file.
        return self.call_stack[0][1] if self.call_stack else e.span

    def make(self, op: str, args: tuple, attrs: dict, span: Span) -> Value:
        try:
            dtype, shape = infer(op, args, attrs)
        except TypeRuleError as e:
            notes = [(self.low.defs[name].span, f"in the expansion of {name}") for name, _ in reversed(self.call_stack)]
            raise _err(e.code, e.message, span, e.hint, notes) from None
        return Value(op, args, attrs, dtype, shape, span, origin=self.origin)

    def _const(self, x: float, span: Span, is_int: bool = False) -> Value:
        return Value("const", (), {"value": x}, dtypes.I32 if is_int else dtypes.F32, SCALAR, span)

    def _load(self, t: Tensor, span: Span) -> Value:
        if t.name in self.loads:
            return self.loads[t.name]
        if t.producer == self.g.name:
            raise _err("E201", f"'{t.name}' is stored by this gemm; refer to the value, not the tensor", span,
                       "bind it with a name first: h = ...; out y: bf16 = h; ... use h")
        shape = self._shape_of(t, span)
        v = Value("load", (), {"tensor": t.name}, t.dtype, shape, span, t.name)
        self.loads[t.name] = v
        return v

    def _shape_of(self, t: Tensor, span: Span) -> Shape:
        if not t.dims:
            return SCALAR
        here = f"this gemm's accumulator is [{self.rows}, {self.n}]"
        if len(t.dims) == 1:
            (d,) = t.dims
            is_col = d == self.rows
            r = d.ratio(self.n)
            if is_col and r is not None:
                raise _err("E214", f"'{t.name}' [{d}] could be a row or a column vector: M and N have the same name",
                           span, "give the rows and the columns different dimension names")
            if is_col:
                return COL
            if r is not None:
                return Shape(Kind.ROW, r)
            raise _err("E208", f"'{t.name}' is [{d}], which matches neither rows nor columns; {here}", span)
        d0, d1 = t.dims
        r = d1.ratio(self.n)
        if d0 != self.rows or r is None:
            raise _err("E208", f"'{t.name}' is [{d0}, {d1}], which does not line up with the tile; {here}", span,
                       "extra tiles must be [M, N] (or [M, 2*N] / [M, N/2] for pairwise maps)")
        if t.block:
            return Shape(Kind.BLOCK, r * t.block, t.block)
        return Shape(Kind.TILE, r)

    def expr(self, e, env: dict[str, Value]) -> Value:
        if isinstance(e, ast.Num):
            return self._const(e.value, self._span(e), e.is_int)
        if isinstance(e, ast.Name):
            return self._name(e, env)
        if isinstance(e, ast.Neg):
            x = self.expr(e.operand, env)
            if x.op == "const":
                return self._const(-x.attrs["value"], self._span(e), x.dtype.is_int)
            return self.make("neg", (x,), {}, self._span(e))
        if isinstance(e, ast.BinOp):
            if e.op == "pow":
                return self._pow(e, env)
            a, b = self.expr(e.lhs, env), self.expr(e.rhs, env)
            return self.make(e.op, (a, b), {}, self._span(e))
        if isinstance(e, ast.Call):
            return self._call(e, env)
        raise AssertionError(f"unknown syntax node {e!r}")

    def _name(self, e: ast.Name, env: dict[str, Value]) -> Value:
        span = self._span(e)
        if e.id in env:
            return env[e.id]
        if e.id == "acc" and not self.call_stack:
            return self.acc
        if e.id == "row":
            return Value("row_index", (), {}, dtypes.I32, COL, span, "row")
        if e.id == "col":
            return Value("col_index", (), {}, dtypes.I32, Shape(Kind.ROW), span, "col")
        if self.call_stack:
            name = self.call_stack[-1][0]
            raise _err("E201", f"unknown name '{e.id}' in definition '{name}'", e.span,
                       "a definition sees only its parameters, its own names and row/col")
        if e.id in self.low.tensors:
            return self._load(self.low.tensors[e.id], span)
        if e.id in self.low.dims:
            return Value("dim", (), {"dim": Dim.of(e.id)}, dtypes.I32, SCALAR, span, e.id)
        if e.id in self.low.defs:
            raise _err("E201", f"'{e.id}' is a definition; call it: {e.id}(...)", span)
        raise _err("E201", f"unknown name '{e.id}'", span, _suggest(e.id, list(env) + list(self.low.tensors) + ["acc"]))

    def _pow(self, e: ast.BinOp, env) -> Value:
        x = self.expr(e.lhs, env)
        p = self._int_literal(e.rhs, env, "the exponent",
                              "only integer powers are built in; write exp(y * log(x)) for others")
        if abs(p) > 64:
            raise _err("E212", f"exponent {p} is too large (|p| <= 64)", e.rhs.span)
        return self.make("powi", (x,), {"exp": p}, self._span(e))

    def _int_literal(self, e, env, what: str, hint: str) -> int:
        v = self.expr(e, env)
        if v.op != "const" or float(v.attrs["value"]) != int(v.attrs["value"]):
            raise _err("E212", f"{what} must be an integer literal", getattr(e, "span", None), hint)
        return int(v.attrs["value"])

    def _call(self, e: ast.Call, env) -> Value:
        f, span = e.func, self._span(e)
        if f in self.low.defs:
            return self._inline(e, env)
        dt = dtypes.lookup(f)
        if dt is not None and dt is not dtypes.BOOL:
            self._arity(e, 1)
            return self.make("cast", (self.expr(e.args[0], env),), {"to": dt}, span)
        if f in ops.UNARY_FUNCS:
            self._arity(e, 1)
            return self.make(f, (self.expr(e.args[0], env),), {}, span)
        if f in ops.BINARY_FUNCS:
            self._arity(e, 2)
            return self.make(f, tuple(self.expr(a, env) for a in e.args), {}, span)
        if f == "select":
            self._arity(e, 3)
            return self.make("select", tuple(self.expr(a, env) for a in e.args), {}, span)
        if f in ops.PAIR_FUNCS:
            self._arity(e, ops.PAIR_FUNCS[f])
            args = tuple(self.expr(a, env) for a in e.args)
            if f != "interleave" and args[0].kind in (Kind.COL, Kind.SCALAR):
                return args[0]   # constant along the row: every column pair holds the same value
            return self.make(f, args, {}, span)
        if f in ops.REDUCE_FUNCS:
            self._arity(e, 1)
            axis, fn = ops.REDUCE_FUNCS[f]
            return self.make("reduce", (self.expr(e.args[0], env),), {"axis": axis, "fn": fn}, span)
        if f in ops.BLOCK_FUNCS:
            self._arity(e, 2)
            block = self._int_literal(e.args[1], env, "the block size", "e.g. block_max(abs(h), 128)")
            if block <= 0:
                raise _err("E212", "the block size must be positive", e.args[1].span)
            return self.make("block_reduce", (self.expr(e.args[0], env),), {"fn": ops.BLOCK_FUNCS[f], "block": block},
                             span)
        raise _err("E211", f"unknown function '{f}'", span,
                   _suggest(f, list(self.low.defs) + sorted(ops.BUILTIN_NAMES) + list(dtypes.ALL)))

    def _arity(self, e: ast.Call, n: int) -> None:
        if e.kwargs:
            raise _err("E203", f"{e.func} takes no keyword arguments", e.kwarg_spans[next(iter(e.kwargs))])
        if len(e.args) != n:
            raise _err("E203", f"{e.func} takes {n} argument{'s' if n != 1 else ''}, got {len(e.args)}", self._span(e))

    def _inline(self, e: ast.Call, env) -> Value:
        d = self.low.defs[e.func]
        span = self._span(e)
        if any(name == d.name for name, _ in self.call_stack):
            raise _err("E210", f"'{d.name}' calls itself", span, "definitions are inlined, so they cannot recurse")
        names = [p.name for p in d.params]
        if len(e.args) > len(names):
            raise _err("E203", f"{d.name} takes {len(names)} argument{'s' if len(names) != 1 else ''}, got {len(e.args)}",
                       span, f"{d.name}({', '.join(names)})")
        bound: dict[str, Value] = {}
        for p, a in zip(d.params, e.args):
            bound[p.name] = self.expr(a, env)
        for key, a in e.kwargs.items():
            if key not in names:
                raise _err("E203", f"{d.name} has no parameter '{key}'", e.kwarg_spans[key], f"{d.name}({', '.join(names)})")
            if key in bound:
                raise _err("E203", f"argument '{key}' given twice", e.kwarg_spans[key])
            bound[key] = self.expr(a, env)
        self.call_stack.append((d.name, span))
        if len(self.call_stack) == 1:
            self.origins += 1
            self.origin = self.origins
        try:
            for p in d.params:
                if p.name not in bound:
                    if p.default is None:
                        raise _err("E203", f"{d.name} needs argument '{p.name}'", span, f"{d.name}({', '.join(names)})")
                    bound[p.name] = self.expr(p.default, {})
            local = dict(bound)
            for let in d.lets:
                if let.name in local:
                    raise _err("E202", f"'{let.name}' is assigned twice in '{d.name}'", let.span)
                local[let.name] = self.expr(let.expr, local)
            return self.expr(d.result, local)
        finally:
            self.call_stack.pop()
            if not self.call_stack:
                self.origin = None


def _suggest(name: str, candidates: list[str]) -> str | None:
    import difflib
    close = difflib.get_close_matches(name, candidates, n=1)
    return f"did you mean '{close[0]}'?" if close else None
