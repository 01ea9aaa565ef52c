"""The reference interpreter: what a program means, on torch CPU tensors in float64.

Each primitive's semantics is its record's `ref` (epic/ir/primitives.py); this module evaluates a
program's kernels in order with them. Passes are proven against it and generated kernels are
tested against it. Two modes:

  exact=True   float64 everywhere; stored floating-point values are not rounded, but casts and
               stores to fp8 and integer types still saturate to their finite range, and integer
               ones round (an integer cannot hold a fraction)
  exact=False  every stored value and every explicit cast is rounded to its dtype, as kernels do

Representation of a value of a kernel with accumulator [M, N] (W = width * N):
  TILE [M, W], ROW [1, W], COL [M, 1], BLOCK(B) [M, ceil(W/B)], SCALAR [] (0-d),
  PARTIAL: the buffer layout of epic/layouts.py (what the kernels write).
"""
from __future__ import annotations

import math

import torch

from . import dtypes, layouts, sizes as sizes_mod
from .diagnostics import error
from .dtypes import DType
from .ir import operands, primitives as P
from .ir.core import Program, Value
from .shapes import Kind

F64 = torch.float64
_ALIGNED = (P.Family.ELEMENTWISE, P.Family.COMPARE, P.Family.SELECT, P.Family.PAIR)


def round_to(x: torch.Tensor, dt: DType, exact: bool) -> torch.Tensor:
    """x (float64) as dtype dt would hold it, returned as float64 (bool tensors pass through).
    Saturating types clamp in both modes; exact mode keeps the mantissa of floats."""
    if x.dtype == torch.bool:
        return x
    if dt is dtypes.E8M0:     # only powers of two: rounded in both modes
        return round_e8m0(x if exact else x.float().double())
    if dt is dtypes.E2M1:     # no NaN: it becomes +6 in both modes
        x = torch.clamp(torch.nan_to_num(x, nan=6.0), -6.0, 6.0)
        return x if exact else round_e2m1(x.float().double())
    if dt.is_int:   # round half to even and saturate; NaN becomes 0 (as the GPU's cvt.sat does)
        return torch.clamp(torch.round(torch.nan_to_num(x, nan=0.0)), dt.min_finite, dt.max_finite)
    if dt.max_finite is not None:   # fp8: saturate (nan stays nan)
        x = torch.clamp(x, dt.min_finite, dt.max_finite)
    if exact:
        return x
    return x.to(getattr(torch, dt.torch_name)).to(x.dtype)


def round_e8m0(x: torch.Tensor) -> torch.Tensor:
    """|x| rounded up to a power of two in [2**-127, 2**127] (0 -> 2**-127, inf -> 2**127); NaN stays
    NaN: CUDA's float -> __nv_fp8_e8m0 conversion (cvt.rp.satfinite)."""
    m, e = torch.frexp(x.abs())              # |x| = m * 2**e, m in [0.5, 1)
    up = torch.where(m == 0.5, e - 1, e).to(x.dtype)
    p = torch.exp2(torch.clamp(up, -127.0, 127.0))
    p = torch.where(x == 0, torch.full_like(x, 2.0**-127), p)
    p = torch.where(torch.isinf(x), torch.full_like(x, 2.0**127), p)
    return torch.where(torch.isnan(x), x, p)


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)     # the magnitude of codes 0..7


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """x (finite, within +-6) rounded to the nearest e2m1 value, ties to the even code; the sign of
    zero is kept."""
    grid = torch.tensor(E2M1_VALUES, dtype=x.dtype, device=x.device)
    dist = (x.abs().unsqueeze(-1) - grid).abs()
    best = dist.amin(-1, keepdim=True)
    odd = torch.arange(8, device=x.device) % 2 == 1
    code = torch.where(dist == best, odd.to(x.dtype), 2.0).argmin(-1)     # a tie picks the even code
    return torch.copysign(grid[code], x)


