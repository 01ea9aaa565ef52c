"""What a call of one input signature executes, built once in Python (runtime/binding.bind) and run
by both launch paths: the ctypes path (Executable.run, launch by launch) and the compiled launcher
(templates/launcher.cpp), which runtime/fastcall.register hands this same table.

The table: every tensor a launch points at has one index -- the call's input tensors (the program's
order), then its derived tensors, then the plan's buffers (Executable.names). Derived tensors
(LayerNorm's (gamma) @ W, runtime/derived.py) are a host step: Python computes them before the
launches, through its per-weight cache, on either path (the C++ launcher receives them as inputs).

The layout: each output gets its own allocation (it outlives the call); every other buffer
(tmp tensors, per-tile partials, combine results) and every launch's workspace lies in one arena,
at offsets aligned to ARENA_ALIGN bytes, in that order: a call pays one allocation more than its
outputs. keep=True hands out the intermediates as disjoint views of the arena. A buffer the plan puts in
another's memory (plan.aliases: a tile finished in place) is not allocated: binding.bind points its
kernels' pointers at the other.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import torch

from ..plan import planner
from .vendor_gemm import VendorGemm

# TMA and vector stores need 16 bytes, the caching allocator's own blocks start at 512: 256 keeps
# every buffer on its own sectors
ARENA_ALIGN = 256


@dataclass
class Launch:
    """One kernel launch: everything but the pointers (which change per call) and the runtime scalars."""
    library: object                     # a loader.KernelLibrary (or anything with its interface)
    pointer_tensors: list[str]          # tensor name per pointer ("" for an unused D)
    dims: list[int]
    scalars: list                       # floats (dimension sizes) or names of scalar inputs
    workspace: int                      # bytes
    workspace_offset: int = -1          # its place in the arena (when workspace > 0)

    def __post_init__(self):
        # ctypes arrays built once and refilled per call (building them costs microseconds)
        self.vendor = isinstance(self.library, VendorGemm)
        self.c_dims = (ctypes.c_longlong * len(self.dims))(*self.dims)
        self.c_ptrs = (ctypes.c_void_p * max(1, len(self.pointer_tensors)))()
        self.runtime_scalars = [(i, v) for i, v in enumerate(self.scalars) if isinstance(v, str)]
        self.c_scalars = (ctypes.c_float * max(1, len(self.scalars)))(
            *[0.0 if isinstance(v, str) else v for v in self.scalars])

    def run(self, buffers: dict, scalars: dict, stream: int, device, workspace: int | None = None) -> None:
        """Launch with the tensors `buffers` (by name) and the call's scalars (by name). workspace: its
        address in the call's arena; a caller without one (run_sharded) gets a fresh allocation."""
        if self.vendor:                     # the vendor's gemm (runtime/vendor_gemm.py) launches with tensors
            self.library.run([buffers[name] for name in self.pointer_tensors], stream)
            return
        ptrs = self.c_ptrs
        for i, name in enumerate(self.pointer_tensors):
            ptrs[i] = buffers[name].data_ptr() if name else 0
        for i, name in self.runtime_scalars:
            self.c_scalars[i] = scalars[name]
        if not self.workspace:
            self.library.launch(ptrs, self.c_dims, self.c_scalars, stream)
            return
        if workspace is None:
            ws = torch.empty(self.workspace, dtype=torch.uint8, device=device)
            workspace = ws.data_ptr()
        self.library.launch(ptrs, self.c_dims, self.c_scalars, stream, workspace, self.workspace)


def nbytes(buffer: planner.Buffer) -> int:
    """The bytes of a buffer as allocated (its shape times its torch dtype's size)."""
    return math.prod(buffer.shape) * getattr(torch, buffer.torch_dtype).itemsize


