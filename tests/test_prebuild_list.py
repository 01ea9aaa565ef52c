"""tests.prebuild's list holds the kernels of the GPU tests' cases: a kernel missing from it is built by
nvcc inside the GPU test run (minutes of device time, and a test stopped by a call's time limit), or
fails with E704 under EPIC_NO_BUILD=1 (docs/GPU.md's one-call suite run)."""
import epic
from epic.codegen import emit

from . import prebuild
from .gpu_cases import MANY_ROWS_SIZES, PROGRAMS, SIZES, groups_rows, path


def _keys(units) -> set:
    return {(u.name, u.source) for u in units}


def test_prebuild_lists_the_reference_and_many_rows_cases_kernels():
    listed = _keys(prebuild.all_units([], False))
    missing = []
    for name in PROGRAMS:
        prog = epic.compile(path(name))
        sizes = list(SIZES) + (list(MANY_ROWS_SIZES) if groups_rows(prog.program) else [])
        for size in sizes:
            dims = PROGRAMS[name](*size)
            units = emit.units(prog.program, emit.kernel_configs(prog.program, dims["M"], None, dims))
            missing += [(name, size, u.name) for _, u in units if (u.name, u.source) not in listed]
    assert not missing, f"kernels the GPU tests run that tests.prebuild does not build: {missing[:5]}"
