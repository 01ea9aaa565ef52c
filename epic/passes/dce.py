"""Dead values: keep only what a store needs; drop tensors nothing stores or reads any more."""
from __future__ import annotations

from ..ir import primitives as P
from ..ir.core import topo_order


def run(program, trace=None):
    kernels = [k.with_values(topo_order([s.value for s in k.stores]), k.stores) for k in program.kernels]
    used = set()
    for k in kernels:
        if k.kind == "gemm":
            used |= {k.a, k.b}
        used |= {v.attrs[P.prim(v.op).reads] for v in k.values if P.prim(v.op).reads}
        used |= {s.tensor for s in k.stores}
    tensors = {n: t for n, t in program.tensors.items() if n in used or t.role in ("input", "scalar", "out")}
    return program.replace_kernels(kernels, tensors)
