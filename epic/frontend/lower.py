"""Syntax tree -> typed IR: definitions (with `use`), declarations, gemm operands and statements.

Errors here are E1xx/E2xx diagnostics at the user's span. Expressions and the inlining of `def`s
are in exprs.py, the `with` options in options.py, file reading in sources.py.
"""
from __future__ import annotations

import functools
import math
import os
from importlib import resources

from .. import dtypes
from ..diagnostics import Span, error
from ..ir import primitives as P
from ..ir import operands
from ..ir.core import GemmKernel, Program, Store, Tensor, Value, make, topo_order
from ..ir.typing import TypeRuleError, check_storable, depends_on_whole_reduce
from ..shapes import COL, SCALAR, Dim, Kind, Shape
from . import ast, options, sources
from .exprs import ExprLowering, suggest
from .parser import parse

# Internal buffers and kernels are named NAME__SUFFIX (epic's passes add such names): a user name
# may not contain a double underscore, so it can never alias one of them.
RESERVED_SEPARATOR = "__"


def _prelude_text() -> str:
    return resources.files("epic").joinpath("prelude.epi").read_text()


@functools.lru_cache(maxsize=1)
def _prelude() -> dict[str, ast.Def]:
    """The prelude's definitions by name. A call resolves to a def before a primitive, so a prelude
    def named like a built-in would silently replace it: that, like any other malformed prelude,
    is a bug in epic (E599), raised by every load until it is fixed."""
    defs: dict[str, ast.Def] = {}
    for d in parse(_prelude_text(), "<prelude>").items:
        why = ("holds something other than a def" if not isinstance(d, ast.Def) else
               f"defines '{d.name}' twice" if d.name in defs else
               f"defines '{d.name}', a built-in name" if is_builtin_name(d.name) else None)
        if why:
            raise error("E599", f"internal: epic's prelude {why} (a bug in epic)", d.span,
                        "report this: epic/prelude.epi must only add definitions under new names")
        defs[d.name] = d
    return defs


