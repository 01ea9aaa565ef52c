"""Gradients two ways on the float64 reference interpreter: torch.autograd through the forward
program's semantics, and the derived forward + backward programs run as programs. They must agree
(tests/test_grad.py); `epic grad --check` runs the same comparison for a user's program."""
from __future__ import annotations

import torch

from .. import reference, sizes as sizes_mod
from ..frontend.lower import load_program
from ..ir.core import Program
from .derive import Derivation

F64 = torch.float64


class _Tracked(reference.Interpreter):
    """The interpreter with its inputs kept in torch's autograd graph."""

    def input(self, t, x):
        return x if x.dtype == F64 else x.detach().to(F64)


def autograd_grads(program: Program, inputs: dict, upstream: dict, wrt: list[str],
                   sizes: dict | None = None) -> dict[str, torch.Tensor]:
    """d(sum over outputs of <upstream, output>) / d input, by torch.autograd on the reference."""
    leaves = {name: (x.detach().to(F64).requires_grad_(name in wrt) if x.is_floating_point() else x)
              for name, x in inputs.items()}
    shapes = {t.name: tuple(inputs[t.name].shape) for t in program.inputs() if not t.is_scalar}
    bound = sizes_mod.bind_from_tensors(program, shapes, sizes)
    outs = _Tracked(program, bound, exact=True).run(leaves)
    total = sum((outs[name] * g.to(F64)).sum() for name, g in upstream.items())
    got = torch.autograd.grad(total, [leaves[n] for n in wrt], allow_unused=True)
    return {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(wrt, got)}


def derived_grads(d: Derivation, inputs: dict, upstream: dict,
                  sizes: dict | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(outputs, gradients) by running the derived forward and backward programs on the interpreter."""
    fwd = load_program(d.forward_text, "<forward>", ".")
    if d.fused:                 # one program: the loss weights are inputs of the forward
        given = {**inputs, **{name: upstream[out] for out, name in d.upstream.items()}}
        got = reference.run(fwd, {t.name: given[t.name] for t in fwd.inputs() if t.name in given},
                            exact=True, sizes=sizes)
        return got, _gradients(d, got, given, inputs)
    outs = reference.run(fwd, inputs, exact=True, sizes=sizes)
    if not d.has_kernels:       # every gradient is an incoming one, passed on as it is
        return outs, {n: (upstream[_upstream_of(d, d.grads[n])] if n in d.grads else torch.zeros(inputs[n].shape,
                                                                                                  dtype=F64))
                      for n in d.wrt}
    bwd = load_program(d.backward_text, "<backward>", ".")
    feed = {}
    for t in bwd.inputs():
        if t.name in inputs:
            feed[t.name] = inputs[t.name]
        elif t.name in outs:
            feed[t.name] = outs[t.name]
        elif t.name in d.renamed_inputs:
            feed[t.name] = inputs[d.renamed_inputs[t.name]].t()
    for out, name in d.upstream.items():
        feed[name] = upstream[out]
    got = reference.run(bwd, feed, exact=True, sizes=sizes)
    return outs, _gradients(d, got, feed, inputs)


def _gradients(d: Derivation, got: dict, feed: dict, inputs: dict) -> dict[str, torch.Tensor]:
    grads = {}
    for name in d.wrt:
        if name in d.grads:
            g = got[d.grads[name]] if d.grads[name] in got else feed[d.grads[name]].to(F64)
            grads[name] = g.t() if name in d.transposed_grads else g
        else:
            grads[name] = torch.zeros(inputs[name].shape, dtype=F64)
    return grads


def compare(d: Derivation, sizes: dict[str, int], seed: int = 0) -> dict[str, float]:
    """Max |derived - autograd| / max |autograd| per input, on random float64 inputs of these sizes
    and a random upstream gradient for every differentiable output."""
    inputs = {k: (v.to(F64) if v.is_floating_point() else v)
              for k, v in reference.random_inputs(d.program, sizes, seed).items()}
    outs = reference.run(d.program, inputs, exact=True, sizes=sizes)
    g = torch.Generator().manual_seed(seed + 1)
    upstream = {o: torch.randn(outs[o].shape, generator=g, dtype=F64) for o in d.upstream}
    want = autograd_grads(d.program, inputs, upstream, d.wrt, sizes)
    _, got = derived_grads(d, inputs, upstream, sizes)
    return {n: ((want[n] - got[n]).abs().max() / want[n].abs().max().clamp_min(1e-300)).item() for n in d.wrt}


def _upstream_of(d: Derivation, backward_input: str) -> str:
    return next(out for out, name in d.upstream.items() if name == backward_input)
