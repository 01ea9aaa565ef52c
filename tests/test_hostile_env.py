"""Hostile environments (issue 26, section 3): a shared cache with links out of it, FIFOs and /dev/zero
where epic reads a file, paths a shell would interpret, an nvcc that never answers `--version`. Each
is a clear diagnostic or a warning, quickly: never a hang, a deleted file of someone else, or a
command run."""
import contextlib
import os
import shutil
import signal
import warnings
from pathlib import Path

import pytest
import torch

import epic
from epic.diagnostics import EpicError
from epic.runtime import build, cache
from epic.runtime import tuning_db as database

from .conftest import ROOT
from .test_cache import Fake, epic as epic_cli, unit

BIAS_GELU = str(ROOT / "samples" / "bias_gelu.epi")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return Fake(tmp_path, monkeypatch)


class Hung(BaseException):
    """Raised out of a blocked call; not an OSError, so no `except OSError` on the way takes it for one."""


@contextlib.contextmanager
def no_hang(seconds: int = 60):
    """Fail (instead of hanging the suite) if the block blocks: SIGALRM interrupts a blocking open().
    A safety net far above what the block takes, not a measure of speed."""
    def stop(*_):
        raise Hung(f"blocked for {seconds} s")
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------- a link out of a shared cache
def victim_files(d: Path) -> dict[Path, str]:
    """Another user's directory that looks like a damaged cache entry to anything that follows a link."""
    d.mkdir()
    (d / ".tmp-work").mkdir()
    files = {d / "k.so": "not a library", d / "k.json": "{}", d / "old.json": "{}",
             d / ".tmp-work" / "notes": "mine", d / ".tmp-x": "mine"}
    for p, text in files.items():
        p.write_text(text)
    return files


@pytest.mark.parametrize("how", ["--prune", "--clean"])
def test_prune_and_clean_never_follow_a_link_out_of_the_cache(fake, capsys, tmp_path, how):
    build.build_one(unit())
    files = victim_files(tmp_path / "victim")
    link = fake.root / ("f" * 24)
    link.symlink_to(tmp_path / "victim")
    code, out, _ = epic_cli(capsys, "cache")
    assert code == 0 and "symbolic links named like entries (never followed): 1" in out and str(link) in out
    code, out, err = epic_cli(capsys, "cache", how)
    assert code == 0, err
    assert {p: p.read_text() for p in files if p.exists()} == files         # every file of the victim survives
    assert sorted(p.name for p in (tmp_path / "victim").iterdir()) == [".tmp-work", ".tmp-x", "k.json", "k.so",
                                                                       "old.json"]   # and no lock was made there
    assert not os.path.lexists(link) and f"removed {link}" in out              # the link itself goes


