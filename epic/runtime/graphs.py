"""CompiledProgram.capture: one call of a program recorded as a CUDA graph and replayed without host
work per kernel (no Python, no signature matching, no launch calls: one cudaGraphLaunch).

    g = prog.capture(x=x, wo=wo, z=z, gamma=gamma)   # warms up, records one call
    out = g(x=next_x)        # copies next_x into the recorded x, replays; or update g.inputs in place
    out = g()                # replays on whatever the recorded input tensors hold now

The graph holds the device pointers of the call it recorded: its inputs are those tensors (the
caller's own), its outputs the tensors it allocated then, rewritten by every replay (clone what
must outlive the next one). A replay therefore takes only tensors of the recorded shapes, dtypes,
strides and device, and the recorded scalar values (they are baked into the kernels' arguments);
anything else is E609 before the graph runs. Tensors derived from weights (LayerNorm's gamma @ W,
runtime/derived.py) are computed inside the recorded region: each replay recomputes them from what the
recorded weights hold then.
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from ..sizes import not_dense, scalar_value
from .validate import validate

_HINT = "capture again for other shapes, dtypes or scalar values (prog.capture(**inputs))"


class Captured:
    """A recorded call of a CompiledProgram (see the module docstring)."""

    def __init__(self, program, keep: bool, args: dict):
        # refusals (E601-E607: names, dtypes, shapes, strides, alignment, a CPU tensor) before any launch
        tensors, self._scalars, device, _ = validate(program.program, args)
        self._declared = {t.name: t for t in program.program.inputs() if t.is_scalar}
        self.inputs: dict[str, torch.Tensor] = dict(tensors)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):          # build, bind and warm up outside the capture
            program(keep=keep, **args)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs: dict[str, torch.Tensor] = program(keep=keep, **args)

    def __call__(self, **args) -> dict[str, torch.Tensor]:
        """Copy the given tensors into the recorded inputs, replay, return the recorded outputs."""
        updates = []
        for name, value in args.items():
            if name in self._declared:
                if scalar_value(self._declared[name], value) != self._scalars[name]:
                    raise error("E609", f"scalar '{name}' was {self._scalars[name]!r} when the graph was recorded, "
                                f"got {value!r}: the recorded kernels hold the old value", None, _HINT)
                continue
            target = self.inputs.get(name)
            if target is None:
                raise error("E609", f"the captured program has no input tensor named {name!r}", None,
                            "its inputs are " + ", ".join(sorted([*self.inputs, *self._scalars])))
            if not isinstance(value, torch.Tensor):
                raise error("E609", f"'{name}' must be a tensor, got {type(value).__name__}", None, _HINT)
            kind = not_dense(value)             # its shape or strides would throw
            if kind:
                raise error("E609", f"'{name}' is a {kind} tensor; the graph was recorded with a dense one", None,
                            f"pass a dense tensor ({name}.to_dense()); {_HINT}")
            recorded = (target.shape, target.dtype, target.device, target.stride())
            given = (value.shape, value.dtype, value.device, value.stride())
            if given != recorded:
                raise error("E609", f"'{name}' was recorded as {_describe(*recorded)}, got {_describe(*given)}",
                            None, _HINT)
            if value.data_ptr() != target.data_ptr():
                updates.append((target, value))
        for target, value in updates:         # all checked first: a refused call changes nothing
            target.copy_(value)
        self.graph.replay()
        return self.outputs


def _describe(shape, dtype, device, stride) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(shape)} strides {list(stride)} on {device}"