def layout(buffers: list[planner.Buffer], outputs: list[str], launches: list[Launch]) -> tuple[list[int], int]:
    """Place every buffer but the outputs, then every launch's workspace, in one arena: (each
    buffer's offset, -1 for an output; the arena's bytes). Sets each launch's workspace_offset."""
    arena = 0

    def place(size: int) -> int:
        nonlocal arena
        at = -(-arena // ARENA_ALIGN) * ARENA_ALIGN
        arena = at + size
        return at
    offsets = [-1 if b.name in outputs else place(nbytes(b)) for b in buffers]
    for launch in launches:
        launch.workspace_offset = place(launch.workspace) if launch.workspace > 0 else -1
    return offsets, arena


def poison(x: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (a sentinel byte for integers, an fp8 NaN pattern) so unwritten elements show."""
    if x.dtype.is_floating_point and x.dtype.itemsize >= 2:
        return x.fill_(float("nan"))
    x.reshape(-1).view(torch.uint8).fill_(0x7F if not x.dtype.is_floating_point else 0xFF)
    return x


@dataclass
class Executable:
    """A program bound to one input signature (shapes, dtypes, strides, device): see the module docstring."""
    device: torch.device
    tensor_names: list[str]             # the call's input tensors, table entries 0..
    scalar_names: list[str]
    derived: list[tuple[str, tuple[str, ...], str]]   # (name, row vectors, matrix): the host step
    allocations: list[planner.Buffer]   # the plan's buffers, after the derived tensors in the table
    launches: list[Launch]
    outputs: list[str]
    keep: list[str]
    plan: planner.Plan
    offsets: list[int] = field(default_factory=list)   # per allocation: its arena offset, -1: its own
    arena: int = 0                      # the arena's bytes

    def __post_init__(self):
        if not self.offsets:
            self.offsets, self.arena = layout(self.allocations, self.outputs, self.launches)

    @property
    def names(self) -> list[str]:
        """The table: input tensors, derived tensors, buffers."""
        return [*self.tensor_names, *(d[0] for d in self.derived), *(b.name for b in self.allocations)]

    @property
    def has_arena(self) -> bool:
        return any(o >= 0 for o in self.offsets) or any(l.workspace_offset >= 0 for l in self.launches)

    def inputs(self, args: dict, derived_cache) -> list[torch.Tensor]:
        """The table's first entries for one call: its input tensors, then the derived tensors
        (computed here, through derived_cache: a runtime/derived.Cache)."""
        tensors = [args[n] for n in self.tensor_names]
        return tensors + [derived_cache.get([args[v] for v in vectors], args[matrix])
                          for _, vectors, matrix in self.derived]

    def run(self, args: dict, scalars: dict, stream: int, derived_cache, *, poison_buffers: bool = False,
            keep: bool = False, launcher=None, into: dict | None = None) -> dict[str, torch.Tensor]:
        """One call: the host step, then the launches; the outputs (keep: every buffer) by name.
        launcher: a compiled Launcher this table was registered with (fastcall.register); it runs
        the launches unless buffers are to be poisoned, outputs go into given tensors (into: output
        name -> tensor, checked by runtime/given_outputs.py) or it no longer holds the table."""
        inputs = self.inputs(args, derived_cache)
        into = into or {}
        if launcher is not None and not poison_buffers and not into:
            got, failed, rc, out = launcher.run(inputs, [float(scalars[n]) for n in self.scalar_names], stream, keep)
            if failed >= 0:
                raise self.launches[failed].library.launch_error(rc)
            if got >= 0:
                return dict(zip(self.keep if keep else self.outputs, out))
        table = dict(zip(self.names, inputs))
        arena = torch.empty(self.arena, dtype=torch.uint8, device=self.device) if self.has_arena else None
        for b, offset in zip(self.allocations, self.offsets):
            dtype = getattr(torch, b.torch_dtype)
            if b.name in into:             # written in place where it is an input too: never poisoned
                table[b.name] = into[b.name]
                if poison_buffers and not any(into[b.name].data_ptr() == x.data_ptr() for x in inputs):
                    poison(into[b.name])
                continue
            if offset < 0:
                x = torch.empty(b.shape, dtype=dtype, device=self.device)
            else:
                x = arena[offset:offset + nbytes(b)].view(dtype).view(b.shape)
            table[b.name] = poison(x) if poison_buffers else x
        base = arena.data_ptr() if arena is not None else 0
        for launch in self.launches:
            launch.run(table, scalars, stream, self.device,
                       base + launch.workspace_offset if launch.workspace_offset >= 0 else None)
        return {n: table[n] for n in (self.keep if keep else self.outputs)}
