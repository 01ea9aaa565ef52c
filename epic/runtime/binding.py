"""Binding a program to one input signature: the plan at those sizes and the built libraries of its
kernels become the signature's Executable (runtime/executable.py), which both launch paths run."""
from __future__ import annotations

import torch

from .. import sizes as sizes_mod
from ..codegen import evt, vendor
from ..ir.core import Tensor
from ..plan import launch, planner
from . import derived, executable
from .executable import Executable, Launch


def scalar_values(scalar_inputs: list[Tensor], args: dict) -> dict[str, float]:
    """The runtime scalars of one call by name: the caller's value (checked), else the declared default.
    Every path that launches kernels binds its scalars here (CompiledProgram.__call__, run_sharded, and
    the tests' host simulator, so that a fault here shows on the CPU)."""
    return {t.name: sizes_mod.scalar_value(t, args.get(t.name)) for t in scalar_inputs}


def bind(plan: planner.Plan, libraries: list, device) -> Executable:
    """libraries: (spec, KernelLibrary) per launched kernel of the plan's program, in order (a combine
    kernel folded into its gemm has none). The table's entries first (input tensors, derived
    tensors, buffers), then the launches that point into it."""
    program, sizes = plan.program, plan.sizes
    host_step, allocations = derived.specs(program), plan.allocations()
    launches = []
    by_name = {spec.name: (spec, lib) for spec, lib in libraries}
    one_gemm = launch.has_one_gemm(program)
    for k in program.kernels:
        if k.name not in by_name:
            continue
        spec, lib = by_name[k.name]
        m, n = sizes_mod.evaluate(k.rows, sizes), sizes_mod.evaluate(k.n, sizes)
        if isinstance(spec, vendor.VendorGemmSpec):
            dims = [m, n, sizes_mod.evaluate(k.k, sizes)]
        elif isinstance(spec, evt.KernelSpec):
            cfg = plan.configs[k.name]
            dims = [m, n, sizes_mod.evaluate(k.k, sizes), cfg.swizzle, cfg.raster_code, cfg.splits,
                    launch.gemm_flags(bool(launches), m, cfg, one_gemm)]
        else:
            cfg = plan.configs[k.source]
            dims = [m, n, cfg.tile_m, cfg.tile_n]
        with torch.cuda.device(device):
            ws = lib.workspace_size(dims)
        launches.append(Launch(lib, [plan.storage(p.tensor) for p in spec.pointers], dims,
                               [float(sizes_mod.evaluate(s.dim, sizes)) if s.dim is not None else s.name
                                for s in spec.scalars], ws))
    return Executable(device, [t.name for t in program.inputs() if not t.is_scalar],
                      [t.name for t in program.inputs() if t.is_scalar], host_step, allocations,
                      launches, [t.name for t in program.outputs()], [b.name for b in allocations], plan)


def allocate(buffer: planner.Buffer, device, poison: bool) -> torch.Tensor:
    """A buffer of the plan on its own (run_sharded's), poisoned like a call's (executable.poison)."""
    x = torch.empty(buffer.shape, dtype=getattr(torch, buffer.torch_dtype), device=device)
    return executable.poison(x) if poison else x
