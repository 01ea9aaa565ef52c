"""The Python API: epic.compile(path_or_source) -> Program; program(**tensors) -> outputs by name.

A call validates every tensor (presence, dtype, device, shape, strides, 16-byte alignment) before
anything launches, solves the dimension sizes, picks the plan for those sizes (cached), builds or
loads each kernel from the on-disk cache, allocates outputs and buffers, and launches the plan's
kernels in order on the current CUDA stream.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .. import pipeline, reference, sizes as sizes_mod
from ..checks import layout
from ..codegen import emit, evt
from ..diagnostics import Diagnostic, EpicError
from ..ir.core import Tensor
from ..plan import planner
from . import build, loader


def compile(path_or_source: str, config: dict[str, dict] | None = None) -> "Program":
    """Parse, check and rewrite a program (a path to an .epi file, or its text). Kernels are built
    lazily on the first call for a given row count (or ahead with Program.build).
    config: per-gemm overrides, e.g. {"o_proj": {"tile": (128, 128, 64), "schedule": "cooperative"}}."""
    return Program(pipeline.analyze(path_or_source), config)


@dataclass
class _Launch:
    """One kernel launch of a bound plan: everything but the pointers is fixed by the signature."""
    library: loader.KernelLibrary
    pointer_tensors: list[str]          # tensor name per pointer ("" for an unused D)
    dims: list[int]
    scalars: list                       # floats (dimension sizes) or names of scalar inputs
    workspace: int

    def __post_init__(self):
        import ctypes
        self.c_dims = (ctypes.c_longlong * len(self.dims))(*self.dims)
        self.runtime_scalars = any(isinstance(v, str) for v in self.scalars)
        self.c_scalars = None if self.runtime_scalars else (ctypes.c_float * max(1, len(self.scalars)))(*self.scalars)


@dataclass
class _Bound:
    """A program bound to one input signature (shapes, dtypes, strides, device)."""
    device: torch.device
    tensor_names: list[str]
    scalar_inputs: list[Tensor]
    allocations: list[tuple[str, tuple, torch.dtype]]
    launches: list[_Launch]
    outputs: list[str]
    keep: list[str]
    plan: planner.Plan


def _signature(args: dict) -> tuple:
    """What validation depends on: names, and each tensor's shape, strides, dtype and device (in the
    caller's argument order: the same call site hits the same entry)."""
    return tuple((k, v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) and v.dim() > 0
                 else k for k, v in args.items())


