"""The GPU tests' f32 tolerance (tests/test_gpu.py check_close) on the CPU: it grows with the length of
the sum behind a value (an f32 sum of 8191 products lands ~1.2e-5 of the values' size from float64 on
the H200), and still rejects what a wrong tile or operand gives."""
import pytest
import torch

from .test_gpu import check_close


def _pair(rel_error):
    want = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scale = want.pow(2).mean().sqrt()
    small = (want.abs() < 0.05 * scale).nonzero().flatten()[:40]     # where rtol does not cover it
    got = want.clone()
    got[small] += rel_error * scale            # a few elements off by this much of the values' size
    return got, want


def test_a_long_sums_rounding_passes_only_with_its_length():
    got, want = _pair(3e-5)
    check_close("dw", got, want, "f32", contraction=8191)
    with pytest.raises(AssertionError):
        check_close("dw", got, want, "f32", contraction=128)


@pytest.mark.parametrize("contraction", [0, 128, 8191, 1 << 20])
def test_an_error_of_a_wrong_operand_fails_at_any_length(contraction):
    got, want = _pair(0.05)
    with pytest.raises(AssertionError):
        check_close("dw", got, want, "f32", contraction=contraction)
