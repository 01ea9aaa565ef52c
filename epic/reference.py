"""The reference interpreter: what a program means, on torch CPU tensors in float64.

This is the single definition of every primitive's semantics. Passes are proven against it and
generated kernels are tested against it. Two modes:

  exact=True   float64 everywhere; stored floating-point values are not rounded (integer casts and
               integer stores still round, since they cannot hold fractions)
  exact=False  every stored value and every explicit cast is rounded to its dtype, as kernels do

Representation of a value of a kernel with accumulator [M, N] (W = width * N):
  TILE [M, W], ROW [1, W], COL [M, 1], BLOCK(B) [M, ceil(W/B)], SCALAR [] (0-d).
"""
from __future__ import annotations

import math

import torch

from . import sizes as sizes_mod
from .diagnostics import Diagnostic, EpicError
from .dtypes import DType
from .ir.core import GemmKernel, Program, Value
from .shapes import Kind

F64 = torch.float64


# ---------------------------------------------------------------------------------------- rounding
def round_to(x: torch.Tensor, dt: DType, exact: bool) -> torch.Tensor:
    """x (float64) rounded to dtype dt, returned as float64 (bool tensors pass through)."""
    if x.dtype == torch.bool:
        return x
    if dt.is_int:
        y = torch.round(x)   # half to even
        return torch.clamp(y, dt.min_finite, dt.max_finite)
    if exact:
        return x
    if dt.max_finite is not None:   # fp8: saturate, then round to nearest even
        x = torch.clamp(x, dt.min_finite, dt.max_finite)
    return x.to(getattr(torch, dt.torch_name)).to(F64)


