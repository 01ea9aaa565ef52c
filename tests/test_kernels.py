"""A compiled program's kernels are generated, built and loaded once per plan configuration
(epic/runtime/kernels.py): signatures whose plans agree share them, and a configuration already
loaded is ready at once under EPIC_BUILD_IN_BACKGROUND. nvcc and the loader are stand-ins here."""
import pytest

import epic
from epic.runtime import build, loader

PLAIN = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n"
NO_DEVICE = -1          # torch.cuda.device(-1) selects nothing: binding runs on the CPU


class _Library:
    def __init__(self, path):
        self.path = path

    def workspace_size(self, dims):
        return 0


@pytest.fixture
def builds(monkeypatch):
    """The units each build was asked for, by kernel name."""
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    monkeypatch.delenv("EPIC_BUILD_IN_BACKGROUND", raising=False)
    asked = []

    def build_all(units, jobs=None, quiet=False):
        asked.append([u.name for u in units])
        return [f"/nowhere/{u.name}.so" for u in units]
    monkeypatch.setattr(build, "build_all", build_all)
    monkeypatch.setattr(loader, "load", lambda path, pointers: _Library(path))
    return asked


def test_signatures_whose_plans_agree_share_one_build(builds):
    prog = epic.compile(PLAIN)
    small = prog._bind(dict(M=64, K=128, N=64), NO_DEVICE)       # both 64x64 tiles
    other = prog._bind(dict(M=100, K=128, N=64), NO_DEVICE)
    assert len(builds) == 1
    assert [l.library for l in other.launches] == [l.library for l in small.launches]
    assert [l.dims[0] for l in (small.launches[0], other.launches[0])] == [64, 100]
    large = prog._bind(dict(M=8192, K=128, N=64), NO_DEVICE)     # 128x128 tiles: other kernels
    assert len(builds) == 2 and large.launches[0].library is not small.launches[0].library


def test_loaded_kernels_are_ready_without_a_background_build(builds, monkeypatch):
    prog = epic.compile(PLAIN)
    sizes = dict(M=64, K=128, N=64)
    prog._bind(sizes, NO_DEVICE)
    monkeypatch.setenv("EPIC_BUILD_IN_BACKGROUND", "1")
    assert prog._kernels_ready(("a signature",), sizes, NO_DEVICE)
    assert len(builds) == 1
