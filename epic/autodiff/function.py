"""An epic program as a differentiable function: its forward runs the derived forward program (which
also stores what the backward reads) and its backward runs the derived backward program, both
compiled like any program (fused kernels on the GPU, or the unfused torch form with fallback=...).

    f = epic.autograd("samples/swiglu.epi")
    y = f(x=x, wgu=w.t())["y"]
    y.float().sum().backward()       # x.grad, w.grad

Eager calls go through a torch.autograd.Function; inside torch.compile'd code the same forward and
backward run as torch custom ops (autodiff/torch_ops.py), so the graph does not break. With
chunk_rows=N the backward runs on N rows at a time (autodiff/chunks.py).
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from .chunks import RowChunks
from .derive import Derivation, derive_source


class Differentiable:
    def __init__(self, path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
                 config: dict | None = None, fallback: str = "never", chunk_rows: int | None = None,
                 policy: str = "save"):
        from ..runtime.compiled import compile as _compile
        from . import torch_ops
        self.derivation: Derivation = derive_source(path_or_source, wrt, straight_through, policy=policy)
        d = self.derivation
        self.forward = _compile(d.forward_text, config, fallback)
        self.backward = _compile(d.backward_text, config, fallback) if d.has_kernels else None
        self.outputs = [t.name for t in d.program.outputs()]
        self.chunks = None
        if chunk_rows is not None:
            if self.backward is None:
                RowChunks._check_rows(chunk_rows)
            else:
                self.chunks = RowChunks(d.program, self.backward.analysis.source_program, chunk_rows)
        self._op = torch_ops.register(self)      # made here: torch.compile cannot trace a registration

    def __call__(self, **args) -> dict[str, torch.Tensor]:
        """The program's outputs by name; those with a gradient (f32/bf16/f16 ones that depend on the
        inputs) take part in autograd, the others (quantized ones, block scales) are constants."""
        if torch.compiler.is_compiling():
            return self._op(**args)
        names = list(args)
        values = _Function.apply(self, names, *args.values())
        return dict(zip(self.outputs, values))

    def peak_extra_bytes(self, sizes: dict[str, int]) -> int:
        """Bytes the backward allocates at these sizes besides the gradients it returns: its
        intermediates (cross entropy's dlogits [M, V]) for one chunk of rows, and with chunk_rows, one
        chunk's per-row gradients and each summed gradient's partial (dW) while it is added up."""
        if self.backward is None:
            return 0
        whole = self.backward.plan(sizes)
        if self.chunks is None or self.chunks.rows >= int(sizes[self.chunks.dim.names[0]]):
            return sum(b.nbytes for b in whole.allocations() if b.role != "out")
        part = self.backward.plan(self.chunks.chunk_sizes(sizes))
        return sum(b.nbytes for b in part.allocations() if b.role != "out" or b.name in self.chunks.per_row) \
            + sum(whole.buffers[n].nbytes for n in self.chunks.summed)

    # ------------------------------------------------------------------ the backward, shared by both paths
    def run_backward(self, **feed) -> dict[str, torch.Tensor]:
        """The backward program on `feed` (its inputs), over chunks of rows with chunk_rows."""
        if self.chunks is not None:
            return self.chunks.run(self.backward, feed)
        return self.backward(**feed)

    def incoming(self, outs: dict, grads: dict) -> dict[str, torch.Tensor]:
        """The backward's gradient inputs from the forward outputs' gradients (zeros where none came)."""
        d = self.derivation
        got = {}
        for name, g in grads.items():
            if name in d.upstream:
                out = outs[name]
                got[d.upstream[name]] = (g if g is not None else torch.zeros_like(out)).to(out.dtype).contiguous()
        return got

    def feed(self, args: dict, saved: dict, incoming: dict) -> dict:
        """What the backward program reads: incoming gradients, saved tensors and the forward's inputs."""
        d = self.derivation
        program = self.backward.analysis.source_program
        feed = {}
        for t in (x.name for x in program.inputs()):
            if t in incoming:
                feed[t] = incoming[t]
            elif t in saved:
                feed[t] = saved[t]
            elif t in d.renamed_inputs:
                feed[t] = args[d.renamed_inputs[t]].t()
            elif t in args:
                feed[t] = args[t]
            elif program.tensors[t].role == "scalar":
                continue                  # a scalar the caller left at its default
            else:
                raise error("E599", f"internal: the backward program reads '{t}', which nothing provides")
        return feed

    def input_grads(self, args: dict, got: dict, incoming: dict, needed) -> dict[str, torch.Tensor]:
        """The gradient of each input `needed(name)` says is wanted, in that input's layout and dtype."""
        d = self.derivation
        out = {}
        for name in args:
            if name in d.grads and needed(name):
                src = d.grads[name]
                g = got[src] if src in got else incoming[src]
                if name in d.transposed_grads:
                    g = g.t()
                out[name] = g.to(args[name].dtype)
        return out


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Differentiable, names: list[str], *values):
        args = dict(zip(names, values))
        outs = fn.forward(**args)
        d = fn.derivation
        ctx.fn, ctx.names = fn, names
        saved = {k: v for k, v in outs.items() if k not in fn.outputs}
        ctx.tensor_names = [n for n, v in args.items() if isinstance(v, torch.Tensor)]
        ctx.scalars = {n: v for n, v in args.items() if not isinstance(v, torch.Tensor)}   # eps=1e-5
        ctx.save_for_backward(*(args[n] for n in ctx.tensor_names), *saved.values())
        ctx.saved_names = list(saved)
        ctx.outputs = {k: outs[k] for k in d.upstream}
        result = tuple(outs[k] for k in fn.outputs)
        ctx.mark_non_differentiable(*(outs[k] for k in fn.outputs if k not in d.upstream))
        return result

    @staticmethod
    def backward(ctx, *grads):
        fn: Differentiable = ctx.fn
        tensors = ctx.saved_tensors
        count = len(ctx.tensor_names)
        args = {**dict(zip(ctx.tensor_names, tensors[:count])), **ctx.scalars}
        saved = dict(zip(ctx.saved_names, tensors[count:]))
        incoming = fn.incoming(ctx.outputs, dict(zip(fn.outputs, grads)))
        got = fn.run_backward(**fn.feed(args, saved, incoming)) if fn.backward is not None else {}
        wanted = fn.input_grads({n: args[n] for n in ctx.tensor_names}, got, incoming,
                                lambda n: ctx.needs_input_grad[2 + ctx.names.index(n)])
        return (None, None, *(wanted.get(n) for n in ctx.names))


def autograd(path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
             config: dict | None = None, fallback: str = "never", chunk_rows: int | None = None,
             policy: str = "save") -> Differentiable:
    """A differentiable function of a program (see the module docstring); chunk_rows=N runs the backward
    on N rows at a time (peak_extra_bytes(sizes) says what that saves). policy="fused": a loss head
    computing its gradients in the forward (autodiff/loss.py)."""
    if policy == "fused":
        from .loss import FusedLoss
        return FusedLoss(path_or_source, wrt, straight_through, config, fallback, chunk_rows)
    return Differentiable(path_or_source, wrt, straight_through, config, fallback, chunk_rows, policy)
