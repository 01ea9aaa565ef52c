"""A compiled program's kernels are generated, built and loaded once per plan configuration
(epic/runtime/kernels.py): signatures whose plans agree share them, and a configuration already
loaded is ready at once under EPIC_BUILD_IN_BACKGROUND; the launch flags of each gemm (a decode gemm
after another kernel of the call is that kernel's programmatic dependent). nvcc and the loader are
stand-ins here."""
from pathlib import Path

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


MLP = str(Path(__file__).resolve().parents[1] / "samples" / "prenorm_mlp.epi")


def _gemm_flags(bound):
    """The launch flags (sizes[6]) of each gemm launch, in launch order."""
    return [(l.library.path.rsplit("/", 1)[-1].split(".")[0], l.dims[6]) for l in bound.launches if len(l.dims) == 7]


def test_decode_gemms_after_the_first_kernel_of_a_call_are_programmatic_dependents(builds, monkeypatch):
    sizes = dict(M=64, D=256, F=512)
    bound = epic.compile(MLP)._bind(sizes, NO_DEVICE)
    # o_proj opens the call: in stream order; gate_up follows the combine kernel, down gate_up
    assert _gemm_flags(bound) == [("o_proj", 0), ("gate_up", 3), ("down", 3)]    # 2: B prefetched into L2
    assert len(bound.launches) == 4           # the combine kernel between o_proj and gate_up
    monkeypatch.setenv("EPIC_DEPENDENT_PREFETCH", "0")
    assert _gemm_flags(epic.compile(MLP)._bind(sizes, NO_DEVICE)) == [("o_proj", 0), ("gate_up", 1), ("down", 1)]
    monkeypatch.setenv("EPIC_DEPENDENT_LAUNCH", "0")
    assert _gemm_flags(epic.compile(MLP)._bind(sizes, NO_DEVICE)) == [("o_proj", 0), ("gate_up", 0), ("down", 0)]


RESID_NORM = str(Path(__file__).resolve().parents[1] / "samples" / "residual_rmsnorm.epi")


def test_a_one_gemm_programs_gemm_follows_the_callers_last_kernel(builds, monkeypatch):
    # back-to-back one-gemm programs at M = 64 measured 1.168 of cuBLAS against 1.247 in stream order,
    # chains level or better in order (epic/plan/launch.py)
    from epic.diagnostics import EpicError

    def flags(program, **sizes):
        return _gemm_flags(epic.compile(program)._bind(sizes, NO_DEVICE))
    monkeypatch.setenv("EPIC_DEPENDENT_FIRST", "0")
    assert flags(RESID_NORM, M=64, D=256) == [("o_proj", 0)]                      # switched off
    monkeypatch.delenv("EPIC_DEPENDENT_FIRST")                                    # on by default
    bound = epic.compile(RESID_NORM)._bind(dict(M=64, D=256), NO_DEVICE)
    assert _gemm_flags(bound) == [("o_proj", 3)] and len(bound.launches) == 2     # and its combine kernel
    assert flags(RESID_NORM, M=65, D=256) == [("o_proj", 0)]
    assert flags(MLP, M=64, D=256, F=512) == [("o_proj", 0), ("gate_up", 3), ("down", 3)]   # a chain's: in order
    monkeypatch.setenv("EPIC_DEPENDENT_LAUNCH", "0")
    assert flags(RESID_NORM, M=64, D=256) == [("o_proj", 0)]
    monkeypatch.setenv("EPIC_DEPENDENT_LAUNCH", "1")
    monkeypatch.setenv("EPIC_DEPENDENT_FIRST", "maybe")
    assert pytest.raises(EpicError, flags, RESID_NORM, M=64, D=256).value.codes == ["E706"]


def test_gemms_of_more_than_one_row_of_decode_tiles_are_launched_in_stream_order(builds):
    # above DEPENDENT_ROWS the chains measured slower with dependents (epic/plan/launch.py)
    bound = epic.compile(MLP)._bind(dict(M=65, D=256, F=512), NO_DEVICE)
    assert _gemm_flags(bound) == [("o_proj", 0), ("gate_up", 0), ("down", 0)]


def test_a_launch_switch_that_is_neither_on_nor_off_is_E706(builds, monkeypatch):
    from epic.diagnostics import EpicError
    monkeypatch.setenv("EPIC_DEPENDENT_LAUNCH", "sometimes")
    e = pytest.raises(EpicError, epic.compile(MLP)._bind, dict(M=64, D=256, F=512), NO_DEVICE).value
    assert e.codes == ["E706"] and "EPIC_DEPENDENT_LAUNCH" in str(e)


def test_the_prefetch_is_asked_for_only_with_one_row_of_tiles(monkeypatch):
    # its first tile is the CTA's column block only then (templates/nodes/epic_nodes/l2_prefetch_mainloop.hpp)
    from epic.plan import config, launch
    monkeypatch.setattr(launch, "DEPENDENT_ROWS", 256)          # were the limit raised
    tile64 = config.KernelConfig("pingpong", (64, 64, 64))
    assert [launch.gemm_flags(True, m, tile64) for m in (64, 65)] == [3, 1]
    monkeypatch.setattr(launch, "FIRST_DEPENDENT", "none")
    assert launch.gemm_flags(False, 64, tile64, one_gemm=True) == 0       # a call's first, with the rule off
    monkeypatch.setattr(launch, "FIRST_DEPENDENT", "one-gemm")
    assert launch.gemm_flags(False, 64, tile64) == 0                      # a chain's first gemm
    assert launch.gemm_flags(False, 64, tile64, one_gemm=True) == 3
    assert launch.gemm_flags(True, 64, config.KernelConfig("cooperative", (128, 64, 64), splits=2)) == 0
