"""The plan: the ordered kernels of a rewritten program at given sizes, with every buffer's shape,
dtype, bytes, and which kernel writes and reads it."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import sizes as sizes_mod
from ..checks import layout
from ..diagnostics import EpicError
from ..ir.core import Program, Tensor
from ..shapes import Kind
from . import config as config_mod


@dataclass
class Buffer:
    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    writer: str | None = None
    readers: list[str] = field(default_factory=list)


@dataclass
class Step:
    kernel: object
    config: config_mod.KernelConfig | None
    reads: list[str]
    writes: list[str]


@dataclass
class Plan:
    program: Program
    sizes: dict[str, int]
    steps: list[Step]
    buffers: dict[str, Buffer]
    configs: dict[str, config_mod.KernelConfig]

    def tiles(self) -> dict[str, tuple[int, int]]:
        """(tile M, tile N) of each gemm, for the reference interpreter's per-tile partials."""
        return {k: (c.tile_m, c.tile_n) for k, c in self.configs.items()}


def tensor_shape(t: Tensor, sizes: dict[str, int], configs: dict) -> tuple[int, ...]:
    dims = tuple(sizes_mod.evaluate(d, sizes) for d in t.dims)
    if t.tiles_axis:
        cfg = configs[t.producer]
        rows, width = dims
        dims = (rows, -(-width // cfg.tile_n)) if t.tiles_axis == "n" else (-(-rows // cfg.tile_m), width)
        if t.components == 2:
            dims += (2,)
    return dims


def tensor_bytes(t: Tensor, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return (n * t.dtype.bits + 7) // 8


def make_plan(program: Program, sizes: dict[str, int], overrides: dict[str, dict] | None = None) -> Plan:
    diags = layout.check_sizes(program, sizes)
    if diags:
        raise EpicError(diags)
    m = sizes_mod.evaluate(next(k.rows for k in program.kernels), sizes)
    configs = {k.name: config_mod.choose(k, m, (overrides or {}).get(k.name))
               for k in program.kernels if k.kind == "gemm"}
    buffers: dict[str, Buffer] = {}
    for t in program.tensors.values():
        shape = tensor_shape(t, sizes, configs)
        buffers[t.name] = Buffer(t.name, t.role, str(t.dtype), shape, tensor_bytes(t, shape), t.producer)
    steps = []
    for k in program.kernels:
        reads = []
        if k.kind == "gemm":
            reads += [k.a, k.b]
        reads += [v.attrs["tensor"] for v in k.values if v.op == "load" and v.kind is not Kind.SCALAR]
        reads += [v.attrs["buffer"] for v in k.values if v.op == "combine"]
        reads = list(dict.fromkeys(reads))
        writes = [s.tensor for s in k.stores]
        for r in reads:
            buffers[r].readers.append(k.name)
        steps.append(Step(k, configs.get(k.name), reads, writes))
    return Plan(program, sizes, steps, buffers, configs)
