"""Kernel bundles (epic/runtime/bundle.py): `epic build FILE --bundle DIR` and EPIC_BUNDLE lookups.
A fake nvcc (tests/test_cache.py) builds in no time; the real one runs in the test marked nvcc."""
import json
import os
import shutil

import pytest

from epic.diagnostics import EpicError
from epic.runtime import build, bundle, bundle_build, cache
from epic.runtime.compiled import CompiledProgram
from epic import pipeline

from .test_cache import Fake, epic, unit

PLAIN = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n"
SHAPE = "M=64,K=256,N=256"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = Fake(tmp_path, monkeypatch)
    monkeypatch.delenv("EPIC_BUNDLE", raising=False)
    monkeypatch.setenv("EPIC_LAUNCHER", "ctypes")
    return f


def program_file(tmp_path, text=PLAIN):
    p = tmp_path / "plain.epi"
    p.write_text(text)
    return p


def plain_units(path, shape=SHAPE):
    analysis = pipeline.analyze(str(path), path=True)
    sizes = dict(kv.split("=") for kv in shape.split(","))
    return [u for _, u in CompiledProgram(analysis).units({k: int(v) for k, v in sizes.items()})]


def make_bundle(fake, capsys, tmp_path, *extra):
    prog = program_file(tmp_path)
    out = tmp_path / "bundle"
    code, _, err = epic(capsys, "build", str(prog), "--shape", SHAPE, "--bundle", str(out), *extra)
    assert code == 0, err
    return prog, out


def fresh_machine(fake, monkeypatch, tmp_path, out):
    """Another machine: an empty cache, only prebuilt kernels, the bundle."""
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "other-cache"))
    monkeypatch.setenv("EPIC_NO_BUILD", "1")
    monkeypatch.setenv("EPIC_BUNDLE", str(out))


def only_library(out):
    (lib,) = out.glob("*/*.so")
    return lib


# ---------------------------------------------------------------- writing
def test_index_names_program_versions_and_kernels(fake, capsys, tmp_path):
    prog, out = make_bundle(fake, capsys, tmp_path)
    index = json.loads((out / bundle.INDEX).read_text())
    lib = only_library(out)
    (u,) = plain_units(prog)
    assert index["format"] == bundle.FORMAT
    assert index["nvcc_version"] == "13.0.88" and index["cutlass_version"] == build.cutlass_paths()[0]
    assert index["codegen_version"] == build.CODEGEN_VERSION and index["epic_version"]
    assert list(index["kernels"]) == [f"{lib.parent.name}/{lib.name}"]
    assert index["kernels"][f"{lib.parent.name}/{lib.name}"]["kernel"] == u.name
    (entry,) = index["programs"].values()
    import hashlib
    assert entry["source_sha256"] == hashlib.sha256(prog.read_bytes()).hexdigest()
    assert entry["sizes"] == {"M": 64, "K": 256, "N": 256} and entry["kernels"] == list(index["kernels"])
    assert lib.parent.name == build.cache_key(u, build.nvcc_path()) and cache.problem(lib) is None


def test_rows_build_one_configuration_per_row_count_and_gpu(fake, capsys, tmp_path):
    """M = 64 and 8192 at N = 256: one kernel each, and at 8192 the H100's own (plan/gpus.py)."""
    _, out = make_bundle(fake, capsys, tmp_path, "--rows", "64,8192")
    assert sorted(p.name for p in out.glob("*/*.so")) == ["g.coop_128x256x64_c2x1.so", "g.ping_128x128x64_c2x1.so",
                                                          "g.ping_64x64x64_c1x1.so"]
    assert len(json.loads((out / bundle.INDEX).read_text())["kernels"]) == 3


def test_a_second_program_joins_the_bundle(fake, capsys, tmp_path):
    _, out = make_bundle(fake, capsys, tmp_path)
    other = tmp_path / "other.epi"
    other.write_text(PLAIN.replace("acc", "acc * 2.0"))
    code, _, err = epic(capsys, "build", str(other), "--shape", SHAPE, "--bundle", str(out))
    assert code == 0, err
    index = json.loads((out / bundle.INDEX).read_text())
    assert len(index["programs"]) == 2 and len(index["kernels"]) == 2