# ---------------------------------------------------------------------------------------- evaluation
class Interpreter:
    def __init__(self, program: Program, sizes: dict[str, int], exact: bool = True,
                 tiles: dict[str, tuple[int, int]] | None = None):
        self.program = program
        self.sizes = sizes
        self.exact = exact
        # tile (rows, columns) of each gemm: only the per-tile partials of a rewritten program see it
        self.tiles = tiles or {}
        self.store: dict[str, torch.Tensor] = {}
        self.kernel = None

    def run(self, inputs: dict[str, torch.Tensor], override: dict[str, torch.Tensor] | None = None
            ) -> dict[str, torch.Tensor]:
        """override: tensors to use instead of what a kernel stores (e.g. a GPU kernel's intermediate
        results, so that each later kernel is checked on exactly the inputs it saw)."""
        for t in self.program.inputs():
            if t.is_scalar:
                if t.name in inputs:
                    self.store[t.name] = torch.as_tensor(inputs[t.name], dtype=F64)
                elif t.default is not None:
                    self.store[t.name] = torch.tensor(t.default, dtype=F64)
                else:
                    raise EpicError(Diagnostic("E601", f"missing scalar '{t.name}'", t.span))
            else:
                if t.name not in inputs:
                    raise EpicError(Diagnostic("E601", f"missing tensor '{t.name}'", t.span))
                self.store[t.name] = inputs[t.name].detach().to("cpu", F64)
        for k in self.program.kernels:
            run_kernel = getattr(self, f"_run_{k.kind}")
            run_kernel(k)
            for s in k.stores:
                if override and s.tensor in override:
                    self.store[s.tensor] = override[s.tensor].detach().to("cpu", F64)
        return {t.name: self.store[t.name] for t in self.program.outputs()}

    def _n(self, k) -> int:
        return sizes_mod.evaluate(k.n, self.sizes)

    def _rows(self, k) -> int:
        return sizes_mod.evaluate(k.rows, self.sizes)

    def _run_gemm(self, k: GemmKernel) -> None:
        a, b = self.store[k.a], self.store[k.b]
        acc = a @ b
        self._epilogue(k, {"acc": acc})

    def _run_combine(self, k) -> None:
        self._epilogue(k, {})

    def _epilogue(self, k, seed: dict) -> None:
        self.kernel = k
        env: dict[int, torch.Tensor] = {}
        m, n = self._rows(k), self._n(k)
        for v in k.values:
            env[v.id] = self.eval_value(v, [env[a.id] for a in v.args], m, n, seed)
        for s in k.stores:
            t = self.program.tensors[s.tensor]
            x = self._materialize(env[s.value.id], s.value, m, n)
            self.store[s.tensor] = round_to(x, t.dtype, self.exact)

    def _materialize(self, x: torch.Tensor, v: Value, m: int, n: int) -> torch.Tensor:
        """A stored value as its tensor: COL -> [M], ROW -> [W], TILE/BLOCK as they are."""
        kind = v.kind
        if kind is Kind.PARTIAL:
            return x.clone()
        if kind is Kind.COL:
            return x.expand(m, 1).reshape(m).clone()
        if kind is Kind.ROW:
            return x.reshape(-1).clone()
        return x.clone()

    # ------------------------------------------------------------------------------ one value
    def eval_value(self, v: Value, args: list, m: int, n: int, seed: dict) -> torch.Tensor:
        op, a = v.op, v.attrs
        if op == "acc":
            return seed["acc"]
        if op == "load":
            x = self.store[a["tensor"]]
            kind = v.kind
            if kind is Kind.COL:
                return x.reshape(m, 1)
            if kind is Kind.ROW:
                return x.reshape(1, -1)
            return x
        if op == "const":
            return torch.tensor(float(a["value"]), dtype=F64)
        if op == "dim":
            return torch.tensor(float(sizes_mod.evaluate(a["dim"], self.sizes)), dtype=F64)
        if op == "row_index":
            return torch.arange(m, dtype=F64).reshape(m, 1)
        if op == "col_index":
            return torch.arange(n, dtype=F64).reshape(1, n)
        if op in _UNARY:
            return _UNARY[op](args[0], a)
        if op in _BINARY or op in _COMPARE:
            x, y = _align(args[0], v.args[0], args[1], v.args[1])
            return (_BINARY.get(op) or _COMPARE[op])(x, y)
        if op == "select":
            c, x, y = args
            vs = v.args
            c, x = _align(c, vs[0], x, vs[1])
            c, y = _align(c, vs[0], y, vs[2])
            x, y = _align(x, vs[1], y, vs[2])
            return torch.where(c, x, y)
        if op == "cast":
            return round_to(args[0], a["to"], self.exact)
        if op in ("even", "odd"):
            x = args[0]
            self._check_even(x.shape[-1], v)
            return x[..., 0::2] if op == "even" else x[..., 1::2]
        if op == "interleave":
            x, y = _align(args[0], v.args[0], args[1], v.args[1])
            x, y = torch.broadcast_tensors(x, y)
            return torch.stack((x, y), dim=-1).flatten(-2)
        if op == "reduce":
            return _reduce(args[0], a["axis"], a["fn"])
        if op == "block_reduce":
            return _block_reduce(args[0], a["fn"], a["block"])
        extra = getattr(self, f"_op_{op}", None)
        if extra is None:
            raise NotImplementedError(f"reference: no semantics for op '{op}'")
        return extra(v, args, m, n)

    # ------------------------------------------------------------------ ops made by split-reductions
    def _tile(self) -> tuple[int, int]:
        k = self.kernel
        if k.name in self.tiles:
            return self.tiles[k.name]
        tile = k.options.get("tile") if hasattr(k, "options") else None
        return (tile[0], tile[1]) if tile else (128, 128)

    def _op_partial(self, v: Value, args: list, m: int, n: int) -> torch.Tensor:
        """Per-tile partial results: [M, tiles along N] for a row reduction, [tiles along M, W] for a
        column reduction; log-sum-exp partials carry a last dimension (max, sum of exp(x - max))."""
        x = args[0].expand(m, -1) if args[0].shape[0] == 1 else args[0]
        axis, fn = v.attrs["axis"], v.attrs["fn"]
        tm, tn = self._tile()
        if axis == "col":
            x = x.t()
        size = tn if axis == "row" else tm
        rows, width = x.shape
        tiles = -(-width // size)
        pad = tiles * size - width
        fill = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "lse": -math.inf, "min": math.inf}[fn]
        if pad:
            x = torch.cat((x, torch.full((rows, pad), fill, dtype=x.dtype)), dim=1)
        x = x.reshape(rows, tiles, size)
        if fn in ("sum", "mean"):
            out = x.sum(-1)
        elif fn == "max":
            out = x.amax(-1)
        elif fn == "min":
            out = x.amin(-1)
        else:
            mx = x.amax(-1)
            out = torch.stack((mx, torch.exp(x - mx.unsqueeze(-1)).sum(-1)), dim=-1)
        return out.transpose(0, 1) if axis == "col" else out

    def _op_combine(self, v: Value, args: list, m: int, n: int) -> torch.Tensor:
        """Merge the partials of every tile (in tile order, deterministically)."""
        part = self.store[v.attrs["buffer"]]
        axis, fn = v.attrs["axis"], v.attrs["fn"]
        dim = 1 if axis == "row" else 0
        if fn in ("sum", "mean"):
            out = part.sum(dim, keepdim=True)
            if fn == "mean":
                out = out / float(sizes_mod.evaluate(v.attrs["width"], self.sizes))
        elif fn == "max":
            out = part.amax(dim, keepdim=True)
        elif fn == "min":
            out = part.amin(dim, keepdim=True)
        else:
            mx, se = part[..., 0], part[..., 1]
            big = mx.amax(dim, keepdim=True)
            out = big + torch.log((se * torch.exp(mx - big)).sum(dim, keepdim=True))
        return out

    def _check_even(self, width: int, v: Value) -> None:
        if width % 2:
            raise EpicError(Diagnostic("E401", f"{v.op} pairs adjacent columns, but the width here is {width} (odd)",
                                       v.span, "pairwise maps need an even number of columns"))


