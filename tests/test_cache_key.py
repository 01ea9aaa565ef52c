"""The kernel cache key (runtime/build.py cache_key) and the compiled launcher's (runtime/fastcall.py
library_path), field by field.

A cached library is served to any unit with the same key, so the key must change with everything
the library depends on. The fields are listed here, by hand, not read from the code under test: a key
that loses one (say the nvcc version) would serve kernels built by another nvcc or against other
headers, and the test of that field fails. Each test changes one field and nothing else.
"""
import pytest

import epic
from epic.codegen import emit
from epic.runtime import build
from epic.runtime.build import Unit

from .conftest import ROOT

NVCC, CUTLASS, EXE = "13.0.88", "4.2.0.0", "/opt/nvcc"


@pytest.fixture(autouse=True)
def toolchain(monkeypatch):
    """A fixed nvcc and CUTLASS version (no nvcc run, no wheel needed)."""
    monkeypatch.setattr(build, "nvcc_version", lambda exe: NVCC)
    monkeypatch.setattr(build, "cutlass_paths", lambda: (CUTLASS, ["/cutlass/include"]))


def key(unit=None):
    return build.cache_key(unit or Unit("k", "__global__ void k() {}"), EXE)


def rendered() -> Unit:
    """A real gemm unit of a program with a custom node (its header is printed into the source)."""
    prog = epic.compile(str(ROOT / "samples" / "cross_entropy.epi"))
    units = [u for _, u in prog.units(dict(M=128, D=256, V=512))]
    (unit,) = [u for u in units if u.uses_cutlass]
    assert "Sm90RowLsePartial" in unit.source
    return unit


def header_changed(monkeypatch):
    """An edit to a node header: the same program, built against other node code."""
    real = emit._header_file.__wrapped__
    emit._header_file.cache_clear()
    monkeypatch.setattr(emit, "_header_file", lambda name: real(name) + "\n// edited\n")


# field -> a change of that field alone (monkeypatch) and the unit to key afterwards (None: the plain one)
FIELDS = {
    "source": lambda mp: Unit("k", "__global__ void k() { }"),
    "base flags": lambda mp: mp.setattr(build, "BASE_FLAGS", build.BASE_FLAGS[:1] + ["-O2"] + build.BASE_FLAGS[2:]),
    "nvcc version": lambda mp: mp.setattr(build, "nvcc_version", lambda exe: "12.4.131"),
    "codegen version": lambda mp: mp.setattr(build, "CODEGEN_VERSION", build.CODEGEN_VERSION + "+1"),
    "cutlass version": lambda mp: mp.setattr(build, "cutlass_paths", lambda: ("3.5.1", ["/cutlass/include"])),
}


@pytest.mark.parametrize("field", list(FIELDS))
def test_each_field_changes_the_key(field):
    before = key()
    with pytest.MonkeyPatch.context() as mp:
        unit = FIELDS[field](mp)
        after = key(unit if isinstance(unit, Unit) else None)
    assert after != before, f"the cache key does not depend on the {field}"
    assert key() == before                # nothing else moved it: the same inputs, the same key


def test_the_key_is_stable_and_ignores_the_unit_name():
    """The same inputs give the same key (a rebuild finds the entry); the name is the file's, not the key's."""
    assert key(Unit("a", "x")) == key(Unit("a", "x")) == key(Unit("b", "x"))


def test_fields_do_not_run_into_each_other(monkeypatch):
    """A character moved from the source into the flags is another key (the fields are delimited)."""
    flags = " ".join(build.BASE_FLAGS)
    monkeypatch.setattr(build, "BASE_FLAGS", ["x" + flags])
    a = key(Unit("k", "src"))
    monkeypatch.setattr(build, "BASE_FLAGS", [flags])
    assert a != key(Unit("k", "srcx"))


def test_cutlass_version_only_keys_units_that_use_cutlass(monkeypatch):
    """A combine kernel (no CUTLASS) keeps its entry across a CUTLASS upgrade; a gemm does not."""
    combine, gemm = Unit("c", "s", uses_cutlass=False), Unit("g", "s")
    before = key(combine), key(gemm)
    FIELDS["cutlass version"](monkeypatch)
    assert key(combine) == before[0] and key(gemm) != before[1]


def test_epic_version_and_node_headers_reach_the_key_through_the_source():
    """Generated sources print epic's version and the node headers they use: a new epic or an edited
    header is another key, though cache_key hashes neither by name."""
    plain = key(rendered())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(emit, "__version__", "0.0.0-other")
        assert key(rendered()) != plain, "the epic version does not reach the cache key"
    try:
        with pytest.MonkeyPatch.context() as mp:
            header_changed(mp)
            assert key(rendered()) != plain, "a node header's text does not reach the cache key"
    finally:
        emit._header_file.cache_clear()
    assert key(rendered()) == plain


# ---------------------------------------------------------------- the compiled launcher's cache entry
class _Version:
    def __init__(self, text):
        self.stdout = text


def launcher_key() -> str:
    from epic.runtime import fastcall
    return fastcall.library_path("/usr/bin/c++").parent.name


def _other_source(mp, tmp_path):
    from epic.runtime import fastcall
    other = tmp_path / "launcher.cpp"
    other.write_text(fastcall.SOURCE.read_text() + "\n// edited\n")
    mp.setattr(fastcall, "SOURCE", other)


# field -> a change of that field alone
LAUNCHER_FIELDS = {
    "source": _other_source,
    "flags": lambda mp, tmp: mp.setattr("epic.runtime.fastcall.flags", lambda: ["-O2", "-std=c++20"]),
    "torch version": lambda mp, tmp: mp.setattr("torch.__version__", "0.0.1"),
    "python version": lambda mp, tmp: mp.setattr("sys.version", "2.7.18"),
    "compiler version": lambda mp, tmp: mp.setattr(build, "version_of", lambda exe, what: _Version("g++ 7.1")),
    "launcher ABI": lambda mp, tmp: mp.setattr("epic.runtime.fastcall.ABI", -1),
}


@pytest.mark.parametrize("field", list(LAUNCHER_FIELDS))
def test_each_field_changes_the_launchers_key(monkeypatch, tmp_path, field):
    """The launcher is built against torch's headers and ABI: a key without one of these would load a
    launcher built for another torch, Python or compiler."""
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "version_of", lambda exe, what: _Version("g++ 13.2"))
    before = launcher_key()
    with pytest.MonkeyPatch.context() as mp:
        LAUNCHER_FIELDS[field](mp, tmp_path)
        after = launcher_key()
    assert after != before, f"the launcher's cache key does not depend on the {field}"
    assert launcher_key() == before
