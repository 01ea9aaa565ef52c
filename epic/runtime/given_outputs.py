"""Outputs written into tensors the caller gives (`prog(..., out={"d_w": t})`), checked before anything
launches: each is an output of the program, of its shape, dtype and device, contiguous and 16-byte
aligned, and shares no memory with another given output or with an input -- except an input the plan
lets the output overwrite in place (planner.overwrite_problem: the one kernel that reads the input is
the gemm that stores the output, element by element at the same position, e.g. `acc + d_w_sum`),
which then must be that whole tensor."""
from __future__ import annotations

import torch

from .. import sizes as sizes_mod
from ..diagnostics import error
from ..plan import planner


def _span(x: torch.Tensor) -> tuple[int, int]:
    start = x.data_ptr()
    return start, start + x.numel() * x.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a.device == b.device and a0 < b1 and b0 < a1


def check(plan: planner.Plan, outputs: list[str], device, inputs: dict[str, torch.Tensor],
          given: dict) -> None:
    """Raise the first problem (E601-E606, E611) of the tensors given for outputs."""
    if not isinstance(given, dict):
        raise error("E611", f"out= takes a dict of output name -> tensor, got {type(given).__name__}", None,
                    "pass out={" + ", ".join(f"'{n}': tensor" for n in outputs) + "}")
    for name, x in given.items():
        b = plan.buffers.get(name) if name in outputs else None
        if b is None:
            raise error("E611", f"out= names '{name}', which is not an output of the program", None,
                        "its outputs: " + ", ".join(outputs))
        if not isinstance(x, torch.Tensor) or sizes_mod.not_dense(x):
            raise error("E611", f"out['{name}'] must be a dense torch.Tensor, got {type(x).__name__}", None,
                        f"pass torch.empty({list(b.shape)}, dtype=torch.{b.torch_dtype}, device=...)")
        if x.requires_grad:
            raise error("E611", f"out['{name}'] requires grad; an output written into a given tensor is not "
                        "differentiable (as torch's out= arguments are not)", None,
                        f"pass a tensor that does not require grad, e.g. {name}.detach()")
        if tuple(x.shape) != tuple(b.shape):
            raise error("E602", f"out['{name}'] has shape {list(x.shape)}; the output is {list(b.shape)}", None)
        if x.dtype != getattr(torch, b.torch_dtype):
            raise error("E603", f"out['{name}'] is {x.dtype}; the output is torch.{b.torch_dtype}", None)
        if x.device != device:
            raise error("E604", f"out['{name}'] is on {x.device}, the inputs on {device}", None)
        if not x.is_contiguous():
            raise error("E605", f"out['{name}'] is not contiguous", None, "pass a contiguous tensor")
        if x.data_ptr() % 16:
            raise error("E606", f"out['{name}'] does not start on a 16-byte boundary (TMA)", None)
        for other, y in inputs.items():
            if not _overlap(x, y):
                continue
            whole = _span(x) == _span(y) and tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype
            why = planner.overwrite_problem(plan, name, other) if whole else \
                f"it covers part of '{other}'"
            if why:
                raise error("E611", f"out['{name}'] shares memory with the input '{other}', which the program "
                            f"cannot overwrite in place: {why}", None, f"pass a tensor of its own for '{name}'")
    names = list(given)
    for i, a in enumerate(names):
        for b_name in names[i + 1:]:
            if _overlap(given[a], given[b_name]):
                raise error("E611", f"out['{a}'] and out['{b_name}'] share memory", None,
                            "give each output a tensor of its own")
