"""Which library runs a gemm: epic's own CUTLASS kernel ("cutlass"), or the vendor's gemm ("cublas":
torch.mm / torch.addmm on the tensors, which is cuBLAS on a CUDA device).

Only a gemm with nothing to fuse can take the vendor's: it stores its accumulator, or the
accumulator plus one [M, N] tensor (`acc + c`: cuBLAS's beta = 1), rounded to its 16-bit operands'
dtype. Such gemms are what a derived backward has most of (dX and dW of a loss head, operand
gradients). cuBLAS's kernels are faster than epic's at some shapes (a vocabulary-sized dimension:
bench/results/2026-12-02-h200-step-kernels-ce-shifted.log) and slower at others (the MLP's), so the
heuristic takes it only for a vocabulary-sized dimension and `epic tune` measures both.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import BF16, F16, F32
from ..ir import primitives as P
from ..ir.options import BACKENDS  # noqa: F401  (the vocabulary; re-exported for the plan)
from ..shapes import Kind
# a gemm dimension at least this large (a vocabulary: Llama-3's 128256) is where cuBLAS measured faster
VOCABULARY_DIM = 65536


@dataclass(frozen=True)
class VendorForm:
    """What a gemm computes in cuBLAS's terms: d = a @ b (+ c)."""
    d: str
    c: str | None


def vendor_form(kernel, tensors: dict) -> VendorForm | str:
    """The gemm as d = a @ b (+ c), or why the vendor's gemm cannot compute it (a sentence)."""
    if kernel.acc != F32:
        return f"it accumulates in {kernel.acc} (the vendor's gemm accumulates in f32)"
    a, b = tensors[kernel.a].dtype, tensors[kernel.b].dtype
    if a != b or a not in (BF16, F16):
        return f"its operands are {a} and {b} (the vendor's gemm takes two bf16 or two f16 operands)"
    if len(kernel.stores) != 1:
        return (f"it stores {len(kernel.stores)} tensors (the vendor's gemm stores one: the accumulator, "
                "or the accumulator plus a tensor)")
    store = kernel.stores[0]
    out = tensors[store.tensor]
    if out.dtype != a:
        return f"it stores '{out.name}' as {out.dtype} (the vendor's gemm stores its operands' dtype, {a})"
    v = store.value
    if P.is_accumulator(v.op):
        return VendorForm(out.name, None)
    if P.prim(v.op).operator == "+" and sorted(map(P.is_accumulator, (x.op for x in v.args))) == [False, True]:
        other = next(x for x in v.args if not P.is_accumulator(x.op))
        if not P.is_load(other):
            return (f"it adds a value computed in its epilogue ({other.op}) to the accumulator (the vendor's gemm "
                    "adds a tensor)")
        c = tensors[other.attrs["tensor"]]
        if other.kind is Kind.TILE and len(c.dims) == 2 and c.layout == "row" and c.dtype == out.dtype:
            return VendorForm(out.name, c.name)
        return (f"it adds '{c.name}', which is not an [M, N] tile of {out.dtype} (the vendor's gemm adds "
                "one of its output's dtype and shape)")
    return (f"it stores a value computed from the accumulator in '{out.name}' ({v.op}); the vendor's gemm "
            "stores only the accumulator, or the accumulator plus a tensor")


def prefers_vendor(kernel, tensors: dict, m: int, n: int | None, depth: int | None) -> bool:
    """The heuristic: the vendor's gemm for an epilogue-free gemm with a vocabulary-sized dimension."""
    dims = [d for d in (m, n, depth) if d is not None]
    return max(dims, default=0) >= VOCABULARY_DIM and isinstance(vendor_form(kernel, tensors), VendorForm)
