"""Tiles of the widths `bench/interleaved.py --tile-widths` times (160, 176, 208; run on the H200:
docs/GPU.md). epic does not accept them yet: a bench process allows them (bench.allow_tile_widths) to
time whether a tile count that fits the 132 SMs' rounds better pays. A kernel the bench times must
compute what the program says, so each width runs here against the reference at ragged sizes (M, N
and K off the tile), outputs poisoned first: the check a width needs before epic takes it. The kernels
are in `python -m tests.prebuild`'s list (units())."""
import contextlib

import pytest
import torch

import epic

from .conftest import bench_module
from .gpu_cases import PROGRAMS, path

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

WIDTHS = (160, 176, 208)
# the workloads whose tile counts the widths are for (RoPE's QKV, bias + GELU's up projection, SwiGLU's
# gate/up), at two ragged sizes each: N = 392 and 576 leave a part tile at every width
NAMES = ("samples/rope.epi", "samples/bias_gelu.epi", "samples/swiglu.epi")
SIZES = ((8191, 392, 200), (333, 576, 136))


_BENCH = []


@contextlib.contextmanager
def widths_allowed():
    """The bench's widths allowed while inside, epic's own vocabulary restored after."""
    from epic.ir import options as vocab
    if not _BENCH:
        _BENCH.append(bench_module("bench"))
    saved = vocab.TILE_N
    _BENCH[0].allow_tile_widths(",".join(map(str, WIDTHS)))
    try:
        yield
    finally:
        vocab.TILE_N = saved


def config(program, width: int) -> dict:
    return {k.name: {"tile": (128, width, 64), "cluster": (2, 1), "schedule": "pingpong"}
            for k in program.kernels if k.kind == "gemm"}


def units(only=()):
    """The kernels this test runs (of the programs in `only`, where given), for python -m
    tests.prebuild; a kernel's text does not depend on the sizes: one per program and width."""
    from epic.codegen import emit
    out = []
    with widths_allowed():
        for name in (n for n in NAMES if not only or n in only):
            prog = epic.compile(path(name))
            sizes = PROGRAMS[name](*SIZES[0])
            for width in WIDTHS:
                out += [u for _, u in emit.units(prog.program, emit.kernel_configs(
                    prog.program, sizes["M"], config(prog.program, width), sizes))]
    return out


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", NAMES)
def test_bench_tile_widths_match_the_reference(name, width, size):
    from .test_gpu import _check_against_reference
    with widths_allowed():
        prog = epic.compile(path(name), config=config(epic.compile(path(name)).program, width))
        assert {c.tile for c in prog.plan(PROGRAMS[name](*size)).configs.values()} == {(128, width, 64)}
        _check_against_reference(prog, name, size)