def _expand_block(x: torch.Tensor, v: Value, width: int) -> torch.Tensor:
    return x.repeat_interleave(v.shape.block, dim=1)[:, :width]


def _align(x, vx: Value, y, vy: Value):
    """Broadcast a BLOCK operand to columns when the other side has per-column values."""
    if vx.kind is Kind.BLOCK and vy.kind in (Kind.TILE, Kind.ROW):
        x = _expand_block(x, vx, y.shape[-1])
    elif vy.kind is Kind.BLOCK and vx.kind in (Kind.TILE, Kind.ROW):
        y = _expand_block(y, vy, x.shape[-1])
    return x, y


_UNARY = {
    "neg": lambda x, a: -x,
    "abs": lambda x, a: x.abs(),
    "exp": lambda x, a: x.exp(),
    "log": lambda x, a: x.log(),
    "sqrt": lambda x, a: x.sqrt(),
    "rsqrt": lambda x, a: x.rsqrt(),
    "tanh": lambda x, a: x.tanh(),
    "erf": lambda x, a: torch.erf(x),
    "sin": lambda x, a: x.sin(),
    "cos": lambda x, a: x.cos(),
    "round": lambda x, a: torch.round(x),
    "powi": lambda x, a: x ** a["exp"] if a["exp"] >= 0 else 1.0 / x ** (-a["exp"]),
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "min": torch.minimum, "max": torch.maximum,
}
_COMPARE = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


def _reduce(x: torch.Tensor, axis: str, fn: str) -> torch.Tensor:
    dim = 1 if axis == "row" else 0
    if fn == "sum":
        return x.sum(dim, keepdim=True)
    if fn == "mean":
        return x.mean(dim, keepdim=True)
    if fn == "max":
        return x.amax(dim, keepdim=True)
    if fn == "min":
        return x.amin(dim, keepdim=True)
    if fn == "lse":
        return torch.logsumexp(x, dim, keepdim=True)
    raise NotImplementedError(fn)


_PAD = {"sum": 0.0, "max": -math.inf, "min": math.inf}


def _block_reduce(x: torch.Tensor, fn: str, block: int) -> torch.Tensor:
    m, w = x.shape
    nb = -(-w // block)
    pad = nb * block - w
    if pad:
        x = torch.cat((x, torch.full((m, pad), _PAD[fn], dtype=x.dtype)), dim=1)
    x = x.reshape(m, nb, block)
    return {"sum": lambda: x.sum(-1), "max": lambda: x.amax(-1), "min": lambda: x.amin(-1)}[fn]()


# ---------------------------------------------------------------------------------------- entry points
def run(program: Program, inputs: dict[str, torch.Tensor], exact: bool = True,
        sizes: dict[str, int] | None = None, tiles: dict[str, tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
    """Execute `program` on `inputs` (name -> tensor); returns every `out` tensor as float64."""
    shapes = {k: tuple(v.shape) for k, v in inputs.items() if hasattr(v, "shape") and v.dim() > 0}
    bound = sizes_mod.bind_from_tensors(program, shapes, sizes)
    sizes_mod.check_complete(program, bound)
    return Interpreter(program, bound, exact, tiles).run(inputs)


def random_inputs(program: Program, sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs of the declared dtypes: activations ~ N(0,1), B operands scaled by 1/sqrt(K),
    integer vectors (labels, positions) uniform in [0, N) of the kernel that reads them."""
    g = torch.Generator().manual_seed(seed)
    b_operands = {k.b: k for k in program.kernels if k.kind == "gemm"}
    narrowest = min(sizes_mod.evaluate(k.n, sizes) for k in program.kernels if k.kind == "gemm")
    out: dict[str, torch.Tensor] = {}
    for t in program.inputs():
        if t.is_scalar:
            if t.default is None:
                out[t.name] = torch.tensor(0.5 + torch.rand((), generator=g).item(), dtype=torch.float32)
            continue
        shape = tuple(sizes_mod.evaluate(d, sizes) for d in t.dims)
        if t.dtype.is_int:
            hi = min(narrowest, int(t.dtype.max_finite) + 1)
            x = torch.randint(0, hi, shape, generator=g, dtype=torch.int64)
        else:
            x = torch.randn(shape, generator=g, dtype=F64)
            if t.name in b_operands:
                x = x / math.sqrt(shape[0])
            if t.dtype.max_finite is not None:
                x = x.clamp(t.dtype.min_finite, t.dtype.max_finite)
        out[t.name] = x.to(getattr(torch, t.dtype.torch_name))
    return out