def test_an_entry_that_is_a_link_is_neither_served_nor_built_into(fake, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = build.library_path(unit())
    target.parent.parent.mkdir(parents=True)
    target.parent.symlink_to(elsewhere)
    with pytest.raises(EpicError) as info:
        build.build_one(unit())
    assert info.value.codes == ["E704"] and "symbolic link" in str(info.value)
    assert list(elsewhere.iterdir()) == [] and fake.calls == 0


def test_a_sound_entry_behind_a_link_is_not_served(fake, tmp_path, monkeypatch):
    lib = build.build_one(unit())                      # a sound entry, moved out and linked back in
    moved = tmp_path / "elsewhere"
    lib.parent.rename(moved)
    lib.parent.symlink_to(moved)
    assert "symbolic link" in cache.problem(lib)
    with pytest.raises(EpicError) as info:
        build.build_all([unit()], quiet=True)
    assert info.value.codes == ["E704"]


def test_nothing_outside_the_cache_is_ever_deleted(fake, tmp_path):
    outside = tmp_path / "outside.so"
    outside.write_text("mine")
    with pytest.raises(EpicError) as info:
        cache._remove(fake.root, outside)
    assert info.value.codes == ["E704"] and outside.read_text() == "mine"


@pytest.mark.parametrize("name", [cache.LOCK, "k.cu", "build.txt"])
def test_a_build_never_writes_through_a_link_planted_in_its_entry(fake, tmp_path, name):
    """A lock, source or log planted as a link to another user's file: the build replaces the link and
    neither writes the file nor creates one outside the cache."""
    existing, missing = tmp_path / "theirs.txt", tmp_path / "not-there"
    existing.write_text("mine")
    target = build.library_path(unit())
    target.parent.mkdir(parents=True)
    (target.parent / name).symlink_to(missing if name == cache.LOCK else existing)
    with no_hang():
        assert cache.problem(build.build_one(unit())) is None
    assert existing.read_text() == "mine" and not missing.exists()


def test_a_fifo_where_the_build_writes_its_log_does_not_block_it(fake):
    target = build.library_path(unit())
    target.parent.mkdir(parents=True)
    os.mkfifo(target.parent / "build.txt")
    with no_hang():
        assert cache.problem(build.build_one(unit())) is None


# ---------------------------------------------------------------- FIFOs, /dev/zero, huge files
def plant(entry_file: Path, kind: str) -> None:
    entry_file.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(entry_file)
    elif kind == "zero":
        entry_file.symlink_to("/dev/zero")
    else:                                              # a sparse file past the limit: no disk space used
        with open(entry_file, "wb") as f:
            f.truncate(cache.MAX_LIBRARY + 1)


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
@pytest.mark.parametrize("which", ["manifest", "library"])
def test_a_fifo_or_device_in_the_cache_is_a_bad_entry_not_a_hang(fake, capsys, kind, which):
    lib = build.build_one(unit())
    plant(cache.manifest_path(lib) if which == "manifest" else lib, kind)
    with no_hang():
        why = cache.problem(lib)
        assert why and ("not a regular file" in why or "at most" in why), why
        code, out, _ = epic_cli(capsys, "cache")
        assert code == 0 and "bad entries: 1" in out
        assert build.build_one(unit()) == lib and cache.problem(lib) is None     # rebuilt, not served
        assert fake.calls == 2


def test_a_fifo_lock_file_does_not_hang_the_listing(fake, capsys):
    lib = build.build_one(unit())
    os.mkfifo(lib.parent / cache.LOCK)
    with no_hang():
        code, out, _ = epic_cli(capsys, "cache")
    assert code == 0 and "entries: 1" in out


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
def test_an_unreadable_tuning_database_is_a_warning_not_a_hang(tmp_path, kind):
    db = tmp_path / "tuning.json"
    if kind == "fifo":
        os.mkfifo(db)
    elif kind == "zero":
        db.symlink_to("/dev/zero")
    else:
        with open(db, "wb") as f:
            f.truncate(database.MAX_BYTES + 1)
    with no_hang(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert database.load(db) == {}
    assert any(str(db) in str(w.message) and "ignored" in str(w.message) for w in caught)


def test_plan_tuned_with_a_fifo_database_answers(tmp_path, capsys):
    db = tmp_path / "tuning.fifo"
    os.mkfifo(db)
    with no_hang():
        code, out, err = epic_cli(capsys, "plan", BIAS_GELU, "--shape", "M=256,N=256,K=256", "--tuned",
                                  "--db", str(db))
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_fifo_or_device_as_the_program_is_E802(tmp_path, kind):
    path = tmp_path / "p.epi"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with no_hang(), pytest.raises(EpicError) as info:
        epic.compile(str(path))
    assert info.value.codes == ["E802"] and "not a regular file" in str(info.value)


# ---------------------------------------------------------------- paths a shell would interpret
def test_a_cache_path_with_shell_syntax_is_refused_before_nvcc_runs(fake, monkeypatch, tmp_path):
    marker = tmp_path / "executed"
    root = tmp_path / f"c$(touch {marker})"
    monkeypatch.setenv("EPIC_CACHE_DIR", str(root))
    with pytest.raises(EpicError) as info:
        build.build_one(unit())
    assert info.value.codes == ["E704"] and "'$'" in str(info.value) and "EPIC_CACHE_DIR" in str(info.value)
    assert fake.calls == 0 and not marker.exists() and not root.exists()


@pytest.mark.parametrize("char", list("`\\\"';&|<>()*?[]{}~!#") + ["\n", "\t"])
def test_every_character_a_shell_interprets_is_refused(fake, monkeypatch, tmp_path, char):
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / f"c{char}d"))
    with pytest.raises(EpicError) as info:
        build.build_one(unit())
    assert info.value.codes == ["E704"] and fake.calls == 0


def test_an_nvcc_installed_under_shell_syntax_is_E705(fake, monkeypatch, tmp_path):
    where = tmp_path / "cuda;x" / "bin"
    where.mkdir(parents=True)
    shutil.copy(fake.exe, where / "nvcc")
    monkeypatch.setenv("EPIC_NVCC", str(where / "nvcc"))
    with pytest.raises(EpicError) as info:
        build.build_one(unit())
    assert info.value.codes == ["E705"] and "';'" in str(info.value) and fake.calls == 0


def test_spaces_are_fine(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "my cache"))
    assert cache.problem(build.build_one(unit())) is None


