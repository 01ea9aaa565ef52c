"""How a gemm reads its operands: the one rule for operand memory order (docs/LANGUAGE.md, "Operand
layouts"). A tensor has one memory order (Tensor.layout: "row", or "kmajor" for a B operand declared
inline); `name.T` reads it transposed. The operand's layout follows from which of its logical
dimensions is contiguous:
  A [M, K]: K contiguous -> RowMajor (K-major), M contiguous -> ColumnMajor (M-major)
  B [K, N]: K contiguous -> ColumnMajor (K-major), N contiguous -> RowMajor (N-major)
sm90's WGMMA reads 8-bit operands K-major only: MN-major operands must be 16-bit."""
from __future__ import annotations

from .core import GemmKernel, Tensor

ROW_MAJOR = "cutlass::layout::RowMajor"
COLUMN_MAJOR = "cutlass::layout::ColumnMajor"


def contiguous_axis(t: Tensor, transposed: bool) -> int:
    """Which dimension of the logical operand (t, or t's transpose) is contiguous in memory: 0 or 1."""
    stored = 0 if t.layout == "kmajor" else 1
    return 1 - stored if transposed else stored


def k_major(which: str, t: Tensor, transposed: bool) -> bool:
    """True when operand `which` ("A" or "B") reads the reduction dimension K contiguously."""
    return contiguous_axis(t, transposed) == (1 if which == "A" else 0)


def major(which: str, t: Tensor, transposed: bool) -> str:
    """The operand's contiguous dimension by name: "k", or "m" (A) / "n" (B)."""
    return "k" if k_major(which, t, transposed) else ("m" if which == "A" else "n")


def cutlass_layout(which: str, t: Tensor, transposed: bool) -> str:
    """The CUTLASS layout tag of the operand (see the module docstring)."""
    if which == "A":
        return ROW_MAJOR if k_major("A", t, transposed) else COLUMN_MAJOR
    return COLUMN_MAJOR if k_major("B", t, transposed) else ROW_MAJOR


def kernel_majors(k: GemmKernel, tensors: dict) -> tuple[str, str]:
    """(A's, B's) contiguous dimension in gemm k: e.g. ("k", "k") for the plain x @ W.t()."""
    return major("A", tensors[k.a], k.a_t), major("B", tensors[k.b], k.b_t)


def describe(which: str, t: Tensor, transposed: bool) -> str:
    """An operand's order in words, for the generated source's comments."""
    m = major(which, t, transposed)
    if which == "A":
        return "[M, K] row-major" if m == "k" else "[M, K] M-major (column-major)"
    return "[K, N] K-major" if m == "k" else "[K, N] N-major (row-major)"


def logical(x, transposed: bool):
    """A tensor value as the operand it stands for: x, or x transposed (torch tensors, any device)."""
    return x.t() if transposed else x
