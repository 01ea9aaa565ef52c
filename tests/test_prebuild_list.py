"""tests.prebuild's list holds the kernels of the GPU tests' cases: a kernel missing from it is built by
nvcc inside the GPU test run (minutes of device time, and a test stopped by a call's time limit), or
fails with E704 under EPIC_NO_BUILD=1 (docs/GPU.md's one-call suite run)."""
import shutil
import tarfile

import pytest

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


def _fake_cache(root):
    cache = root / "cache"
    (cache / "k1").mkdir(parents=True)
    (cache / "k1" / "a.so").write_bytes(b"lib a")
    (cache / "k1" / "a.json").write_text("{}")
    (cache / "k2").mkdir()
    (cache / "k2" / "b.so").write_bytes(b"lib b")
    (cache / "k3").mkdir()                                 # an entry not asked for stays out
    (cache / "k3" / "c.so").write_bytes(b"lib c")
    return cache


@pytest.mark.parametrize("tools", [True, False], ids=["tar-and-xz", "tarfile"])
def test_pack_writes_the_entries_of_the_libraries_relative_to_the_cache(tmp_path, monkeypatch, tools):
    cache = _fake_cache(tmp_path)
    if not tools:
        monkeypatch.setattr(prebuild.shutil, "which", lambda name: None)
    elif not (shutil.which("tar") and shutil.which("xz")):
        pytest.skip("no tar or xz on this machine")
    out = tmp_path / "kernels.txz"
    n = prebuild.pack([cache / "k1" / "a.so", cache / "k2" / "b.so", cache / "k1" / "a.so"], cache, out)
    assert n == 2
    with tarfile.open(out, "r:xz") as t:
        names = sorted(m.name for m in t.getmembers() if m.isfile())
        assert names == ["k1/a.json", "k1/a.so", "k2/b.so"]
        t.extractall(tmp_path / "other", filter="data")
    assert (tmp_path / "other" / "k2" / "b.so").read_bytes() == b"lib b"


def test_pack_refuses_a_library_outside_the_cache(tmp_path):
    cache = _fake_cache(tmp_path)
    elsewhere = tmp_path / "bundle" / "k9"
    elsewhere.mkdir(parents=True)
    (elsewhere / "x.so").write_bytes(b"x")
    with pytest.raises(SystemExit, match="not in the cache folder"):
        prebuild.pack([cache / "k1" / "a.so", elsewhere / "x.so"], cache, tmp_path / "out.txz")
