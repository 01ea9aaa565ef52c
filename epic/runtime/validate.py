"""Checking what a caller hands to a compiled program, before anything launches: names, scalar
values, dtypes, shapes (solving the dimension sizes), layout rules at those sizes, strides,
16-byte alignment, and the device -- in the order a user fixes them. Each failure is an E6xx
diagnostic pointing at the declaration. The reference interpreter's inputs get the checks of what
they mean (check_meaning)."""
from __future__ import annotations

import torch

from .. import sizes as sizes_mod
from ..checks import layout
from ..diagnostics import EpicError, error
from ..ir.core import Program, Tensor


def validate(program: Program, args: dict, cuda: bool = True) -> tuple[dict, dict, torch.device, dict]:
    """(tensors, scalars, device, sizes) of a call, or the first problem as a diagnostic. cuda=False:
    any one device will do (the unfused torch form, epic/runtime/unfused.py)."""
    expected = {t.name: t for t in program.inputs()}
    sizes_mod.check_names(program, args)
    tensors, scalars = {}, {}
    for name, t in expected.items():
        if t.is_scalar:
            scalars[name] = sizes_mod.scalar_value(t, args.get(name))
            continue
        if name not in args:
            raise error("E601", f"missing tensor '{name}' ({t.describe()})", t.span)
        x = args[name]
        if not isinstance(x, torch.Tensor):
            raise error("E601", f"'{name}' must be a torch.Tensor, got {type(x).__name__}", t.span,
                        f"pass a tensor of {t.describe()}, e.g. torch.as_tensor({name}).to(torch.{t.dtype.torch_name})")
        check_dense(name, t, x)
        check_dtype(name, t, x)
        tensors[name] = x
    sizes = solve(program, {k: tuple(v.shape) for k, v in tensors.items()}, indexable=cuda)
    for name, x in tensors.items():
        check_strides(name, expected[name], x)
        if x.data_ptr() % 16:
            raise error("E606", f"'{name}' does not start on a 16-byte boundary (TMA)", expected[name].span,
                        f"pass a fresh tensor: {name}.clone()")
    device = None
    for name, x in tensors.items():
        t = expected[name]
        if cuda and x.device.type != "cuda":
            raise error("E604", f"'{name}' is on {x.device}; kernels run on a CUDA device", t.span,
                        f"move it: {name}.cuda()")
        if device is None:
            device = x.device
        elif x.device != device:
            raise error("E604", f"'{name}' is on {x.device}, other tensors on {device}", t.span)
    return tensors, scalars, device, sizes


def solve(program: Program, shapes: dict[str, tuple], indexable: bool) -> dict[str, int]:
    """The dimension sizes that these shapes give (E602 where they disagree), every one of them
    (E607), at which the layout rules hold (E4xx). indexable: epic's kernels will run, so also
    sizes they can index (E607), checked before the device."""
    sizes = sizes_mod.bind_from_tensors(program, shapes)
    sizes_mod.check_complete(program, sizes)
    if indexable:
        sizes_mod.check_indexable(program, sizes)
    diags = layout.check_sizes(program, sizes)   # 16-byte rows (TMA), even widths, ...
    if diags:
        raise EpicError(diags)
    return sizes


def check_meaning(program: Program, args: dict) -> None:
    """A call's checks of what its inputs mean, for the reference interpreter: names, dtypes, shapes
    and sizes. What the interpreter cannot read at all (a missing tensor, a sparse one, ...) it
    reports itself; devices, strides and alignment do not matter to it."""
    sizes_mod.check_names(program, args)
    shapes = {}
    for t in program.inputs():
        x = args.get(t.name)
        if t.is_scalar:
            continue
        if not isinstance(x, torch.Tensor) or x.is_complex() or x.is_meta or sizes_mod.not_dense(x):
            return
        check_dtype(t.name, t, x)
        shapes[t.name] = tuple(x.shape)
    solve(program, shapes, indexable=False)


def check_dense(name: str, t: Tensor, x: torch.Tensor) -> None:
    """Kernels read dense tensors through a data pointer and strides: sparse and nested tensors, and
    tensors without storage of their own (inside vmap or another functorch transform), are refused
    here, before their sizes or strides are asked for (which would throw)."""
    kind = sizes_mod.not_dense(x)
    if kind:
        raise error("E605", f"'{name}' is a {kind} tensor; kernels read dense (strided) tensors", t.span,
                    f"pass a dense tensor, e.g. {name}.to_dense()" if kind != "nested" else
                    "call the program once per dense tensor")
    try:
        x.stride()
        x.data_ptr()
    except RuntimeError:
        raise error("E605", f"'{name}' has no strides or storage of its own (a tensor inside vmap or another "
                    "functorch transform?)", t.span, "call the program outside the transform") from None


def check_dtype(name: str, t: Tensor, x: torch.Tensor) -> None:
    want = getattr(torch, t.dtype.torch_name)
    if x.dtype != want:
        raise error("E603", f"'{name}' is {x.dtype}, the program declares {t.describe()}", t.span,
                    f"convert it: {name}.to({want})")


def check_strides(name: str, t: Tensor, x: torch.Tensor) -> None:
    if t.layout == "kmajor":
        ok = x.stride(0) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[0])
        hint = f"pass a [N, K] weight W as W.t() (K contiguous); or {name}.t().contiguous().t()"
    else:
        ok = x.is_contiguous()
        hint = f"pass {name}.contiguous()"
        if x.dim() == 2 and x.shape[0] > 1 and x.shape[1] > 1 and x.t().is_contiguous():
            # a .t() view: a gemm reads a tensor transposed from the tensor itself (`name.T` in the program)
            hint = (f"'{name}' is a transposed view: pass the tensor it views ({name}.t() here is row-major "
                    f"[{x.shape[1]}, {x.shape[0]}]) and declare it so, reading it as `{name}.T` where the transpose "
                    f"is meant; or pass {name}.contiguous()")
    if not ok:
        raise error("E605", f"'{name}' has strides {tuple(x.stride())}, which this kernel does not read "
                    f"({'K-major [K, N]' if t.layout == 'kmajor' else 'row-major, packed'})", t.span, hint)


def signature(args: dict) -> tuple:
    """What validation depends on: names, and each tensor's shape, strides, dtype and device (in the
    caller's argument order: the same call site hits the same entry). Scalars are checked per call."""
    return tuple(_signature_of(k, v) for k, v in args.items())


def _signature_of(name: str, v) -> tuple | str:
    if not isinstance(v, torch.Tensor) or v.dim() == 0:
        return name
    kind = sizes_mod.not_dense(v)
    if kind:                                          # never bound: validate refuses it (E605)
        return (name, kind)
    return (name, v.shape, v.stride(), v.dtype, v.device)
