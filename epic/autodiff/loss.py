"""epic.autograd(path, policy="fused"): a loss head whose gradients are computed in its forward.

    head = epic.autograd("samples/cross_entropy.epi", policy="fused", chunk_rows=4096)
    total, outs = head(x=x, w=W.t(), label=label, d_loss=weights)   # weights: each row's share of the loss
    total.backward()                                                  # x.grad, W.grad

One program (autodiff/fused.py) computes the outputs and, with each output row's weight in the loss
given now (`d_<output>`, zeros where left out), the gradients of the inputs. `total` is
sum(weights * output) over every weighted output, a differentiable scalar: its backward multiplies the
gradients computed in the forward by the scalar's incoming gradient (1.0 for loss.backward()). For
a mean over n tokens pass weights 1/n (0 for ignored rows); the outputs themselves are constants.

With chunk_rows=N the program runs on N rows at a time (autodiff/chunks.py decides what is per row):
dlogits exist for N rows at once; per-row gradients are written into their rows, and a gradient that
sums over rows (dW) is carried from chunk to chunk: the later chunks run a variant of the program that
adds the sum so far in the dW gemm's epilogue (in the gradient's dtype, as an addmm into it would)
and writes the new sum over it (out=), so dW is in memory once.
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from .chunks import RowChunks, _rows
from .derive import derive_source


class FusedLoss:
    def __init__(self, path_or_source, wrt: list[str] | None = None, straight_through: bool = False,
                 config: dict | None = None, fallback: str = "never", chunk_rows: int | None = None):
        from ..runtime.compiled import compile as _compile
        self.derivation = d = derive_source(path_or_source, wrt, straight_through, policy="fused")
        self.program = _compile(d.forward_text, config, fallback)
        self.forward, self.backward = self.program, None     # as a Differentiable's: no backward program
        self.outputs = [t.name for t in d.program.outputs()]
        self.weights = dict(d.upstream)                # output -> the input that holds its rows' weights
        self.chunks = self.later = None
        self._overwrite: list[str] | None = None     # gradients the later chunks write over their sums
        if chunk_rows is not None:
            self.chunks = RowChunks(d.program, self.program.analysis.source_program, chunk_rows)
            # the variant for later chunks adds the earlier chunks' sums (dW) in its epilogues
            self.later_derivation = derive_source(path_or_source, wrt, straight_through, policy="fused",
                                                  accumulate=True)
            self.later = _compile(self.later_derivation.forward_text, config, fallback)
        from .torch_ops import register_fused
        self._op = register_fused(self)          # made here: torch.compile cannot trace a registration

    def __call__(self, **args) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(total, outputs): total = sum over weighted outputs of sum(weights * output), differentiable;
        outputs by name, constants."""
        unknown = set(args) - {t.name for t in self.program.inputs}
        if unknown:
            raise error("E601", f"no input named {', '.join(sorted(unknown))}", None,
                        "inputs: " + ", ".join(t.name for t in self.program.inputs))
        given = [o for o, name in self.weights.items() if name in args]
        if not given:
            raise error("E601", "no loss weights given: the gradient would be zero", None,
                        "pass " + " or ".join(f"{n}= (the weight of each row of '{o}')" for o, n in self.weights.items()))
        if torch.compiler.is_compiling():
            return self._compiled_call(args)
        names = list(args)
        values = _Fused.apply(self, names, *args.values())
        total, outs = values[0], dict(zip(self.outputs, values[1:]))
        return total, outs

    def _compiled_call(self, args: dict):
        """Inside torch.compile'd code: one custom op (autodiff/torch_ops.py), no graph break."""
        return self._op(args)

    def with_weights(self, args: dict) -> dict:
        """args with the weights left out filled with zeros."""
        feed = dict(args)
        for out, name in self.weights.items():
            if name not in feed:
                like = next(v for k, v in args.items() if isinstance(v, torch.Tensor) and v.dim() == 2)
                feed[name] = torch.zeros(like.shape[0], dtype=torch.float32, device=like.device)
        return feed

    def total(self, args: dict, got: dict) -> torch.Tensor:
        """sum(weights * output) over the weighted outputs, in f32."""
        return sum((got[o].float() * args[w].float()).sum() for o, w in self.weights.items() if w in args)

    def grad_of(self, name: str, like: torch.Tensor, got: dict) -> torch.Tensor:
        """Input `name`'s gradient from the program's outputs, in its dtype, as the program stores it
        (contiguous; `as_input` gives it the input's layout)."""
        return got[self.derivation.grads[name]].to(like.dtype)

    def as_input(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """A gradient grad_of gave, in the layout of input `name` (dW^T viewed as the K-major w)."""
        return g.t() if name in self.derivation.transposed_grads else g

    def run(self, args: dict) -> dict[str, torch.Tensor]:
        """The fused program on args, weights left out filled with zeros, over chunks of rows."""
        feed = self.with_weights(args)
        got = self.program(**feed) if self.chunks is None else self._run_chunks(feed)
        for g in self.derivation.grads.values():
            if g not in got and g in feed:
                got[g] = feed[g]          # a gradient that is an output's weights as they are (out y = z)
        return got

    def _run_chunks(self, feed: dict) -> dict[str, torch.Tensor]:
        """The program on chunk_rows rows at a time: per-row outputs written into their rows, each sum
        over rows carried from chunk to chunk into the later variant's NAME_sum input."""
        c = self.chunks
        m = next(feed[n].shape[0] for n in c.sliced if n in feed)
        if m <= c.rows:
            return self.program(**feed)
        out: dict[str, torch.Tensor] = {}
        sums = self.later_derivation.sums
        for start in range(0, m, c.rows):
            stop = min(start + c.rows, m)
            part_feed = {k: _rows(v, start, stop) if k in c.sliced else v for k, v in feed.items()}
            if start:
                part_feed.update({sums[g]: out[g] for g in sums})
                # each sum written over the one it adds to (dW once, not twice, in memory)
                part = self.later(**part_feed, out={g: out[g] for g in self._in_place_sums(part_feed)})
            else:
                part = self.program(**part_feed)
            for name, value in part.items():
                if name in c.per_row:
                    if name not in out:
                        out[name] = value.new_empty((m, *value.shape[1:]))
                    out[name][start:stop].copy_(value)
                else:
                    out[name] = value
            del part
        return out

    def _in_place_sums(self, feed: dict) -> list[str]:
        """The gradients the later chunks' program may write over their running sums (the dW gemm
        reads the sum only in its epilogue, at the position it stores: planner.overwrite_problem)."""
        if self._overwrite is None:
            from ..plan import planner
            from ..runtime.validate import solve
            prog = self.later.program
            sizes = solve(prog, {t.name: tuple(feed[t.name].shape) for t in prog.inputs()
                                 if not t.is_scalar and t.name in feed}, indexable=False)
            plan = self.later.plan(sizes)
            self._overwrite = [g for g, total in self.later_derivation.sums.items()
                               if planner.overwrite_problem(plan, g, total) is None]
        return self._overwrite


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: FusedLoss, names: list[str], *values):
        args = dict(zip(names, values))
        got = fn.run(args)
        total = fn.total(args, got)
        grads = [fn.grad_of(name, args[name], got) if name in fn.derivation.grads and isinstance(args[name], torch.Tensor)
                 else None for name in names]
        ctx.save_for_backward(*(g for g in grads if g is not None))
        ctx.fn, ctx.names = fn, names
        ctx.has = [g is not None for g in grads]
        outs = tuple(got[o] for o in fn.outputs)
        ctx.mark_non_differentiable(*outs)
        return (total, *outs)

    @staticmethod
    def backward(ctx, g_total, *_):
        saved = iter(ctx.saved_tensors)
        scale = scaling(g_total)
        return (None, None, *(ctx.fn.as_input(name, scaled(next(saved), scale)) if has else None
                              for name, has in zip(ctx.names, ctx.has)))


def scaling(g_total: torch.Tensor) -> torch.Tensor | None:
    """The factor the forward's gradients take: None for exactly 1 (loss.backward()), which an eager
    call checks on the host (one sync, as Liger's does, against a pass over dW); under CUDA graph
    capture or torch.compile it cannot look, and multiplies."""
    if not torch.compiler.is_compiling() and not (g_total.is_cuda and torch.cuda.is_current_stream_capturing()):
        if g_total.item() == 1.0:
            return None
    return g_total.to(torch.float32)


def scaled(g: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """g * scale, on the contiguous gradient (a vectorized pass; a 0-dim f32 factor keeps g's dtype)."""
    return g if scale is None else g * scale
