"""A gemm that the plan gives to the vendor's library (plan/backend.py): no source to generate. Its
spec names what the launch reads and writes, in the pointer order every launch path uses:
A, B, then C (`acc + c`, where the gemm adds one) and D. The runtime runs it with torch.mm or
torch.addmm on those tensors (runtime/vendor_gemm.py; templates/launcher.cpp for the compiled path)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.core import GemmKernel, Program
from ..plan import backend
from ..plan.kernel_config import KernelConfig
from .nodes import Pointer, Scalar


@dataclass
class VendorGemmSpec:
    name: str
    config: KernelConfig
    pointers: list[Pointer]
    a_t: bool                  # the operand is the transpose of its tensor (`a.T`)
    b_t: bool
    has_c: bool                # d = a @ b + c (beta 1), else d = a @ b
    scalars: list[Scalar] = field(default_factory=list)

    @property
    def slots(self) -> dict[str, int]:
        """Pointer index by role."""
        return {p.role: i for i, p in enumerate(self.pointers)}


def lower(program: Program, k: GemmKernel, cfg: KernelConfig) -> VendorGemmSpec:
    form = backend.vendor_form(k, program.tensors)
    assert isinstance(form, backend.VendorForm), form     # the plan chose the backend only where it fits
    t = program.tensors
    pointers = [Pointer("A", k.a, t[k.a].dtype), Pointer("B", k.b, t[k.b].dtype)]
    if form.c is not None:
        pointers.append(Pointer("C", form.c, t[form.c].dtype))
    pointers.append(Pointer("D", form.d, t[form.d].dtype))
    return VendorGemmSpec(k.name, cfg, pointers, k.a_t, k.b_t, form.c is not None)
