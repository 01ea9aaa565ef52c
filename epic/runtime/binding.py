"""Binding a program to one input signature: the plan at those sizes, the built libraries of its
kernels, and per kernel launch what it needs except the pointers (which change per call)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from .. import sizes as sizes_mod
from ..codegen import evt
from ..ir.core import Tensor
from ..plan import planner
from . import loader


@dataclass
class Launch:
    """One kernel launch of a bound plan: everything but the pointers is fixed by the signature."""
    library: loader.KernelLibrary
    pointer_tensors: list[str]          # tensor name per pointer ("" for an unused D)
    dims: list[int]
    scalars: list                       # floats (dimension sizes) or names of scalar inputs
    workspace: int

    def __post_init__(self):
        # ctypes arrays built once and refilled per call (building them costs microseconds)
        self.c_dims = (ctypes.c_longlong * len(self.dims))(*self.dims)
        self.c_ptrs = (ctypes.c_void_p * max(1, len(self.pointer_tensors)))()
        self.runtime_scalars = [(i, v) for i, v in enumerate(self.scalars) if isinstance(v, str)]
        self.c_scalars = (ctypes.c_float * max(1, len(self.scalars)))(
            *[0.0 if isinstance(v, str) else v for v in self.scalars])

    def run(self, buffers: dict, scalars: dict, stream: int, device) -> None:
        ptrs = self.c_ptrs
        for i, name in enumerate(self.pointer_tensors):
            ptrs[i] = buffers[name].data_ptr() if name else 0
        for i, name in self.runtime_scalars:
            self.c_scalars[i] = scalars[name]
        if self.workspace:
            ws = torch.empty(self.workspace, dtype=torch.uint8, device=device)
            self.library.launch(ptrs, self.c_dims, self.c_scalars, stream, ws.data_ptr(), self.workspace)
        else:
            self.library.launch(ptrs, self.c_dims, self.c_scalars, stream)


@dataclass
class Bound:
    """A program bound to one input signature (shapes, dtypes, strides, device)."""
    device: torch.device
    tensor_names: list[str]
    scalar_names: list[str]
    allocations: list[planner.Buffer]
    launches: list[Launch]
    outputs: list[str]
    keep: list[str]
    plan: planner.Plan


def scalar_values(scalar_inputs: list[Tensor], args: dict) -> dict[str, float]:
    """The runtime scalars of one call by name: the caller's value (checked), else the declared default.
    Every path that launches kernels binds its scalars here (CompiledProgram.__call__, run_sharded, and
    the tests' host simulator, so that a fault here shows on the CPU)."""
    return {t.name: sizes_mod.scalar_value(t, args.get(t.name)) for t in scalar_inputs}


def bind(plan: planner.Plan, libraries: list, device: torch.device) -> Bound:
    """libraries: (spec, KernelLibrary) per launched kernel of the plan's program, in order (a combine
    kernel folded into its gemm has none)."""
    program, sizes = plan.program, plan.sizes
    launches = []
    by_name = {spec.name: (spec, lib) for spec, lib in libraries}
    for k in program.kernels:
        if k.name not in by_name:
            continue
        spec, lib = by_name[k.name]
        m, n = sizes_mod.evaluate(k.rows, sizes), sizes_mod.evaluate(k.n, sizes)
        if isinstance(spec, evt.KernelSpec):
            cfg = plan.configs[k.name]
            dims = [m, n, sizes_mod.evaluate(k.k, sizes), cfg.swizzle, cfg.raster_code, cfg.splits]
        else:
            cfg = plan.configs[k.source]
            dims = [m, n, cfg.tile_m, cfg.tile_n]
        with torch.cuda.device(device):
            ws = lib.workspace_size(dims)
        launches.append(Launch(lib, [p.tensor for p in spec.pointers], dims,
                               [float(sizes_mod.evaluate(s.dim, sizes)) if s.dim is not None else s.name
                                for s in spec.scalars], ws))
    allocations = plan.allocations()
    return Bound(device, [t.name for t in program.inputs() if not t.is_scalar],
                 [t.name for t in program.inputs() if t.is_scalar], allocations, launches,
                 [t.name for t in program.outputs()], [b.name for b in allocations], plan)


def allocate(buffer: planner.Buffer, device, poison: bool) -> torch.Tensor:
    """A buffer of the plan; poisoned with NaN (a sentinel byte for integers) so unwritten elements show."""
    dtype = getattr(torch, buffer.torch_dtype)
    if not poison:
        return torch.empty(buffer.shape, dtype=dtype, device=device)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return torch.full(buffer.shape, float("nan"), dtype=dtype, device=device)
    out = torch.empty(buffer.shape, dtype=dtype, device=device)
    out.reshape(-1).view(torch.uint8).fill_(0x7F if not dtype.is_floating_point else 0xFF)   # fp8: a NaN pattern
    return out