def _current_stream(device: torch.device) -> int:
    """The raw cudaStream_t of the current stream (torch's internal accessor is ~10x cheaper than
    torch.cuda.current_stream(); fall back to the public API where it is missing)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def _scalar(v) -> float:
    return float(v.item() if isinstance(v, torch.Tensor) else v)


class Program:
    def __init__(self, analysis, config: dict[str, dict] | None = None):
        self.analysis = analysis
        self.program = analysis.program
        self.config = config or {}
        self._bound: dict[tuple, _Bound] = {}      # input signature -> bound plan
        self._libraries: dict[tuple, list] = {}    # kernel configurations -> (spec, library) per kernel
        self._lock = threading.Lock()
        # Unsupported features fail here, at compile time, not at the first call.
        emit.specs(self.program, emit.kernel_configs(self.program, emit.DEFAULT_M, self.config))

    # ------------------------------------------------------------------ information
    @property
    def inputs(self) -> list[Tensor]:
        return self.program.inputs()

    @property
    def outputs(self) -> list[Tensor]:
        return self.program.outputs()

    def plan(self, sizes: dict[str, int]) -> planner.Plan:
        return planner.make_plan(self.program, sizes, self.config)

    def build(self, sizes: dict[str, int] | None = None, jobs: int | None = None) -> list:
        """Build every kernel for these sizes (default: the large-M configuration); no GPU needed."""
        m = sizes_mod.evaluate(self.program.kernels[0].rows, sizes) if sizes else emit.DEFAULT_M
        units = [u for _, u in emit.units(self.program, emit.kernel_configs(self.program, m, self.config))]
        return build.build_all(units, jobs)

    def reference(self, exact: bool = True, **tensors) -> dict[str, torch.Tensor]:
        """The float64 reference interpreter on the same inputs (on the CPU)."""
        return reference.run(self.analysis.source_program, tensors, exact=exact)

    # ------------------------------------------------------------------ running
    def __call__(self, *, poison: bool = False, keep: bool = False, **args) -> dict[str, torch.Tensor]:
        """Run the program; returns its outputs by name.
        poison=True fills every output and buffer with NaN (a sentinel for integers) before launching,
            so that elements the kernels fail to write show up;
        keep=True also returns the intermediate tensors (tmp, deferred scales, per-tile partials).
        The first call with given shapes/dtypes/strides validates everything and binds a plan; later
        calls with the same signature only re-check alignment (pointers change, layouts do not)."""
        key = _signature(args)
        bound = self._bound.get(key)
        if bound is None:
            tensors, scalars, device, sizes = self._validate(args)
            bound = self._bind(sizes, device)
            self._bound[key] = bound
        else:
            for name in bound.tensor_names:
                if args[name].data_ptr() % 16:
                    self._validate(args)          # reports E606 with the declaration's span
        buffers = {name: args[name] for name in bound.tensor_names}
        for name, shape, dtype in bound.allocations:
            buffers[name] = _empty(shape, dtype, bound.device, poison)
        scalars = {t.name: _scalar(args.get(t.name, t.default)) for t in bound.scalar_inputs} \
            if bound.scalar_inputs else None
        stream = _current_stream(bound.device)
        for launch in bound.launches:
            ptrs = [buffers[n].data_ptr() if n else 0 for n in launch.pointer_tensors]
            values = launch.c_scalars
            if launch.runtime_scalars:
                values = [v if isinstance(v, float) else scalars[v] for v in launch.scalars]
            if launch.workspace:
                ws = torch.empty(launch.workspace, dtype=torch.uint8, device=bound.device)
                launch.library.launch(ptrs, launch.c_dims, values, stream, ws.data_ptr(), launch.workspace)
            else:
                launch.library.launch(ptrs, launch.c_dims, values, stream)
        names = bound.keep if keep else bound.outputs
        return {n: buffers[n] for n in names}

    def _bind(self, sizes: dict[str, int], device) -> "_Bound":
        plan = planner.make_plan(self.program, sizes, self.config)
        key = tuple(sorted((k, str(c)) for k, c in plan.configs.items()))
        with self._lock:
            if key not in self._libraries:
                pairs = emit.units(self.program, plan.configs)
                paths = build.build_all([u for _, u in pairs])
                self._libraries[key] = [(spec, loader.load(path, [f"{p.role}:{p.tensor}" for p in spec.pointers]))
                                        for (spec, _), path in zip(pairs, paths)]
        launches = []
        for (spec, lib), k in zip(self._libraries[key], self.program.kernels):
            m, n = sizes_mod.evaluate(k.rows, sizes), sizes_mod.evaluate(k.n, sizes)
            if isinstance(spec, evt.KernelSpec):
                cfg = plan.configs[k.name]
                dims = [m, n, sizes_mod.evaluate(k.k, sizes), cfg.swizzle, cfg.raster_code]
            else:
                cfg = plan.configs[k.source]
                dims = [m, n, cfg.tile_m, cfg.tile_n]
            with torch.cuda.device(device):
                ws = lib.workspace_size(dims)
            launches.append(_Launch(lib, [p.tensor for p in spec.pointers], dims,
                                    [float(sizes_mod.evaluate(s.dim, sizes)) if s.dim is not None else s.name
                                     for s in spec.scalars], ws))
        allocations = []
        for name, t in self.program.tensors.items():
            if t.role in ("out", "tmp", "buffer", "partial"):
                allocations.append((name, _buffer_shape(t, plan, sizes), _torch_dtype(t)))
        keep = [name for name, _, _ in allocations]
        return _Bound(device, [t.name for t in self.program.inputs() if not t.is_scalar],
                      [t for t in self.program.inputs() if t.is_scalar], allocations, launches,
                      [t.name for t in self.program.outputs()], keep, plan)

    # ------------------------------------------------------------------ torch integration
    def torch_op(self):
        """This program as a torch custom op (torch.library), usable inside torch.compile'd code:
        op(**inputs) -> dict of outputs, like calling the program."""
        if getattr(self, "_op", None) is None:
            self._op = _register_op(self)
        return self._op

    def _validate(self, args: dict) -> tuple[dict, dict, torch.device, dict]:
        """Every check that does not need the GPU, in the order a user fixes them: names, dtypes,
        shapes, strides, alignment; then the device."""
        expected = {t.name: t for t in self.program.inputs()}
        unknown = [k for k in args if k not in expected]
        if unknown:
            raise EpicError(Diagnostic("E601", f"unexpected argument(s) {', '.join(unknown)}", None,
                                       "the program takes " + ", ".join(expected)))
        tensors, scalars = {}, {}
        for name, t in expected.items():
            if t.is_scalar:
                value = args.get(name, t.default)
                if value is None:
                    raise EpicError(Diagnostic("E601", f"missing scalar '{name}'", t.span))
                scalars[name] = float(value.item() if isinstance(value, torch.Tensor) else value)
                continue
            if name not in args:
                raise EpicError(Diagnostic("E601", f"missing tensor '{name}' ({t.describe()})", t.span))
            x = args[name]
            if not isinstance(x, torch.Tensor):
                raise EpicError(Diagnostic("E601", f"'{name}' must be a torch.Tensor, got {type(x).__name__}", t.span))
            want = getattr(torch, t.dtype.torch_name)
            if x.dtype != want:
                raise EpicError(Diagnostic("E603", f"'{name}' is {x.dtype}, the program declares {t.describe()}",
                                           t.span, f"convert it: {name}.to({want})"))
            tensors[name] = x
        sizes = sizes_mod.bind_from_tensors(self.program, {k: tuple(v.shape) for k, v in tensors.items()})
        sizes_mod.check_complete(self.program, sizes)
        diags = layout.check_sizes(self.program, sizes)   # 16-byte rows (TMA), even widths, ...
        if diags:
            raise EpicError(diags)
        for name, x in tensors.items():
            t = expected[name]
            _check_strides(name, t, x)
            if x.data_ptr() % 16:
                raise EpicError(Diagnostic("E606", f"'{name}' does not start on a 16-byte boundary (TMA)", t.span,
                                           f"pass a fresh tensor: {name}.clone()"))
        device = None
        for name, x in tensors.items():
            t = expected[name]
            if x.device.type != "cuda":
                raise EpicError(Diagnostic("E604", f"'{name}' is on {x.device}; kernels run on a CUDA device",
                                           t.span, f"move it: {name}.cuda()"))
            if device is None:
                device = x.device
            elif x.device != device:
                raise EpicError(Diagnostic("E604", f"'{name}' is on {x.device}, other tensors on {device}", t.span))
        return tensors, scalars, device, sizes


_OP_COUNT = [0]


def _register_op(prog: Program):
    """Register torch.ops.epic.p<N>(tensors, scalars) -> outputs, with a fake (meta) kernel that
    derives output shapes from input shapes, so torch.compile can trace through it."""
    tensor_inputs = [t for t in prog.inputs if not t.is_scalar]
    scalar_inputs = [t for t in prog.inputs if t.is_scalar]
    outputs = prog.outputs
    _OP_COUNT[0] += 1
    name = f"epic::p{_OP_COUNT[0]}"

    @torch.library.custom_op(name, mutates_args=())
    def op(tensors: list[torch.Tensor], scalars: list[float]) -> list[torch.Tensor]:
        args = {t.name: x for t, x in zip(tensor_inputs, tensors)}
        args.update({t.name: v for t, v in zip(scalar_inputs, scalars)})
        out = prog(**args)
        return [out[t.name] for t in outputs]

    @op.register_fake
    def _(tensors, scalars):
        shapes = {t.name: tuple(x.shape) for t, x in zip(tensor_inputs, tensors)}
        sizes = sizes_mod.solve_integer(prog.program, shapes)
        device = tensors[0].device
        return [torch.empty([sizes_mod.evaluate_integer(d, sizes) for d in t.dims],
                            dtype=torch.int8 if t.dtype.name == "i4" else getattr(torch, t.dtype.torch_name),
                            device=device) for t in outputs]

    def call(**args):
        tensors = [args[t.name] for t in tensor_inputs]
        scalars = [float(args.get(t.name, t.default)) for t in scalar_inputs]
        return dict(zip([t.name for t in outputs], op(tensors, scalars)))
    call.op = op
    return call


def _check_strides(name: str, t: Tensor, x: torch.Tensor) -> None:
    if t.layout == "kmajor":
        ok = x.stride(0) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[0])
        hint = f"pass a [N, K] weight W as W.t() (K contiguous); or {name}.t().contiguous().t()"
    else:
        ok = x.is_contiguous()
        hint = f"pass {name}.contiguous()"
    if not ok:
        raise EpicError(Diagnostic("E605", f"'{name}' has strides {tuple(x.stride())}, which this kernel does not "
                                   f"read ({'K-major [K, N]' if t.layout == 'kmajor' else 'row-major, packed'})",
                                   t.span, hint))


def _torch_dtype(t: Tensor) -> torch.dtype:
    return torch.int8 if t.dtype.name == "i4" else getattr(torch, t.dtype.torch_name)


def _buffer_shape(t: Tensor, plan, sizes) -> tuple:
    """Outputs in their declared shape; per-tile partials in the layout the reduction nodes write
    ([tiles, rows padded to the tile] for rows, [tiles, columns padded] for columns)."""
    if not t.tiles_axis:
        return tuple(sizes_mod.evaluate(d, sizes) for d in t.dims)
    cfg = plan.configs[t.producer]
    rows, width = (sizes_mod.evaluate(d, sizes) for d in t.dims)
    if t.tiles_axis == "n":
        shape = (-(-width // cfg.tile_n), -(-rows // cfg.tile_m) * cfg.tile_m)
    else:
        shape = (-(-rows // cfg.tile_m), -(-width // cfg.tile_n) * cfg.tile_n)
    return shape + ((2,) if t.components == 2 else ())


def _empty(shape: tuple, dtype: torch.dtype, device, poison: bool) -> torch.Tensor:
    if not poison:
        return torch.empty(shape, dtype=dtype, device=device)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    out = torch.empty(shape, dtype=dtype, device=device)
    out.view(torch.uint8).fill_(0x7F if not dtype.is_floating_point else 0xFF)   # fp8: a NaN pattern
    return out


__all__ = ["compile", "Program"]
