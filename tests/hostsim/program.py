"""A compiled program whose kernels run on the host: the part of CompiledProgram that code driving a
program from outside uses (epic.distributed.run_sharded: `program`, `inputs`, a call with keep=True,
the bound plans `_bound`, `_bind`), with each signature's kernels generated, compiled for the host
(compiler.py) and bound by the runtime's own binding.bind and binding.scalar_values, on CPU tensors.

    prog = HostProgram("samples/cross_entropy.epi", config_m=64)
    out = prog(x=x, w=w.t(), label=label)       # the heuristic's configuration for M = config_m
"""
from __future__ import annotations

import torch

from epic import sizes as sizes_mod
from epic.runtime import binding

from . import compiler, harness

CPU = torch.device("cpu")


class HostProgram:
    def __init__(self, path: str, config_m: int):
        self.path, self.config_m = path, config_m
        compiled = harness.compiled(path)
        self.program = compiled.program
        self.inputs = compiled.inputs
        self._bound: dict[tuple, binding.Bound] = {}     # sizes -> bound plan, as CompiledProgram keeps them

    def _bind(self, sizes: dict[str, int], device=CPU) -> binding.Bound:
        assert torch.device(device) == CPU, device
        case = harness.prepare(self.path, sizes, self.config_m)
        bound = binding.bind(case.plan, harness.libraries(case), -1)
        bound.device = CPU
        return bound

    def __call__(self, keep: bool = False, **args) -> dict[str, torch.Tensor]:
        shapes = {k: tuple(v.shape) for k, v in args.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        sizes = sizes_mod.bind_from_tensors(self.program, shapes)
        key = tuple(sorted(sizes.items()))
        if key not in self._bound:
            self._bound[key] = self._bind(sizes)
        bound = self._bound[key]
        scalars = binding.scalar_values([t for t in self.program.inputs() if t.is_scalar], args)
        buffers = {n: args[n] for n in bound.tensor_names}
        for b in bound.allocations:
            buffers[b.name] = binding.allocate(b, CPU, poison=True)
        for launch in bound.launches:
            launch.run(buffers, scalars, 0, CPU)
        return {n: buffers[n] for n in (bound.keep if keep else bound.outputs)}