def is_builtin_name(name: str) -> bool:
    """A primitive's or reduction's function name, a keyword, a dtype or a reserved word."""
    return name in P.BUILTIN_NAMES or name in P.RESERVED or dtypes.lookup(name) is not None


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

    # ------------------------------------------------------------------ program
    def run(self) -> Program:
        self.defs.update(_prelude())
        user_defs: dict[str, ast.Def] = {}
        self._collect_defs(self.module, user_defs, set())
        self.defs.update(user_defs)
        for item in self.module.items:
            if isinstance(item, ast.InDecl):
                self.declare_input(item)
            elif isinstance(item, ast.Gemm):
                self.kernels.append(self._gemm(item))
        if not self.kernels:
            raise error("E213", "the program has no gemm", Span(self.module.source, 1, 1),
                        "a program is one or more `gemm NAME(A @ B) { ... }` blocks")
        return Program(self.module.source.name, self.tensors, self.kernels, list(self.dims))

    def _collect_defs(self, module: ast.Module, into: dict, visiting: set) -> None:
        """The definitions of a module and of what it imports, in the order a depth-first walk meets
        them; a `use` is relative to its own file. Keeps its own stack: a chain of a thousand
        libraries each using the next needs no Python recursion."""
        stack, done = [(iter(module.items), self.base_dir)], object()
        while stack:
            items, base_dir = stack[-1]
            item = next(items, done)
            if item is done:
                stack.pop()
            elif isinstance(item, ast.Use):
                path = item.path if os.path.isabs(item.path) else os.path.join(base_dir, item.path)
                key = os.path.abspath(path)
                if key in visiting:
                    continue
                visiting.add(key)
                sub = parse(sources.read_use(path, item.span), sources.printable(path))
                for it in sub.items:
                    if isinstance(it, (ast.Gemm, ast.InDecl)):
                        raise error("E202", f"'{item.path}' may only hold definitions (def) and use lines", it.span,
                                    "move gemms and inputs into the program that imports the library")
                stack.append((iter(sub.items), os.path.dirname(os.path.abspath(path))))
            elif isinstance(item, ast.Def):
                if item.name in into:
                    raise error("E202", f"'{item.name}' is defined twice", item.span,
                                "rename one of them (a file's own def of a prelude name is allowed once)",
                                notes=[(into[item.name].span, "first definition")])
                if is_builtin_name(item.name):
                    raise error("E202", f"'{item.name}' is a built-in name and cannot be redefined", item.span,
                                f"call the definition something else, e.g. my_{item.name}")
                seen: set[str] = set()
                for param in item.params:
                    if param.name in seen:
                        raise error("E202", f"'{item.name}' has two parameters named '{param.name}'", param.span,
                                    "give each parameter its own name")
                    seen.add(param.name)
                into[item.name] = item

    # ------------------------------------------------------------------ declarations
    def check_name(self, name: str, span: Span) -> None:
        if name in P.RESERVED or name in P.BUILTIN_NAMES:
            raise error("E202", f"'{name}' is a reserved name", span,
                        "built-in functions, dtypes and keywords cannot name values: pick another name")
        if RESERVED_SEPARATOR in name:
            raise error("E202", f"'{name}' contains '{RESERVED_SEPARATOR}', which epic keeps for the names of its "
                        "internal buffers and kernels", span, f"rename it, e.g. {_renamed(name)}")
        if name.endswith("_"):      # 'g_' + '__' + 'x' would be 'g' + '__' + '_x'
            raise error("E202", f"'{name}' ends with '_': epic names its internal buffers and kernels NAME__..., "
                        f"and '{name}{RESERVED_SEPARATOR}' would run into the separator", span,
                        f"rename it, e.g. {_renamed(name)}")

    def dim(self, d: ast.DimExpr) -> Dim:
        def atom(a: ast.DimAtom) -> Dim:
            if a.text.isdigit():
                if len(a.text) > 9:
                    raise error("E208", f"dimension {a.text[:20]} is too large", a.span,
                                "a literal dimension has at most 9 digits; name large ones (M, D)")
                return Dim.const(int(a.text))
            if not a.text.isidentifier() or a.text in P.RESERVED:
                raise error("E208", f"'{a.text}' is not a dimension", a.span,
                            "dimensions are names (M, D) or integers, e.g. [M, 2*D]")
            if a.text in self.tensors:
                raise error("E202", f"'{a.text}' names a tensor; dimensions need their own names", a.span,
                            "use a dimension name such as M, K or N")
            self.check_name(a.text, a.span)
            self.dims.setdefault(a.text, a.span)
            return Dim.of(a.text)

        out = atom(d.first)
        for op, a in d.rest:
            rhs = atom(a)
            if op == "*":
                out = out * rhs
            else:
                if rhs.names or rhs.coef == 0:
                    raise error("E208", "a dimension can only be divided by a positive integer", a.span,
                                "e.g. [M, N/128]")
                out = out / rhs
        if out.coef == 0:
            raise error("E208", "a dimension cannot be 0", d.span, "dimensions are positive: e.g. [M, 2*N]")
        return out

    def dtype(self, spec: ast.TypeSpec) -> dtypes.DType:
        dt = dtypes.lookup(spec.dtype)
        if dt is None or dt is dtypes.BOOL:
            raise error("E204", f"unknown dtype '{spec.dtype}'", spec.dtype_span,
                        "dtypes: " + ", ".join(n for n in dtypes.ALL if n != "bool"))
        return dt

    def new_tensor(self, name: str, span: Span, **kw) -> Tensor:
        self.check_name(name, span)
        if name in self.tensors:
            raise error("E202", f"'{name}' is declared twice", span, "rename one of them", notes=[(self.tensors[name].span, "first declared here")])
        if name in self.dims:
            raise error("E202", f"'{name}' already names a dimension", span,
                        "tensors and dimensions need different names (e.g. lower-case tensors, upper-case dimensions)")
        if any(k.name == name for k in self.kernels):
            raise error("E202", f"'{name}' already names a gemm", span, "gemms and tensors need different names")
        t = Tensor(name=name, span=span, **kw)
        self.tensors[name] = t
        return t

    def declare_input(self, d: ast.InDecl) -> Tensor:
        dt = self.dtype(d.type)
        dims = tuple(self.dim(x) for x in d.type.dims) if d.type.dims else ()
        if len(dims) > 2:
            raise error("E208", f"'{d.name}' has {len(dims)} dimensions; epilogue operands have at most 2", d.type.span,
                        "flatten it: a tile is [M, N], a vector [M] or [N]")
        if d.default is not None and dims:
            raise error("E208", "only scalars take a default value", d.span,
                        f"drop the default, or make it a scalar: in {d.name}: f32 = ...")
        if dims and dt in dtypes.PACKED:
            raise error("E205", f"{dt} inputs are not supported ({dt} is an output format)", d.type.dtype_span,
                        "pass it as i8" if dt is dtypes.I4 else "pass it as bf16 or e4m3")
        if d.default is not None and not math.isfinite(d.default):
            raise error("E212", f"the default of '{d.name}' must be a finite number", d.span, "e.g. = 1e-6")
        return self.new_tensor(d.name, d.span, dtype=dt, dims=dims, role="scalar" if not dims else "input",
                               default=d.default)

    def _operand(self, op: ast.Operand, which: str, b_major: str) -> Tensor:
        """The tensor an operand reads: declared here (with a type), or declared earlier (a name, or
        `name.T` for its transpose). How the gemm reads it: epic/ir/operands.py."""
        if op.type is not None:
            if op.type.dims is None or len(op.type.dims) != 2:
                raise error("E208", f"GEMM operand '{op.name}' needs two dimensions, e.g. {op.name}: bf16[M, K]",
                            op.type.span, "A is [M, K] and B is [K, N]")
            dt = self.dtype(op.type)
            t = self.new_tensor(op.name, op.span, dtype=dt, dims=tuple(self.dim(x) for x in op.type.dims),
                                role="input", layout="kmajor" if which == "B" and b_major == "k" else "row")
        else:
            t = self.tensors.get(op.name)
            shown = op.name + (".T" if op.transposed else "")
            if t is None:
                raise error("E201", f"unknown tensor '{op.name}'", op.span,
                            f"`{shown}` reads a tensor declared before this gemm (an `in`, an earlier gemm's operand "
                            "or out/tmp)" if op.transposed else
                            f"declare it here with a type, e.g. {op.name}: bf16[M, K], or store it in an earlier gemm")
            if len(t.dims) != 2 or t.block:
                raise error("E209", f"'{shown}' is a {t.describe()}, not a matrix", op.span,
                            "a GEMM operand is a 2-D tensor, e.g. an earlier `tmp x: bf16 = ...` tile")
        if t.dtype not in dtypes.GEMM_OPERAND:
            raise error("E205", f"GEMM operand '{op.name}' is {t.dtype}; the mainloop multiplies bf16, f16, e4m3, e5m2 "
                        "or i8 (int8 x int8 with an i32 accumulator)",
                        op.type.dtype_span if op.type else op.span,
                        "store the earlier result as bf16 (tmp x: bf16 = ...)" if t.role in ("out", "tmp") else None)
        if t.dtype.bits != 16 and not operands.k_major(which, t, op.transposed):
            raise error("E205", f"the {which} operand '{op.name}{'.T' if op.transposed else ''}' is {t.dtype} read "
                        f"{operands.major(which, t, op.transposed).upper()}-major (its K dimension is not contiguous); "
                        "Hopper's wgmma reads 8-bit operands K-major only", op.span,
                        "store it K-major (transposed) in the kernel that writes it, or use a 16-bit type (bf16, f16)")
        return t

    # ------------------------------------------------------------------ kernels
    def _gemm(self, g: ast.Gemm) -> GemmKernel:
        self.check_name(g.name, g.span)
        if any(k.name == g.name for k in self.kernels):
            raise error("E202", f"gemm '{g.name}' is defined twice", g.span, "give each gemm its own name")
        if g.name in self.tensors:
            raise error("E202", f"'{g.name}' already names a tensor", g.span, "gemms and tensors need different names")
        b_major = options.parse_value("b_major", *g.options["b_major"]) if "b_major" in g.options else "k"
        if b_major == "n" and g.b.type is None:
            raise error("E215", f"b_major applies to a B operand declared here with a type; '{g.b.name}' is read in "
                        "its own memory order", g.options["b_major"][1],
                        "drop b_major: an earlier result or a top-level `in` is read row-major (N-major) already")
        a = self._operand(g.a, "A", b_major)
        b = self._operand(g.b, "B", b_major)
        rows, k = a.dims[::-1] if g.a.transposed else a.dims
        k2, n = b.dims[::-1] if g.b.transposed else b.dims
        if k != k2:
            shown = [op.name + (".T" if op.transposed else "") for op in (g.a, g.b)]
            raise error("E209", f"inner dimensions differ: {shown[0]} is [{rows}, {k}] but {shown[1]} is [{k2}, {n}]",
                        g.b.span, "A[M, K] @ B[K, N]: the second dimension of A is the first of B"
                        + ("; `.T` swaps a tensor's two dimensions" if g.a.transposed or g.b.transposed else ""))
        if not _multipliable(a.dtype, b.dtype):
            raise error("E205", f"cannot multiply {a.dtype} by {b.dtype}", g.b.span,
                        "use the same 16-bit type on both sides, fp8 (e4m3/e5m2, mixed as well) on both, "
                        "or i8 on both")
        return _KernelBuilder(self, g, a, b, rows, k, n).build()


