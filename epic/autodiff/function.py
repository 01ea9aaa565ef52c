"""An epic program as a differentiable function: its forward runs the derived forward program (which
also stores what the backward reads) and its backward runs the derived backward program, both
compiled like any program (fused kernels on the GPU, or the unfused torch form with fallback=...).

    f = epic.autograd("samples/swiglu.epi")
    y = f(x=x, wgu=w.t())["y"]
    y.float().sum().backward()       # x.grad, w.grad
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from .derive import Derivation, derive_source


class Differentiable:
    def __init__(self, path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
                 config: dict | None = None, fallback: str = "never"):
        from ..runtime.compiled import compile as _compile
        self.derivation: Derivation = derive_source(path_or_source, wrt, straight_through)
        d = self.derivation
        self.forward = _compile(d.forward_text, config, fallback)
        self.backward = _compile(d.backward_text, config, fallback) if d.has_kernels else None
        self.outputs = [t.name for t in d.program.outputs()]

    def __call__(self, **args) -> dict[str, torch.Tensor]:
        """The program's outputs by name; those with a gradient (f32/bf16/f16 ones that depend on the
        inputs) take part in autograd, the others (quantized ones, block scales) are constants."""
        names = list(args)
        values = _Function.apply(self, names, *args.values())
        return dict(zip(self.outputs, values))


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Differentiable, names: list[str], *values):
        args = dict(zip(names, values))
        outs = fn.forward(**args)
        d = fn.derivation
        ctx.fn, ctx.names = fn, names
        saved = {k: v for k, v in outs.items() if k not in fn.outputs}
        ctx.save_for_backward(*values, *saved.values())
        ctx.saved_names = list(saved)
        ctx.outputs = {k: outs[k] for k in d.upstream}
        result = tuple(outs[k] for k in fn.outputs)
        ctx.mark_non_differentiable(*(outs[k] for k in fn.outputs if k not in d.upstream))
        return result

    @staticmethod
    def backward(ctx, *grads):
        fn: Differentiable = ctx.fn
        d = fn.derivation
        tensors = ctx.saved_tensors
        args = dict(zip(ctx.names, tensors[:len(ctx.names)]))
        saved = dict(zip(ctx.saved_names, tensors[len(ctx.names):]))
        incoming = {}
        for name, g in zip(fn.outputs, grads):
            if name in d.upstream:
                out = ctx.outputs[name]
                incoming[d.upstream[name]] = (g if g is not None else torch.zeros_like(out)).to(out.dtype).contiguous()
        if fn.backward is not None:
            feed = {}
            for t in (x.name for x in fn.backward.analysis.source_program.inputs()):
                if t in incoming:
                    feed[t] = incoming[t]
                elif t in saved:
                    feed[t] = saved[t]
                elif t in d.renamed_inputs:
                    feed[t] = args[d.renamed_inputs[t]].t()
                elif t in args:
                    feed[t] = args[t]
                elif fn.backward.analysis.source_program.tensors[t].role == "scalar":
                    continue                  # a scalar the caller left at its default
                else:
                    raise error("E599", f"internal: the backward program reads '{t}', which nothing provides")
            got = fn.backward(**feed)
        else:
            got = {}
        out = []
        for name in ctx.names:
            g = None
            if name in d.grads and ctx.needs_input_grad[2 + ctx.names.index(name)]:
                src = d.grads[name]
                g = got[src] if src in got else incoming[src]
                if name in d.transposed_grads:
                    g = g.t()
                g = g.to(args[name].dtype)
            out.append(g)
        return (None, None, *out)


def autograd(path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
             config: dict | None = None, fallback: str = "never") -> Differentiable:
    return Differentiable(path_or_source, wrt, straight_through, config, fallback)
