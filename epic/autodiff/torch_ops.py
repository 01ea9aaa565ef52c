"""A Differentiable's forward and backward as torch custom ops (torch.library), with the forward's
autograd formula registered (register_autograd), so that calls inside torch.compile'd code trace into
one graph: the fake kernels give the outputs' shapes from the inputs' (runtime/custom_op.py), and the
formula is the eager path's (function.py: incoming, feed, input_grads) around the backward op."""
from __future__ import annotations

import torch

from ..runtime import custom_op


def register(fn):
    """call(**args) -> the program's outputs by name, through the forward op."""
    forward = custom_op.register(fn.forward)
    backward = custom_op.register(fn.backward, run=fn.run_backward) if fn.backward is not None else None
    tensor_names = [t.name for t in fn.forward.inputs if not t.is_scalar]
    scalar_names = [t.name for t in fn.forward.inputs if t.is_scalar]
    out_names = [t.name for t in fn.forward.outputs]
    constants = [i for i, n in enumerate(out_names) if n in fn.outputs and n not in fn.derivation.upstream]

    def setup_context(ctx, inputs, output):
        tensors, scalars = inputs
        ctx.save_for_backward(*tensors, *output)
        ctx.scalars = scalars
        ctx.mark_non_differentiable(*(output[i] for i in constants))

    def formula(ctx, grads):
        saved = ctx.saved_tensors
        args = dict(zip(tensor_names, saved[:len(tensor_names)]))
        args.update(zip(scalar_names, ctx.scalars))
        outs = dict(zip(out_names, saved[len(tensor_names):]))
        incoming = fn.incoming(outs, dict(zip(out_names, grads)))
        got = backward(**fn.feed(args, outs, incoming)) if backward is not None else {}
        needed = dict(zip(tensor_names, ctx.needs_input_grad[0]))
        wanted = fn.input_grads({n: args[n] for n in tensor_names}, got, incoming, needed.get)
        # torch.library matches the inputs' structure: a scalar list is one leaf, an empty one a list
        return [wanted.get(n) for n in tensor_names], (None if scalar_names else [])

    torch.library.register_autograd(forward.op, formula, setup_context=setup_context)

    def call(**args) -> dict[str, torch.Tensor]:
        outs = forward(**args)
        return {n: outs[n] for n in fn.outputs}
    return call