def _multipliable(a: dtypes.DType, b: dtypes.DType) -> bool:
    """Operand pairs the sm90 mainloop multiplies: the same 16-bit type, fp8 with fp8, i8 with i8."""
    if a.bits == 16 or b.bits == 16:
        return a is b
    return a.is_int == b.is_int


def _accumulator(a: Tensor, b: Tensor, asked: str | None, g: ast.Gemm) -> dtypes.DType:
    """The accumulator's type: f32; i32 for i8 x i8 (exact); f16 where the file asks and Hopper's wgmma
    has it (f16 x f16, fp8 x fp8: half the accumulator registers, rounded to f16 at every k-step)."""
    natural = dtypes.I32 if a.dtype.is_int else dtypes.F32
    if asked is None or asked == "f32" and natural is dtypes.F32:
        return natural
    span = g.options["accumulate"][1]
    if asked == "f32":
        raise error("E205", f"gemm '{g.name}' multiplies i8 by i8, which accumulates in i32 (exactly)", span,
                    "drop `accumulate=f32`")
    if a.dtype is dtypes.F16 or (a.dtype.bits == 8 and not a.dtype.is_int):
        return dtypes.F16
    raise error("E205", f"accumulate=f16 needs f16 x f16 or fp8 x fp8 operands; gemm '{g.name}' multiplies "
                f"{a.dtype} by {b.dtype}, which Hopper's wgmma accumulates in "
                f"{'i32' if a.dtype.is_int else 'f32'} only", span,
                "drop `accumulate=f16`, or give the gemm f16 operands")


