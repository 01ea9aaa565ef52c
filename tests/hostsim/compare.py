"""Comparing a kernel's result with the reference interpreter's, element by element.

Tolerances are those of tests/test_gpu.py's check_close (per dtype: one step of the stored type's
mantissa where f32 and float64 may round apart), except that integer results must be exact (the
harness feeds inputs whose accumulator is exact in f32, so kernel and reference agree bit for bit
on anything computed from it by exact operations) and that non-finite values (a reduction's
identity in the padding of per-tile partials, inf, NaN) must match exactly and do not count in
the scale of the tolerance.
"""
from __future__ import annotations

import torch


def tolerance(dtype: str, scale: float) -> tuple[float, float]:
    """(rtol, atol) for results stored as `dtype` whose reference has RMS `scale`."""
    if dtype in ("bf16", "f16"):
        return 2 ** -7, 1e-3 * scale
    if dtype in ("e4m3", "e5m2"):       # one step of a 3-bit (2-bit) mantissa: the block quantizer
        return 2 ** -3 if dtype == "e4m3" else 2 ** -2, 1e-3 * scale   # multiplies by 1/s, one step off at ties
    if dtype.startswith(("i", "u")):    # integers: exact
        return 0.0, 0.0
    return 1e-4, 1e-5 * scale


def mismatch(name: str, got: torch.Tensor, want: torch.Tensor, dtype: str, quantized: bool = False) -> str | None:
    """Why `got` (a kernel's result) does not match `want` (the reference), or None.
    quantized: integers of block-scaled quantization, q = x / s: the kernel divides by the f32 scale,
    the reference by the float64 one, so a value at an exact tie of the reference may round one step
    the other way; one step on at most 1 in 1000 elements is allowed there (as tests/test_gpu.py
    allows), anything systematic still fails."""
    got = got.detach().cpu().double()
    want = want.detach().cpu().double()
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)}, the reference's is {tuple(want.shape)}"
    if quantized and tolerance(dtype, 1.0) == (0.0, 0.0) and torch.isfinite(want).all():
        diff = (got - want).abs()
        if diff.max().item() <= 1 and int((diff > 0).sum()) <= max(1, diff.numel() // 1000):
            return None
    finite = torch.isfinite(want)
    odd = (~finite) & ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
    odd |= finite & ~torch.isfinite(got)
    scale = want[finite].pow(2).mean().sqrt().item() + 1e-30 if finite.any() else 1.0
    rtol, atol = tolerance(dtype, scale)
    off = finite & torch.isfinite(got) & ((got - want).abs() > atol + rtol * want.abs())
    bad = odd | off
    if not bad.any():
        return None
    where = bad.nonzero()
    detail = "; ".join(f"{tuple(i)}: got {got[tuple(i)].item():.6g} want {want[tuple(i)].item():.6g}"
                       for i in where[:6].tolist())
    rows = sorted(set(where[:, 0].tolist())) if got.dim() > 1 else []
    rows_text = f"rows {rows[:8]}{'...' if len(rows) > 8 else ''}; " if rows else ""
    return (f"{name} ({dtype}): {int(bad.sum())} of {bad.numel()} elements off (rtol {rtol:.3g}, atol {atol:.3g}; "
            f"{int(odd.sum())} non-finite where the other is not); {rows_text}{detail}")


def unwritten(name: str, first: torch.Tensor, second: torch.Tensor) -> str | None:
    """Elements that differ between two runs whose buffers started with different bytes: the kernels
    did not write them (or computed them from memory nobody wrote)."""
    a, b = first.contiguous().reshape(-1).view(torch.uint8), second.contiguous().reshape(-1).view(torch.uint8)
    item = first.element_size()
    differ = (a != b).reshape(-1, item).any(dim=1)
    if not differ.any():
        return None
    flat = differ.nonzero()[:6, 0].tolist()
    idx = [tuple(int(x) for x in torch.unravel_index(torch.tensor(i), first.shape)) for i in flat]
    return (f"{name}: {int(differ.sum())} of {first.numel()} elements depend on the buffer's initial contents "
            f"(never written, or computed from memory no kernel wrote), e.g. at {idx}")