def pack_e2m1(values: torch.Tensor) -> torch.Tensor:
    """e2m1 values [..., N] (already rounded) as the packed bytes [..., N/2] kernels store."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=values.device)
    v = values.to(torch.float64)
    code = (v.abs().unsqueeze(-1) == grid).to(torch.int16).argmax(-1) | (torch.signbit(v).to(torch.int16) << 3)
    return (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """A packed e2m1 output (uint8 [M, N/2], low nibble = even column) as its values [M, N] (float32)."""
    p = packed.to(torch.int16)
    codes = torch.stack((p & 0xF, (p >> 4) & 0xF), dim=-1).flatten(-2)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    mag = grid[(codes & 7).long()]
    return torch.where(codes >= 8, -mag, mag)


class Interpreter:
    """Evaluates a program; also the context that primitives' `ref` functions read (sizes, the
    accumulator, tensors, the tile of partials). A subclass may compute in another dtype on another
    device (epic/runtime/unfused.py: the program as eager torch ops on the GPU)."""

    dtype = F64          # what values are computed in
    device = "cpu"

    def __init__(self, program: Program, sizes: dict[str, int], exact: bool = True,
                 tiles: dict[str, tuple[int, int]] | None = None):
        self.program = program
        self.sizes = sizes
        self.exact = exact
        # tile (rows, columns) of each gemm: only the per-tile partials of a rewritten program see it
        self.tiles = tiles or {}
        self.store: dict[str, torch.Tensor] = {}
        self.kernel = None
        self.seed: dict = {}
        self.m = self.n = 0
        self.tile_n_of: dict[str, int] = {}      # a row partial buffer -> the width of its tiles

    def run(self, inputs: dict[str, torch.Tensor], override: dict[str, torch.Tensor] | None = None
            ) -> dict[str, torch.Tensor]:
        """override: tensors to use instead of what a kernel stores (e.g. a GPU kernel's intermediate
        results, so that each later kernel is checked on exactly the inputs it saw)."""
        for t in self.program.inputs():
            if t.is_scalar:
                self.store[t.name] = self.scalar(t, inputs.get(t.name))
            else:
                self.store[t.name] = self.input(t, inputs.get(t.name))
        for t in self.program.tensors.values():
            if t.role == "derived":
                self.store[t.name] = self.derived(t)
        for k in self.program.kernels:
            self.kernel = k
            self.m, self.n = sizes_mod.evaluate(k.rows, self.sizes), sizes_mod.evaluate(k.n, self.sizes)
            self.seed = {"acc": self.matmul(k)} if k.kind == "gemm" else {}
            self._epilogue(k)
            for s in k.stores:
                if override and s.tensor in override:
                    self.store[s.tensor] = override[s.tensor].detach().to(self.device, self.dtype)
        return {t.name: self.store[t.name] for t in self.program.outputs()}

    def _epilogue(self, k) -> None:
        env: dict[int, torch.Tensor] = {}
        for v in k.values:
            env[v.id] = self.eval_value(v, [env[a.id] for a in v.args])
        for s in k.stores:
            t = self.program.tensors[s.tensor]
            x = _materialize(env[s.value.id], s.value, self.m)
            self.store[s.tensor] = round_to(x, t.dtype, self.exact)

    def eval_value(self, v: Value, args: list) -> torch.Tensor:
        p = P.prim(v.op)
        if p.context:
            return p.ref(self, v, args)
        if p.family in _ALIGNED:
            args = _aligned(v, args)
        return p.ref(args, v.attrs)

    def constant(self, value: float) -> torch.Tensor:
        """A literal number as a 0-d tensor."""
        return torch.tensor(value, dtype=self.dtype, device=self.device)

    def scalar(self, t, x) -> torch.Tensor:
        """A scalar argument (or its default) as a 0-d tensor."""
        return self.constant(sizes_mod.scalar_value(t, x, finite=False))

    def input(self, t, x) -> torch.Tensor:
        """A tensor argument as the interpreter holds it (float64 on the CPU)."""
        return _tensor_input(t, x)

    def derived(self, t) -> torch.Tensor:
        """A tensor a pass derived from weights (role "derived"): the product of its row vectors (ones
        when there are none) @ its matrix, as the runtime computes it before the kernels."""
        vectors, matrix = t.derived
        w = self.store[matrix]
        v = torch.ones(w.shape[0], dtype=w.dtype, device=w.device)
        for name in vectors:
            v = v * self.store[name].reshape(-1)
        return round_to(v @ w, t.dtype, self.exact)

    def matmul(self, k) -> torch.Tensor:
        """A gemm's exact product A @ B (an operand written `name.T` is that tensor transposed)."""
        return operands.logical(self.store[k.a], k.a_t) @ operands.logical(self.store[k.b], k.b_t)

    # ------------------------------------------------------------------ the context refs read
    def accumulator(self) -> torch.Tensor:
        """A @ B; with an f16 accumulator (accumulate=f16) rounded to f16 as the kernels' last step
        rounds it (they also round at every k-step: the tests' tolerance covers that)."""
        acc = self.seed["acc"]
        if self.kernel.acc is dtypes.F16:
            acc = round_to(acc, dtypes.F16, self.exact)
        return acc

    def load(self, v: Value) -> torch.Tensor:
        x = self.store[v.attrs["tensor"]]
        if v.kind is Kind.COL:
            return x.reshape(self.m, 1)
        if v.kind is Kind.ROW and "period" in v.attrs:     # a per-head vector: one copy per head
            return x.reshape(1, -1).repeat(1, self.n // x.numel())
        if v.kind is Kind.ROW:
            return x.reshape(1, -1)
        return x

    def dim_value(self, dim) -> torch.Tensor:
        return self.constant(float(sizes_mod.evaluate(dim, self.sizes)))

    def coordinate(self, axis: str) -> torch.Tensor:
        if axis == "row":
            return torch.arange(self.m, dtype=self.dtype, device=self.device).reshape(self.m, 1)
        return torch.arange(self.n, dtype=self.dtype, device=self.device).reshape(1, self.n)

    def round(self, x: torch.Tensor, dt: DType) -> torch.Tensor:
        return round_to(x, dt, self.exact)

    def pair_part(self, v: Value, x: torch.Tensor, part: int) -> torch.Tensor:
        if x.shape[-1] % 2:
            raise error("E401", f"{v.op} pairs adjacent columns, but the width here is {x.shape[-1]} (odd)",
                        v.span, "pairwise maps need an even number of columns")
        return x[..., part::2]

    def reduce(self, v: Value, x: torch.Tensor) -> torch.Tensor:
        r = P.reduction(v.attrs["fn"])
        out = r.ref(x, 1 if v.attrs["axis"] == "row" else 0)
        return out.reshape(()) if v.kind is Kind.SCALAR else out     # a whole-tensor reduction's last step

    def block_reduce(self, v: Value, x: torch.Tensor) -> torch.Tensor:
        r, block = P.reduction(v.attrs["fn"]), v.attrs["block"]
        x = self._pre(r, x)
        m, w = x.shape
        nb = -(-w // block)
        if nb * block > w:
            x = torch.cat((x, torch.full((m, nb * block - w), r.identity, dtype=x.dtype, device=x.device)), dim=1)
        return r.ref_partial(x.reshape(m, nb, block))

    def tile(self) -> tuple[int, int]:
        k = self.kernel
        if k.name in self.tiles:
            return self.tiles[k.name]
        tile = k.options.get("tile") if hasattr(k, "options") else None
        return (tile[0], tile[1]) if tile else (128, 128)

    def partial(self, v: Value, x: torch.Tensor) -> torch.Tensor:
        """Per-tile partials in the buffer layout of epic/layouts.py: the reduction's partial over each
        tile's valid elements; padding entries hold the identity."""
        r, axis = P.reduction(v.attrs["fn"]), v.attrs["axis"]
        x = self._pre(r, x.expand(self.m, -1) if x.shape[0] == 1 else x)
        rows, width = x.shape
        tm, tn = self.tile()
        lanes, size = (x, tn) if axis == "row" else (x.t(), tm)   # reduce along the last dimension
        self.tile_n_of[v.attrs["buffer"]] = tn
        count, length = lanes.shape
        tiles = -(-length // size)
        if tiles * size > length:
            fill = torch.full((count, tiles * size - length), r.identity, dtype=x.dtype, device=x.device)
            lanes = torch.cat((lanes, fill), dim=1)
        part = r.ref_partial(lanes.reshape(count, tiles, size)).transpose(0, 1)     # [tiles, count]
        out = torch.full(layouts.partial_shape(axis, rows, width, tm, tn), r.identity, dtype=self.dtype,
                         device=self.device)
        out[:, :count] = part
        return out

    def combine(self, v: Value) -> torch.Tensor:
        """Merge the partials of every tile (in tile order, deterministically)."""
        r = P.reduction(v.attrs["fn"])
        if v.attrs["axis"] == "all":             # one value per row or column -> one number
            return r.ref(self.store[v.attrs["buffer"]].reshape(1, -1), 1).reshape(())
        count = self.m if v.attrs["axis"] == "row" else int(self.n * v.attrs["of_width"])
        part = self.store[v.attrs["buffer"]][:, :count]
        if "pick" in v.attrs:       # split-reductions' claim: only the tile of column L[m] holds a nonzero sum
            label = self.store[v.attrs["pick"]].reshape(-1)[:count].to(torch.int64)
            inside = (label >= 0) & (label < self.n)
            tile = torch.where(inside, label // self.tile_n_of[v.attrs["buffer"]], 0)
            picked = part[tile, torch.arange(count, device=part.device)]
            return torch.where(inside, picked, torch.zeros_like(picked)).reshape(count, 1)
        out = r.ref_merge(part, 0)                   # [1, count]
        if r.by_width:
            out = out / float(sizes_mod.evaluate(v.attrs["width"], self.sizes))
        return out.t() if v.attrs["axis"] == "row" else out

    def _pre(self, r: P.Reduction, x: torch.Tensor) -> torch.Tensor:
        return P.prim(r.pre).ref([x], {}) if r.pre else x


def _tensor_input(t, x) -> torch.Tensor:
    """A tensor argument as float64 on the CPU, or a diagnostic saying what is wrong with it."""
    if x is None:
        raise error("E601", f"missing tensor '{t.name}' ({t.describe()})", t.span, f"pass {t.name}=<a tensor>")
    if not isinstance(x, torch.Tensor):
        raise error("E601", f"'{t.name}' must be a torch.Tensor, got {type(x).__name__}", t.span,
                    f"pass a tensor of {t.describe()}, e.g. torch.as_tensor({t.name})")
    if x.is_complex() or x.is_meta or sizes_mod.not_dense(x):
        what = "complex" if x.is_complex() else "meta" if x.is_meta else sizes_mod.not_dense(x)
        raise error("E603", f"'{t.name}' is a {what} tensor; the reference runs on real, dense tensors", t.span,
                    f"pass a real tensor of {t.describe()}")
    return x.detach().to("cpu", F64)


def _materialize(x: torch.Tensor, v: Value, m: int) -> torch.Tensor:
    """A stored value as its tensor: COL -> [M], ROW -> [W], TILE/BLOCK/PARTIAL as they are."""
    if v.kind is Kind.COL:
        return x.expand(m, 1).reshape(m).clone()
    if v.kind is Kind.ROW:
        return x.reshape(-1).clone()
    return x.clone()


def _aligned(v: Value, xs: list) -> list:
    """Operands of an element-wise op as tensors that broadcast: a BLOCK operand meeting per-column
    values is expanded to one value per column."""
    width = next((x.shape[-1] for x, a in zip(xs, v.args) if a.kind in (Kind.TILE, Kind.ROW)), None)
    if width is None:
        return xs
    return [x.repeat_interleave(a.shape.block, dim=1)[:, :width] if a.kind is Kind.BLOCK else x
            for x, a in zip(xs, v.args)]


# ---------------------------------------------------------------------------------------- entry points
def run(program: Program, inputs: dict[str, torch.Tensor], exact: bool = True,
        sizes: dict[str, int] | None = None, tiles: dict[str, tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
    """Execute `program` on `inputs` (name -> tensor); returns every `out` tensor as float64."""
    sizes_mod.check_names(program, inputs)
    for t in program.inputs():          # a scalar or a tensor of the wrong type, before shapes are read
        if t.is_scalar:
            sizes_mod.scalar_value(t, inputs.get(t.name), finite=False)
        elif t.name in inputs:
            _tensor_input(t, inputs[t.name])
    shapes = {t.name: tuple(inputs[t.name].shape) for t in program.inputs() if not t.is_scalar and t.name in inputs}
    bound = sizes_mod.bind_from_tensors(program, shapes, sizes)
    sizes_mod.check_complete(program, bound)
    return Interpreter(program, bound, exact, tiles).run(inputs)


def random_inputs(program: Program, sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs of the declared dtypes: activations ~ N(0,1), B operands scaled by 1/sqrt(K),
    integer vectors (labels, positions) uniform in [0, N) of the kernel that reads them."""
    g = torch.Generator().manual_seed(seed)
    # each B operand's reduction dimension (its first, or its second when read transposed)
    b_operands = {k.b: int(k.b_t) for k in program.kernels if k.kind == "gemm"}
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
                x = x / math.sqrt(shape[b_operands[t.name]])
            if t.dtype.max_finite is not None:
                x = x.clamp(t.dtype.min_finite, t.dtype.max_finite)
        out[t.name] = x.to(getattr(torch, t.dtype.torch_name))
    return out


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """A packed i4 output (uint8 [M, N/2], low nibble = even column) as its values [M, N] (int8)."""
    p = packed.to(torch.int16)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    vals = torch.stack((lo, hi), dim=-1).flatten(-2)
    return torch.where(vals >= 8, vals - 16, vals).to(torch.int8)
