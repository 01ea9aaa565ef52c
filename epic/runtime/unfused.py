"""The unfused torch form of a program: what it computes, as one eager torch op per primitive on the
caller's device. It is the baseline fusion has to beat (`epic tune` times it, eager and compiled,
next to the fused kernels) and the path a program falls back to where the tuning database says
fusion loses (epic.compile(..., fallback="auto")), or always (fallback="always", which also runs
without a GPU).

Same meaning as the kernels: the source program (before epic's rewrites) through the reference
interpreter's primitive semantics, computed in float32; a gemm's product with an f32 accumulator (on
CUDA, cuBLAS's bf16/f16 GEMM with an f32 output, `torch.mm(..., out_dtype=torch.float32)`; elsewhere
an f32 matmul) and every stored value rounded to its dtype. Outputs come back as the compiled program
returns them (i4 packed two per byte). The compiled form traces that eager computation once per
shape signature into one graph of aten ops (make_fx: the interpreter's Python runs at trace time
only) and hands it to torch.compile; scalars stay graph inputs.
"""
from __future__ import annotations

import struct
import threading

import torch

from .. import dtypes, reference
from ..diagnostics import EpicError, error
from ..frontend.sources import printable
from ..ir import operands
from ..ir.core import Program
from .validate import validate

F32 = torch.float32
_MM_OUT_DTYPE = (torch.bfloat16, torch.float16)     # operand types cuBLAS multiplies into an f32 output


class UnfusedInterpreter(reference.Interpreter):
    dtype = F32

    def __init__(self, program: Program, sizes: dict[str, int], device, constants: dict | None = None):
        super().__init__(program, sizes, exact=False)
        self.device = device
        self.native: dict[str, torch.Tensor] = {}     # gemm operands in the type the caller gave them
        self.constants = {} if constants is None else constants

    def constant(self, value: float) -> torch.Tensor:
        """Literals, sizes and scalar values as 0-d tensors on the device, made once per Unfused: a
        fresh one per call would be a host-to-device copy, which waits for the stream every time."""
        key = (struct.pack("<d", value), str(self.device))
        x = self.constants.get(key)
        if x is None:
            if len(self.constants) >= 1024:           # scalars that change every call: do not grow forever
                self.constants.clear()
            x = self.constants[key] = torch.tensor(value, dtype=F32, device=self.device)
        return x

    def scalar(self, t, x) -> torch.Tensor:
        if isinstance(x, torch.Tensor):               # a traced graph's scalar input
            return x.to(F32)
        return super().scalar(t, x)

    def input(self, t, x) -> torch.Tensor:
        self.native[t.name] = x
        return x.to(F32)

    def matmul(self, k) -> torch.Tensor:
        a, b = (operands.logical(self._operand(name), t) for name, t in ((k.a, k.a_t), (k.b, k.b_t)))
        if a.is_cuda and a.dtype in _MM_OUT_DTYPE and a.dtype == b.dtype and k.acc is dtypes.F32:
            return torch.mm(a, b, out_dtype=F32)
        return a.to(F32) @ b.to(F32)

    def _operand(self, name: str) -> torch.Tensor:
        """A gemm operand in its own type: an input as given, an earlier stored tile converted back."""
        if name in self.native:
            return self.native[name]
        t = self.program.tensors[name]
        return self.store[name].to(getattr(torch, t.dtype.torch_name))


def _caller_tensor(t, x: torch.Tensor) -> torch.Tensor:
    """An output as the compiled program returns it: its dtype; i4 packed (low nibble = even column)."""
    if t.dtype is dtypes.E2M1:
        return reference.pack_e2m1(x)
    if t.dtype is dtypes.I4:
        v = x.to(torch.int16) & 0xF
        return (v[..., 0::2] | (v[..., 1::2] << 4)).to(torch.uint8)
    return x.to(getattr(torch, t.dtype.torch_name))


class Unfused:
    """A program run as torch ops; call it like the compiled program (compiled=True: the traced
    graph under torch.compile, built on the first call of each shape signature)."""

    def __init__(self, program: Program, source: Program):
        self.program, self.source = program, source
        self.outputs = [t.name for t in source.outputs()]
        self._graphs: dict[tuple, object] = {}
        self._constants: dict = {}
        self._lock = threading.Lock()

    def __call__(self, compiled: bool = False, **args) -> dict[str, torch.Tensor]:
        tensors, scalars, device, sizes = validate(self.program, args, cuda=False)
        if not compiled:
            return self.run(sizes, device, tensors, scalars)
        key = (tuple(sorted(sizes.items())), str(device),
               tuple((n, x.dtype, x.stride()) for n, x in tensors.items()))
        with self._lock:
            graph = self._graphs.get(key)
            if graph is None:
                graph = self._graphs[key] = self._compile(sizes, device, tensors, scalars)
        return graph(tensors, scalars)

    def run(self, sizes: dict[str, int], device, tensors: dict, scalars: dict) -> dict[str, torch.Tensor]:
        values = UnfusedInterpreter(self.source, sizes, device, self._constants).run({**tensors, **scalars})
        return {name: _caller_tensor(self.source.tensors[name], values[name]) for name in self.outputs}

    def _compile(self, sizes, device, tensors: dict, scalars: dict):
        from torch.fx.experimental.proxy_tensor import make_fx
        names, scalar_names = list(tensors), list(scalars)

        def flat(*xs):
            out = self.run(sizes, device, dict(zip(names, xs)), dict(zip(scalar_names, xs[len(names):])))
            return tuple(out[n] for n in self.outputs)

        it = UnfusedInterpreter(self.source, sizes, device, self._constants)

        def arguments(tensors, scalars):     # scalars as cached device tensors: no copy per call
            return [tensors[n] for n in names] + [it.constant(float(scalars[n])) for n in scalar_names]
        try:
            graph = torch.compile(make_fx(flat)(*arguments(tensors, scalars)), dynamic=False)
            graph(*arguments(tensors, scalars))               # compiles now: a failure is reported here
        except EpicError:
            raise
        except Exception as e:      # noqa: BLE001 -- torch.compile's own failures (no C++ compiler, ...)
            raise error("E708", f"torch.compile could not compile the unfused form of {printable(self.source.name)}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}", None,
                        'use fallback="eager" (the same computation, not compiled)') from None
        return lambda tensors, scalars: dict(zip(self.outputs, graph(*arguments(tensors, scalars))))


__all__ = ["Unfused", "UnfusedInterpreter"]
