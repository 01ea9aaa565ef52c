"""The MX formats' kernels on the GPU, bit for bit against the rounded reference.

The GEMM operands are small integers (x) and eighths (w), so the f32 accumulation is exact and both
sides see the same acc: every stored e8m0 byte, e2m1 nibble and e4m3 value must then be identical
(the rounding rules of docs/LANGUAGE.md, "Types", applied to the same numbers). Seen passing on the
H200 on 2026-12-02 (M = 64, 8192, 77).
"""
import pytest
import torch

import epic
from epic import reference

from .conftest import ROOT
from .gpu_cases import MX_K, MX_N, MX_PROGRAMS, MX_ROWS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]


def _operands(m: int, k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 5, (m, k), generator=g).to(torch.bfloat16)
    w = (torch.randint(-4, 5, (n, k), generator=g).float() / 8).to(torch.bfloat16)
    return x.cuda(), w.cuda().t()


@pytest.mark.parametrize("m", MX_ROWS)
@pytest.mark.parametrize("path", list(MX_PROGRAMS))
def test_mx_outputs_match_the_rounded_reference_exactly(path, m):
    prog = epic.compile(str(ROOT / path))
    x, w = _operands(m, MX_K, MX_N, seed=m)
    out = prog(x=x, w=w)
    ref = prog.reference(exact=False, x=x.cpu(), w=w.cpu())
    for name, want in ref.items():
        t = prog.program.tensors[name]
        got = out[name].cpu()
        got = reference.unpack_e2m1(got).double() if t.dtype.name == "e2m1" else got.double()
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
        assert same.all(), f"{name} ({t.dtype}): {(~same).sum().item()} of {want.numel()} differ"
