"""tests.prebuild --shard K/N: the parts split the kernels between machines, each kernel in one part."""
import subprocess
import sys

import pytest

from epic.codegen.unit import Unit

from .conftest import ROOT
from .prebuild import in_shard


def _units(n):
    return [Unit(name=f"k{i}", source=f"// kernel {i}\n") for i in range(n)]


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_every_kernel_is_in_exactly_one_part(parts):
    units = _units(200)
    counts = [sum(in_shard(u, (k, parts)) for k in range(1, parts + 1)) for u in units]
    assert counts == [1] * len(units)
    sizes = [sum(in_shard(u, (k, parts)) for u in units) for k in range(1, parts + 1)]
    assert min(sizes) > 0


@pytest.mark.parametrize("bad", ["0/3", "4/3", "a/b", "3", "1/0"])
def test_a_bad_shard_is_a_usage_error(bad):
    r = subprocess.run([sys.executable, "-m", "tests.prebuild", "--shard", bad], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "K/N" in r.stderr and "Traceback" not in r.stderr


def test_the_tests_own_sizes_name_every_dimension_of_their_programs():
    """tests.prebuild builds the kernels of gpu_cases.own_size_cases(): each case must plan as given
    (a wrong dimension name would make the prebuild build other kernels than the test runs)."""
    import epic
    from .gpu_cases import own_size_cases, path
    cases = own_size_cases()
    assert len(cases) >= 20
    for name, sizes in cases:
        prog = epic.compile(path(name))
        assert set(sizes) == set(prog.program.dims), (name, sizes, prog.program.dims)
        prog.plan(sizes)
