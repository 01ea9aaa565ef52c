"""A Differentiable's forward and backward as torch custom ops (torch.library), with the forward's
autograd formula registered (register_autograd), so that calls inside torch.compile'd code trace into
one graph: the fake kernels give the outputs' shapes from the inputs' (runtime/custom_op.py), and the
formula is the eager path's (function.py: incoming, feed, input_grads) around the backward op."""
from __future__ import annotations

import itertools

import torch

from ..runtime import custom_op

_FUSED = itertools.count(1)


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


def register_fused(fn):
    """A FusedLoss (policy "fused") as one custom op returning the total, the program's outputs and the
    gradients it computed; its autograd formula scales those gradients by the total's incoming one.
    call(args) -> (total, outputs)."""
    compiled = fn.program
    tensor_names = [t.name for t in compiled.inputs if not t.is_scalar]
    out_names = [t.name for t in compiled.outputs]
    wrt = [n for n in tensor_names if n in fn.derivation.grads]
    name = f"epic::fused{next(_FUSED)}"

    @torch.library.custom_op(name, mutates_args=())
    def op(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        args = dict(zip(tensor_names, tensors))
        got = fn.run(args)
        return [fn.total(args, got)] + [got[n] for n in out_names]

    @op.register_fake
    def _(tensors):
        return [tensors[0].new_empty((), dtype=torch.float32)] + custom_op.fake_outputs(compiled, tensors)

    def setup_context(ctx, inputs, output):
        (tensors,) = inputs
        args = dict(zip(tensor_names, tensors))
        got = dict(zip(out_names, output[1:]))
        ctx.save_for_backward(*(fn.grad_of(n, args[n], got) for n in wrt))
        ctx.mark_non_differentiable(*output[1:])

    def formula(ctx, grads):
        scale = grads[0].to(torch.float32)        # traced: no look at its value (loss.py: scaling)
        saved = dict(zip(wrt, ctx.saved_tensors))
        return ([fn.as_input(n, saved[n] * scale) if n in saved else None for n in tensor_names],)

    torch.library.register_autograd(op, formula, setup_context=setup_context)

    def call(args: dict):
        feed = fn.with_weights(args)
        values = op([feed[n] for n in tensor_names])
        outs = dict(zip(out_names, values[1:]))
        return values[0], {n: outs[n] for n in fn.outputs}
    return call