def test_tuning_entries_of_the_program_ship_with_it(fake, capsys, tmp_path, monkeypatch):
    from epic.runtime import tuning_db
    prog = program_file(tmp_path)
    analysis = pipeline.analyze(str(prog), path=True)
    db = tmp_path / "tuning.json"
    monkeypatch.setenv("EPIC_TUNING", str(db))
    key = tuning_db.store(analysis.program, {"M": 64, "K": 256, "N": 256}, "NVIDIA H200",
                          {"configs": {"g": {"tile": [128, 64, 64]}}, "ms": 1.0})
    tuning_db.store(pipeline.analyze(PLAIN.replace("acc", "acc + 1.0"), name="o.epi").program,
                    {"M": 64, "K": 256, "N": 256}, "NVIDIA H200", {"configs": {}, "ms": 1.0})
    out = tmp_path / "bundle"
    code, _, err = epic(capsys, "build", str(prog), "--shape", SHAPE, "--bundle", str(out))
    assert code == 0, err
    assert list(tuning_db.load(out / bundle.TUNING)) == [key]       # this program's entry only
    assert len(list(out.glob("*/*.so"))) == 2                         # the heuristic's tile and the tuned one


# ---------------------------------------------------------------- serving
def test_a_fresh_cache_with_no_build_finds_the_bundle(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    calls = fake.calls
    fresh_machine(fake, monkeypatch, tmp_path, out)
    (u,) = plain_units(prog)
    assert build.library_path(u) == only_library(out)
    assert build.build_all([u], quiet=True) == [only_library(out)]
    assert fake.calls == calls and not (tmp_path / "other-cache").exists()


def test_without_nvcc_the_bundle_is_served_under_its_own_versions(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    monkeypatch.setenv("EPIC_NVCC", str(tmp_path / "no-nvcc-here"))
    (u,) = plain_units(prog)
    assert build.library_path(u) == only_library(out)


def test_a_bundle_for_other_sources_is_not_served(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    (u,) = plain_units(prog)
    other = build.Unit(u.name, u.source + "// another epic\n")
    assert not build.library_path(other).is_relative_to(out)
    assert "E704" in str(pytest.raises(EpicError, build.build_one, other).value)


def test_a_bundle_built_by_another_nvcc_is_not_served(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    monkeypatch.setattr(build, "nvcc_version", lambda exe: "12.4.131")
    (u,) = plain_units(prog)
    assert not build.library_path(u).is_relative_to(out)


def test_a_tampered_library_is_refused(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    lib = only_library(out)
    data = bytearray(lib.read_bytes())
    data[-1] ^= 1                                   # same size: only the sha256 tells
    lib.write_bytes(bytes(data))
    (u,) = plain_units(prog)
    assert not build.library_path(u).is_relative_to(out)
    err = pytest.raises(EpicError, build.build_one, u).value
    assert "E704" in str(err) and "nor in a bundle" in str(err)


def test_a_damaged_bundle_is_never_built_into(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    monkeypatch.delenv("EPIC_NO_BUILD")
    lib = only_library(out)
    lib.write_bytes(lib.read_bytes()[:100])
    before = sorted(p.name for p in lib.parent.iterdir())
    (u,) = plain_units(prog)
    built = build.build_one(u)
    assert built.is_relative_to(tmp_path / "other-cache") and cache.problem(built) is None
    assert sorted(p.name for p in lib.parent.iterdir()) == before and len(lib.read_bytes()) == 100


@pytest.mark.parametrize("what", ["library", "manifest", "entry"])
def test_symbolic_links_in_a_bundle_are_not_followed(fake, capsys, tmp_path, monkeypatch, what):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    lib = only_library(out)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(lib.parent, elsewhere / lib.parent.name)
    if what == "entry":
        shutil.rmtree(lib.parent)
        lib.parent.symlink_to(elsewhere / lib.parent.name)
    else:
        path = lib if what == "library" else cache.manifest_path(lib)
        path.unlink()
        path.symlink_to(elsewhere / lib.parent.name / path.name)
    (u,) = plain_units(prog)
    assert not build.library_path(u).is_relative_to(out)


def test_a_fifo_in_a_bundle_is_refused_without_blocking(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    lib = only_library(out)
    lib.unlink()
    os.mkfifo(lib)
    (u,) = plain_units(prog)
    assert not build.library_path(u).is_relative_to(out)


def test_every_bundle_of_the_list_is_looked_in(fake, capsys, tmp_path, monkeypatch):
    prog, out = make_bundle(fake, capsys, tmp_path)
    fresh_machine(fake, monkeypatch, tmp_path, out)
    (tmp_path / "empty-bundle").mkdir()
    monkeypatch.setenv("EPIC_BUNDLE", f"{tmp_path / 'empty-bundle'}{os.pathsep}{out}")
    (u,) = plain_units(prog)
    assert build.library_path(u) == only_library(out)


def test_a_bundle_that_is_not_a_directory_is_E706(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("EPIC_BUNDLE", str(tmp_path / "missing"))
    assert "E706" in str(pytest.raises(EpicError, build.library_path, unit()).value)


# ---------------------------------------------------------------- the command line's errors
@pytest.mark.parametrize("setup, words", [
    (lambda p: p.write_text("x"), "is not a directory"),
    (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")), "holds no epic-bundle.json"),
    (lambda p: (p.mkdir(), (p / bundle.INDEX).write_text("[]")), "not a bundle index"),
    (lambda p: p.symlink_to(p.parent), "symbolic link"),
    (lambda p: (p.mkdir(), os.mkfifo(p / bundle.INDEX)), "not a bundle index"),     # refused, not read
])
def test_a_bad_bundle_path_is_E801_before_nvcc_runs(fake, capsys, tmp_path, setup, words):
    prog = program_file(tmp_path)
    target = tmp_path / "target"
    setup(target)
    code, out, err = epic(capsys, "build", str(prog), "--shape", SHAPE, "--bundle", str(target))
    assert code == 2 and "E801" in err and words in err and "Traceback" not in err
    assert fake.calls == 0


def test_a_bundle_of_another_build_is_E801(fake, capsys, tmp_path, monkeypatch):
    _, out = make_bundle(fake, capsys, tmp_path)
    monkeypatch.setattr(build, "nvcc_version", lambda exe: "12.4.131")
    code, _, err = epic(capsys, "build", str(program_file(tmp_path)), "--shape", SHAPE, "--bundle", str(out))
    assert code == 2 and "E801" in err and "nvcc_version 13.0.88" in err


@pytest.mark.parametrize("rows", ["", "64,x", "0", "64,,8192"])
def test_bad_rows_are_E801(fake, capsys, tmp_path, rows):
    code, _, err = epic(capsys, "build", str(program_file(tmp_path)), "--rows", rows)
    assert code == 2 and "E801" in err and "--rows" in err


# ---------------------------------------------------------------- the real nvcc (about a minute)
@pytest.mark.nvcc
def test_real_bundle_serves_a_fresh_cache_without_nvcc_runs(tmp_path, monkeypatch, capsys):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    for k in ("EPIC_NVCC", "EPIC_BUNDLE", "EPIC_NO_BUILD"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    build.nvcc_version.cache_clear()
    prog = program_file(tmp_path)
    code, _, err = epic(capsys, "build", str(prog), "--shape", SHAPE, "--bundle", str(tmp_path / "b"))
    assert code == 0, err
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("EPIC_NO_BUILD", "1")
    monkeypatch.setenv("EPIC_BUNDLE", str(tmp_path / "b"))
    (u,) = plain_units(prog)
    path = build.build_all([u], quiet=True)[0]
    assert path == only_library(tmp_path / "b") and cache.problem(path) is None
    assert bundle_build.units(pipeline.analyze(str(prog), path=True).program, {"M": 64, "K": 256, "N": 256},
                              None)[0].source == u.source
