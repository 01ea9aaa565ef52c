"""A compiled program as a torch custom op (torch.library), usable inside torch.compile'd code: the
fake (meta) kernel derives output shapes from input shapes with integer arithmetic only, so it
works on symbolic sizes."""
from __future__ import annotations

import itertools

import torch

from .. import dtypes, layouts, sizes as sizes_mod

_COUNT = itertools.count(1)


def register(compiled, run=None):
    """compiled as a custom op; `run(**args) -> outputs` replaces calling it (a chunked backward: the
    outputs' shapes are the program's all the same)."""
    run = run or compiled
    tensor_inputs = [t for t in compiled.inputs if not t.is_scalar]
    scalar_inputs = [t for t in compiled.inputs if t.is_scalar]
    outputs = compiled.outputs
    name = f"epic::p{next(_COUNT)}"

    @torch.library.custom_op(name, mutates_args=())
    def op(tensors: list[torch.Tensor], scalars: list[float]) -> list[torch.Tensor]:
        args = {t.name: x for t, x in zip(tensor_inputs, tensors)}
        args.update({t.name: v for t, v in zip(scalar_inputs, scalars)})
        out = run(**args)
        return [out[t.name] for t in outputs]

    @op.register_fake
    def _(tensors, scalars):
        return fake_outputs(compiled, tensors)

    def call(**args):
        tensors = [args[t.name] for t in tensor_inputs]
        scalars = [float(args[t.name]) if args.get(t.name) is not None else float(t.default) for t in scalar_inputs]
        return dict(zip([t.name for t in outputs], op(tensors, scalars)))
    call.op = op
    return call


def fake_outputs(compiled, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Empty tensors shaped like the program's outputs for these tensor inputs (in the order of
    compiled.inputs' tensors), by integer arithmetic on their (possibly symbolic) sizes."""
    tensor_inputs = [t for t in compiled.inputs if not t.is_scalar]
    shapes = {t.name: tuple(x.shape) for t, x in zip(tensor_inputs, tensors)}
    sizes = sizes_mod.solve_integer(compiled.program, shapes)
    device = tensors[0].device
    out = []
    for t in compiled.outputs:
        dims = tuple(sizes_mod.evaluate_integer(d, sizes) for d in t.dims)
        if t.dtype in dtypes.PACKED:      # the plan's packed layout (epic/layouts.py)
            dims = layouts.packed_int4_shape(*dims)
        out.append(torch.empty(dims, dtype=getattr(torch, t.dtype.torch_name), device=device))
    return out
