"""Derived tensors (role "derived", made by the row-scale deferral for LayerNorm): (gamma) @ W and
(beta) @ W, f32 row vectors that depend on weights only. A call computes them with torch on the
device before its launches, once per weight tensor: the cache key is each operand's data pointer,
version counter (bumped by every in-place update, also through views), shape, strides, dtype and
device, and the entry holds a weak reference to each operand's base tensor, so a weight freed and
another allocated at the same address is not mistaken for it.

Under CUDA graph capture they are computed inside the captured region, uncached: every replay
recomputes them from what the recorded weights hold then (a few GEMVs), so a weight updated in place
between replays is never stale.
"""
from __future__ import annotations

import weakref

import torch

MAX_ENTRIES = 64        # distinct (vector, matrix) operand sets kept; beyond that the oldest go


def specs(program) -> list[tuple[str, tuple[str, ...], str]]:
    """(name, row vectors, matrix) of every derived tensor of a program."""
    return [(t.name, *t.derived) for t in program.tensors.values() if t.role == "derived"]


def compute(vectors: list[torch.Tensor], matrix: torch.Tensor) -> torch.Tensor:
    """The product of the row vectors (ones when there are none) @ matrix, in f32."""
    v = torch.ones(matrix.shape[0], dtype=torch.float32, device=matrix.device)
    for x in vectors:
        v = v * x.reshape(-1).float()
    return v @ matrix.float()


def _identity(x: torch.Tensor) -> tuple:
    return (x.data_ptr(), x._version, tuple(x.shape), x.stride(), x.dtype, str(x.device))


def _owner(x: torch.Tensor) -> torch.Tensor:
    return x._base if x._base is not None else x


class Cache:
    """Derived tensors by their operands' identities (see the module docstring)."""

    def __init__(self):
        self._entries: dict[tuple, tuple[list, torch.Tensor]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, vectors: list[torch.Tensor], matrix: torch.Tensor) -> torch.Tensor:
        operands = [*vectors, matrix]
        if _capturing():
            return compute(vectors, matrix)
        try:
            key = tuple(_identity(x) for x in operands)
        except RuntimeError:        # an inference tensor has no version counter: nothing tells a change
            return compute(vectors, matrix)
        hit = self._entries.get(key)
        if hit is not None and all(r() is _owner(x) for r, x in zip(hit[0], operands)):
            return hit[1]
        value = compute(vectors, matrix)
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = ([weakref.ref(_owner(x)) for x in operands], value)
        return value

    def all(self, program_specs: list, args: dict) -> dict[str, torch.Tensor]:
        return {name: self.get([args[v] for v in vectors], args[matrix]) for name, vectors, matrix in program_specs}


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