@pytest.mark.nvcc
def test_real_nvcc_runs_nothing_from_a_hostile_cache_path(tmp_path, monkeypatch):
    """nvcc itself runs its steps through a shell: without the check, this build runs `touch`."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    marker = tmp_path / "executed"
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / f"c$(touch {marker})"))
    monkeypatch.delenv("EPIC_NVCC", raising=False)
    build.nvcc_version.cache_clear()
    with pytest.raises(EpicError) as info:
        build.build_one(build.Unit("k", 'extern "C" int f() { return 1; }\n', uses_cutlass=False))
    assert info.value.codes == ["E704"] and not marker.exists()


# ---------------------------------------------------------------- an nvcc that never answers
def test_a_hanging_version_probe_is_E705_saying_so(fake, monkeypatch):
    fake.mode("version-hang")
    monkeypatch.setattr(build, "VERSION_TIMEOUT", 0.5)
    with no_hang(), pytest.raises(EpicError) as info:
        build.build_one(unit())
    assert info.value.codes == ["E705"] and "--version` did not answer in 0.5 s" in str(info.value)
    assert fake.calls == 0


def test_a_hanging_compiler_version_probe_is_bounded(tmp_path, monkeypatch):
    """The launcher's C++ compiler is asked its version too: a hang is a warning after the timeout (calls
    take the ctypes path), not a wait of a minute or more."""
    from epic.runtime import fastcall
    cxx = tmp_path / "c++"
    cxx.write_text("#!/bin/sh\nsleep 1000\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EPIC_LAUNCHER", "compiled")
    monkeypatch.setattr(build, "VERSION_TIMEOUT", 0.5)
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
    with no_hang(), pytest.warns(RuntimeWarning, match="did not answer in 0.5 s"):
        assert fastcall.library() is None


# ---------------------------------------------------------------- sizes the kernels cannot index
RMSNORM = str(ROOT / "samples" / "residual_rmsnorm.epi")     # a gemm and a row combine kernel
COL_STATS = str(ROOT / "tests" / "programs" / "col_stats.epi")  # a column combine kernel


@pytest.mark.parametrize("shape", ["M=2147483648,N=256,K=256", "M=256,N=2147483648,K=256",
                                   "M=256,N=256,K=2147483648", "M=4294967296,N=256,K=256"])
def test_plan_refuses_gemm_sizes_past_32_bits(capsys, shape):
    code, _, err = epic_cli(capsys, "plan", BIAS_GELU, "--shape", shape)
    assert code == 2 and "E607" in err and "32-bit" in err and "Traceback" not in err


def test_plan_takes_the_largest_sizes_the_kernels_index(capsys):
    code, out, err = epic_cli(capsys, "plan", BIAS_GELU, "--shape", "M=2147483647,N=256,K=256")
    assert code == 0, err
    code, out, err = epic_cli(capsys, "plan", RMSNORM, "--shape", f"M={2**27},D=256")
    assert code == 0, err


@pytest.mark.parametrize("program, shape", [(RMSNORM, f"M={2**27 + 1},D=256"),
                                            (COL_STATS, f"M=256,N={2**27 + 8},K=256")])
def test_plan_refuses_rows_or_columns_past_the_combine_kernels_index(capsys, program, shape):
    code, _, err = epic_cli(capsys, "plan", program, "--shape", shape)
    assert code == 2 and "E607" in err and "combine kernel" in err and "134,217,728" in err


def huge(rows: int, cols: int, dtype=torch.bfloat16, kmajor: bool = False) -> torch.Tensor:
    """A tensor of that shape that allocates one row (stride 0 along the rows)."""
    x = torch.empty(1, cols, dtype=dtype).expand(rows, cols)
    return x.t() if kmajor else x


def test_a_call_with_2_31_rows_is_E607_before_anything_launches():
    prog = epic.compile(BIAS_GELU)
    with pytest.raises(EpicError) as info:
        prog(x=huge(2**31, 256), w=huge(256, 256, kmajor=True), bias=torch.empty(256, dtype=torch.bfloat16))
    assert info.value.codes == ["E607"] and "M = 2,147,483,648" in str(info.value)


def test_a_call_past_the_combine_kernels_rows_is_E607():
    prog = epic.compile(RMSNORM)
    d = 256
    with pytest.raises(EpicError) as info:
        prog(x=huge(2**27 + 8, d), wo=huge(d, d, kmajor=True), z=huge(2**27 + 8, d),
             gamma=torch.empty(d, dtype=torch.bfloat16))
    assert info.value.codes == ["E607"] and "combine kernel" in str(info.value)


def test_the_launcher_build_never_writes_its_log_through_a_planted_link(tmp_path, monkeypatch):
    """The compiled launcher's entry gets the same care: a failed build's log planted as a link to
    another user's file replaces the link and leaves the file alone."""
    import subprocess

    from epic.runtime import fastcall
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("mine")
    target = tmp_path / "cache" / "entry" / "epic_launcher.so"
    target.parent.mkdir(parents=True)
    target.with_suffix(".log").symlink_to(theirs)
    monkeypatch.setattr(build, "_run", lambda cmd, *a, **k: subprocess.CompletedProcess(cmd, 1, "", "failed"))
    with pytest.raises(fastcall._Unavailable):
        fastcall._compile("c++", target)
    assert theirs.read_text() == "mine"
    assert "failed" in target.with_suffix(".log").read_text() and not target.with_suffix(".log").is_symlink()