class _KernelBuilder:
    """One gemm's epilogue: its statements in order, with the names they bind."""

    def __init__(self, low: Lowering, g: ast.Gemm, a: Tensor, b: Tensor, rows: Dim, k: Dim, n: Dim):
        self.low, self.g, self.a, self.b = low, g, a, b
        self.rows, self.k, self.n = rows, k, n
        self.loads: dict[str, Value] = {}
        self.env: dict[str, Value] = {}
        self.stores: list[Store] = []
        self.opts = options.parse(g.options, g.span)
        self.acc_dtype = _accumulator(a, b, self.opts.get("accumulate"), g)
        self.acc = make("acc", (), {} if self.acc_dtype is dtypes.F32 else {"dtype": self.acc_dtype}, g.span, "acc")
        self.exprs = ExprLowering(self)

    @property
    def defs(self) -> dict[str, ast.Def]:
        return self.low.defs

    def build(self) -> GemmKernel:
        opts = self.opts
        for stmt in self.g.body:
            if isinstance(stmt, ast.InDecl):
                self.low.declare_input(stmt)
            elif isinstance(stmt, ast.Let):
                self._bind(stmt.name, stmt.span)
                v = self.exprs.value(stmt.expr, self.env)
                if v.name is None:
                    v.name = stmt.name
                self.env[stmt.name] = v
            elif isinstance(stmt, ast.Store):
                self._store(stmt)
        if not self.stores:
            raise error("E213", f"gemm '{self.g.name}' stores nothing", self.g.span,
                        "add `out NAME: bf16 = acc` (returned) or `tmp NAME: bf16 = ...` (read by a later gemm)")
        values = topo_order([s.value for s in self.stores])
        return GemmKernel(self.g.name, self.a.name, self.b.name, self.rows, self.k, self.n, values,
                          self.stores, opts, self.g.span, acc=self.acc_dtype, a_t=self.g.a.transposed,
                          b_t=self.g.b.transposed)

    def _bind(self, name: str, span: Span) -> None:
        self.low.check_name(name, span)
        if name in self.env:
            raise error("E202", f"'{name}' is assigned twice", span, "values are immutable: pick a new name")
        if name in self.low.tensors or name in self.low.dims:
            raise error("E202", f"'{name}' already names a tensor or dimension", span, "pick a new name for the value")

    def _store(self, s: ast.Store) -> None:
        dt = self.low.dtype(s.type)
        v = self.exprs.value(s.expr, self.env)
        try:
            check_storable(dt, v.shape, v.kind is Kind.SCALAR and depends_on_whole_reduce(v))
        except TypeRuleError as e:
            raise error(e.code, f"'{s.name}': {e.message}", s.span, e.hint or "store it as bf16, f16 or f32") from None
        if v.dtype is dtypes.BOOL:
            raise error("E205", f"'{s.name}' is a comparison result (bool)", s.span, "store select(cond, 1, 0)")
        dims = v.shape.dims(self.rows, self.n)
        if s.type.dims is not None:
            declared = tuple(self.low.dim(d) for d in s.type.dims)
            if declared != dims:
                raise error("E208", f"'{s.name}' is declared [{', '.join(map(str, declared))}] but its value is "
                            f"a {v.shape.describe(self.rows, self.n)}", s.type.span,
                            f"declare it {s.type.dtype}[{', '.join(map(str, dims))}], or leave the dimensions out")
        if dt in dtypes.PACKED and v.shape.width.denominator != 1 and (v.shape.width * 2).denominator != 1:
            raise error("E405", f"'{s.name}': int4 packs column pairs and needs an even width", s.span,
                        "store an even number of columns, or store it as i8")
        self.low.new_tensor(s.name, s.span, dtype=dt, dims=dims, role=s.role, producer=self.g.name,
                            block=v.shape.block)
        if v.name is None:
            v.name = s.name
        self.stores.append(Store(s.name, v, s.span))

    # ------------------------------------------------------------------ the scope of expressions
    def resolve(self, name: str, span: Span) -> Value | None:
        """A name that is not a local value: the accumulator, a tensor, a dimension."""
        if name == "acc":
            return self.acc
        if name in self.low.tensors:
            return self._load(self.low.tensors[name], span)
        if name in self.low.dims:
            return make("dim", (), {"dim": Dim.of(name)}, span, name)
        return None

    def names(self) -> list[str]:
        return list(self.low.tensors) + ["acc"]

    def _load(self, t: Tensor, span: Span) -> Value:
        if t.name in self.loads:
            return self.loads[t.name]
        if t.producer == self.g.name:
            raise error("E201", f"'{t.name}' is stored by this gemm; refer to the value, not the tensor", span,
                        "bind it with a name first: h = ...; out y: bf16 = h; ... use h")
        attrs = {"tensor": t.name, "dtype": t.dtype, "shape": self._shape_of(t, span)}
        period = self._period_of(t)
        if period is not None:
            attrs["period"] = period
        v = make("load", (), attrs, span, t.name)
        self.loads[t.name] = v
        return v

    def _period_of(self, t: Tensor) -> Dim | None:
        """The length of a vector repeated along the row (a per-head [Dh] vector when N = H*Dh)."""
        if len(t.dims) != 1 or t.dims[0] == self.rows or t.dims[0].ratio(self.n) is not None:
            return None
        return t.dims[0] if periodic_quotient(self.n, t.dims[0]) is not None else None

    def _shape_of(self, t: Tensor, span: Span) -> Shape:
        if not t.dims:
            return SCALAR
        here = f"this gemm's accumulator is [{self.rows}, {self.n}]"
        if len(t.dims) == 1:
            (d,) = t.dims
            is_col = d == self.rows
            r = d.ratio(self.n)
            if is_col and r is not None:
                raise error("E214", f"'{t.name}' [{d}] could be a row or a column vector: M and N have the same name",
                            span, "give the rows and the columns different dimension names")
            if is_col:
                return COL
            if r is not None:
                return Shape(Kind.ROW, r)
            if self._period_of(t) is not None:
                return Shape(Kind.ROW)     # repeated along the row: one copy per head
            raise error("E208", f"'{t.name}' is [{d}], which matches neither rows nor columns; {here}", span,
                        f"a column vector is [{self.rows}] (one value per row), a row vector [{self.n}]; a vector "
                        f"repeated along the row (one per head) is over a factor of the columns: write the columns "
                        f"as a product, e.g. [D, H*{d}], for a [{d}] vector")
        d0, d1 = t.dims
        r = d1.ratio(self.n)
        if d0 != self.rows or r is None:
            raise error("E208", f"'{t.name}' is [{d0}, {d1}], which does not line up with the tile; {here}", span,
                        "extra tiles must be [M, N] (or [M, 2*N] / [M, N/2] for pairwise maps)")
        if t.block:
            return Shape(Kind.BLOCK, r * t.block, t.block)
        return Shape(Kind.TILE, r)


def periodic_quotient(n: Dim, d: Dim) -> Dim | None:
    """N / d when a [d] vector repeats a whole number of times along N's columns (N = H*Dh, d = Dh:
    H copies, a per-head vector); None otherwise. Symbolic: the quotient names a dimension, so it is
    a whole number for every size."""
    rest = list(n.names)
    for x in d.names:
        if x not in rest:
            return None
        rest.remove(x)
    if not rest or d.coef == 0 or (n.coef / d.coef).denominator != 1:
        return None
    return Dim(n.coef / d.coef, tuple(rest))


def _renamed(name: str) -> str:
    """A name without '__' and without a trailing '_' (for hints)."""
    while "__" in name:
        name = name.replace("__", "_")
    return name.rstrip("_") or "x"


__all__ = ["load_program", "Lowering", "suggest"]
