"""The inputs every candidate of `epic tune` is timed on, in the tuning process and in the child
that times one candidate (tuning/trial.py): the same seed gives both the same tensors."""
from __future__ import annotations

from .. import reference


def device_inputs(program, sizes: dict[str, int], seed: int = 0) -> dict:
    """Random inputs on the GPU, laid out as the program reads them (K-major B operands)."""
    out = {}
    for name, x in reference.random_inputs(program, sizes, seed).items():
        t = program.tensors[name]
        if t.is_scalar:
            out[name] = float(x)
            continue
        if t.layout == "kmajor":
            x = x.t().contiguous().t()
        out[name] = x.cuda()
    return out
