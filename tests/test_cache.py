"""The kernel cache under stress, with fake nvccs: a bad library is never cached or served, a broken
nvcc or cache directory is a clear diagnostic (E704/E705/E706), nothing hangs, nothing is left
behind, and `epic cache` shows, prunes and cleans it."""
import errno
import functools
import hashlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from epic.diagnostics import EpicError
from epic.runtime import build, cache, loader

# ---------------------------------------------------------------- libraries to serve
def tiny_elf(symbols=cache.EXPORTS, order="<") -> bytes:
    """The smallest ELF64 shared object the ELF check accepts: header, a PT_LOAD and a PT_DYNAMIC
    segment, .dynstr and .dynsym sections exporting `symbols`. Not loadable; for fake nvccs."""
    names = b"\0" + b"".join(s.encode() + b"\0" for s in symbols)
    dynstr = 176                                              # after the header and 2 program headers
    dynsym = (dynstr + len(names) + 7) // 8 * 8
    syms, at = [bytes(24)], 1
    for s in symbols:
        syms.append(struct.pack(order + "IBBHQQ", at, 0x12, 0, 2, 0, 0))   # GLOBAL FUNC, defined
        at += len(s) + 1
    shoff = dynsym + 24 * len(syms)
    size = shoff + 3 * 64
    out = bytearray(size)
    out[:16] = b"\x7fELF" + bytes([2, 1 if order == "<" else 2, 1]) + bytes(9)
    struct.pack_into(order + "HHIQQQIHHHHHH", out, 16, 3, 62, 1, 0, 64, shoff, 0, 64, 56, 2, 64, 3, 0)
    struct.pack_into(order + "IIQQQQQQ", out, 64, 1, 5, 0, 0, 0, size, size, 4096)     # PT_LOAD
    struct.pack_into(order + "IIQQQQQQ", out, 120, 2, 6, 0, 0, 0, 0, 0, 8)             # PT_DYNAMIC
    out[dynstr:dynstr + len(names)] = names
    out[dynsym:shoff] = b"".join(syms)
    struct.pack_into(order + "IIQQQQIIQQ", out, shoff + 64, 0, 3, 2, 0, dynstr, len(names), 0, 0, 1, 0)
    struct.pack_into(order + "IIQQQQIIQQ", out, shoff + 128, 0, 11, 2, 0, dynsym, 24 * len(syms), 1, 1, 8, 24)
    return bytes(out)


# A real kernel library stand-in: plain C with epic's three entry points (gcc builds it).
TINY_C = textwrap.dedent("""\
    #define API __attribute__((visibility("default")))
    API int epic_launch(void* const* p, const long long* s, const float* f, void* st, void* w, unsigned long n)
    { return 0; }
    API unsigned long epic_workspace_size(const long long* s) { return 0; }
    API const char* epic_info(void) { return "{\\"kernel\\": \\"tiny\\", \\"ptrs\\": [\\"A:x\\"]}"; }
    """)
HAVE_GCC = shutil.which("gcc") is not None
needs_gcc = pytest.mark.skipif(not HAVE_GCC, reason="gcc not installed")


@functools.lru_cache(maxsize=None)
def gcc_so() -> bytes:
    """TINY_C built by gcc: a real, loadable shared object (about 15 KB)."""
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "tiny.c", Path(d) / "tiny.so"
        src.write_text(TINY_C)
        subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
        return out.read_bytes()


# ---------------------------------------------------------------- fake nvccs
FAKE_NVCC = textwrap.dedent("""\
    #!{python}
    import os, signal, subprocess, sys, time
    mode = os.environ.get("FAKE_NVCC_MODE", "ok")
    if "--version" in sys.argv:
        if mode == "version-hang":
            time.sleep(1000)
        if mode == "version-fail":
            print("nvcc: broken installation", file=sys.stderr); sys.exit(3)
        print("Cuda compilation tools, release 13.0, V13.0.88"); sys.exit(0)
    if "-dryrun" in sys.argv:     # no steps to split (epic/runtime/nvcc_split.py): epic runs plain nvcc
        sys.exit(0)
    with open(os.environ["FAKE_NVCC_LOG"], "a") as f:
        f.write("called\\n")
    src = next(a for a in sys.argv if a.endswith(".cu"))
    out = sys.argv[sys.argv.index("-o") + 1]
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "tmpxft_fake.ii"), "w") as f:
        f.write("a temporary, as nvcc leaves in TMPDIR")
    if mode == "ok":
        open(out, "wb").write(open(os.environ["FAKE_NVCC_SO"], "rb").read())
    elif mode == "gcc":
        subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", src, "-o", out], check=True)
    elif mode == "garbage":
        open(out, "wb").write(os.urandom(4096))
    elif mode == "truncated":
        data = open(os.environ["FAKE_NVCC_SO"], "rb").read()
        open(out, "wb").write(data[:len(data) // 2])
    elif mode == "fail":
        print(src + "(3): error: this is a planted failure", file=sys.stderr); sys.exit(1)
    elif mode == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "hang":                        # nvcc waiting on a child (cicc, ptxas) that never ends
        child = subprocess.Popen(["sleep", "1000"])
        pids = os.environ["FAKE_NVCC_PIDS"]
        open(pids + ".part", "w").write(f"{{os.getpid()}} {{child.pid}}")
        os.replace(pids + ".part", pids)
        child.wait()
    # mode "empty": exit 0 and write nothing
""")


class Fake:
    def __init__(self, tmp_path: Path, monkeypatch):
        self.dir, self.mp = tmp_path, monkeypatch
        self.exe = tmp_path / "nvcc"
        self.exe.write_text(FAKE_NVCC.format(python=sys.executable))
        self.exe.chmod(self.exe.stat().st_mode | stat.S_IEXEC)
        self.log = tmp_path / "calls.log"
        self.log.write_text("")
        self.root = tmp_path / "cache"
        self.pids = tmp_path / "pids"
        self.so = tmp_path / "fake.so"
        self.so.write_bytes(tiny_elf())
        for k, v in {"EPIC_NVCC": self.exe, "FAKE_NVCC_LOG": self.log, "EPIC_CACHE_DIR": self.root,
                     "FAKE_NVCC_PIDS": self.pids, "FAKE_NVCC_SO": self.so}.items():
            monkeypatch.setenv(k, str(v))
        for k in ("EPIC_NO_BUILD", "EPIC_NVCC_TIMEOUT", "FAKE_NVCC_MODE"):
            monkeypatch.delenv(k, raising=False)
        build.nvcc_version.cache_clear()

    def mode(self, mode: str) -> None:
        self.mp.setenv("FAKE_NVCC_MODE", mode)

    @property
    def calls(self) -> int:
        return self.log.read_text().count("called")

    def files(self) -> list[str]:
        """Every path under the cache, relative to it."""
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*")) if self.root.exists() else []


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return Fake(tmp_path, monkeypatch)


def unit(text="// kernel\n", name="k", **kw) -> build.Unit:
    return build.Unit(name, text, uses_cutlass=False, **kw)


def tiny_unit() -> build.Unit:
    return build.Unit("tiny", TINY_C, uses_cutlass=False)


def codes(fn, *args) -> list[str]:
    with pytest.raises(EpicError) as info:
        fn(*args)
    return info.value.codes


def error(fn, *args) -> EpicError:
    with pytest.raises(EpicError) as info:
        fn(*args)
    return info.value


def no_litter(fake: Fake) -> None:
    leftovers = [f for f in fake.files() if cache.TMP_PREFIX in f or f.endswith(cache.LOCK)]
    assert leftovers == []


def alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (PID 1 in a container may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids, seconds=10.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------- the ELF check
def test_elf_check_accepts_good_libraries():
    assert cache.library_problem(tiny_elf()) is None
    assert cache.library_problem(tiny_elf(order=">")) is None
    assert "does not export epic_info" in cache.library_problem(tiny_elf(cache.EXPORTS[:2]))
    if HAVE_GCC:
        assert cache.EXPORTS[0] in cache.elf_exports(gcc_so())
        assert cache.library_problem(gcc_so()) is None


@pytest.mark.parametrize("data, why", [
    (b"", "not an ELF file"), (b"built", "not an ELF file"), (b"\x7fELF" + bytes(60), "not a 64-bit"),
    (tiny_elf()[:4] + b"\x01" + tiny_elf()[5:], "not a 64-bit"),
    (tiny_elf()[:16] + b"\x02" + tiny_elf()[17:], "not a shared object"),      # ET_EXEC
    (tiny_elf()[:-1], "truncated: the section header table"),
])
def test_elf_check_rejects(data, why):
    assert why in cache.library_problem(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_truncation_is_rejected(data):
    for lib in [tiny_elf()] + ([gcc_so()] if HAVE_GCC else []):
        cut = data.draw(st.integers(0, len(lib) - 1))
        assert cache.library_problem(lib[:cut]) is not None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_garbage_is_rejected_without_crashing(junk, with_header):
    data = (tiny_elf()[:64] + junk) if with_header else junk
    assert cache.library_problem(data) is not None


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_headers_never_crash_the_check(data):
    """Overwrite any few bytes of a good library (header fields, tables): the check answers, never raises."""
    lib = bytearray(data.draw(st.sampled_from([tiny_elf()] + ([gcc_so()] if HAVE_GCC else []))))
    at = data.draw(st.integers(0, len(lib) - 1))
    patch = data.draw(st.binary(min_size=1, max_size=8))
    lib[at:at + len(patch)] = patch
    why = cache.library_problem(bytes(lib))
    assert why is None or isinstance(why, str)


# ---------------------------------------------------------------- a good build, and what it leaves
def test_good_build_writes_a_matching_manifest(fake):
    path = build.build_one(unit(expect={"kernel": "k"}))
    m = json.loads(cache.manifest_path(path).read_text())
    data = path.read_bytes()
    assert m["sha256"] == hashlib.sha256(data).hexdigest() and m["size"] == len(data)
    assert m["key"] == path.parent.name and m["library"] == path.name
    assert m["symbols"] == sorted(cache.EXPORTS) and m["expect"] == {"kernel": "k"} and m["epic_version"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["build.txt", "k.cu", "k.json", "k.so"]
    assert cache.problem(path) is None


def test_a_damaged_entry_is_rebuilt_not_served(fake):
    path = build.build_one(unit())
    with open(path, "r+b") as f:
        f.truncate(100)
    assert build.build_all([unit()], quiet=True) == [path]
    assert fake.calls == 2 and cache.problem(path) is None


# ---------------------------------------------------------------- corrupted entries, loaded in a subprocess
LOAD = textwrap.dedent("""\
    import sys
    from epic.diagnostics import EpicError
    from epic.runtime import build, loader
    try:
        path = build.build_all([build.Unit("tiny", {source!r}, uses_cutlass=False)], quiet=True)[0]
        print(loader.load(path, ["A:x"]).info["kernel"])
    except EpicError as e:
        print("codes", *e.codes)
        print(e, file=sys.stderr)
    """)


def load_in_subprocess(**env) -> subprocess.CompletedProcess:
    code = LOAD.format(source=TINY_C)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)})


def _truncate(lib):
    lib.write_bytes(lib.read_bytes()[:len(lib.read_bytes()) // 2])


def _truncate_and_match(lib):
    """A truncated library whose manifest agrees with it: only the ELF check stands before dlopen."""
    _truncate(lib)
    data = lib.read_bytes()
    m = json.loads(cache.manifest_path(lib).read_text())
    cache.manifest_path(lib).write_text(json.dumps({**m, "size": len(data),
                                                    "sha256": hashlib.sha256(data).hexdigest()}))


def _flip(lib):
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated": _truncate,
    "truncated, manifest rewritten to match": _truncate_and_match,
    "byte flipped": _flip,
    "emptied": lambda lib: lib.write_bytes(b""),
    "no manifest": lambda lib: cache.manifest_path(lib).unlink(),
    "manifest not JSON": lambda lib: cache.manifest_path(lib).write_text("{"),
    "manifest of another size": lambda lib: cache.manifest_path(lib).write_text(
        json.dumps({**json.loads(cache.manifest_path(lib).read_text()), "size": 1})),
    "replaced by a library without epic_info": lambda lib: lib.write_bytes(tiny_elf(cache.EXPORTS[:2])),
}


@needs_gcc
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupted_entry_is_rebuilt_on_load(fake, corruption):
    fake.mode("gcc")
    first = load_in_subprocess()
    assert (first.returncode, first.stdout) == (0, "tiny\n"), first.stderr
    lib = next(fake.root.rglob("tiny.so"))
    CORRUPTIONS[corruption](lib)
    again = load_in_subprocess()
    assert again.returncode == 0, f"crashed: {again.returncode} {again.stderr}"   # a signal shows as < 0
    assert again.stdout == "tiny\n", again.stderr
    assert fake.calls == 2 and cache.problem(lib) is None
    no_litter(fake)


@needs_gcc
@pytest.mark.parametrize("corruption", ["truncated", "no manifest"])
def test_corrupted_entry_with_no_build_is_a_diagnostic(fake, corruption):
    fake.mode("gcc")
    assert load_in_subprocess().returncode == 0
    lib = next(fake.root.rglob("tiny.so"))
    CORRUPTIONS[corruption](lib)
    before = lib.read_bytes()
    r = load_in_subprocess(EPIC_NO_BUILD="1")
    assert (r.returncode, r.stdout) == (0, "codes E704\n"), r.stderr
    assert "damaged" in r.stderr and fake.calls == 1
    assert lib.read_bytes() == before                    # a no-build cache may be read-only: left as it is


@needs_gcc
def test_loader_refuses_a_damaged_library_before_dlopen(fake):
    fake.mode("gcc")
    path = build.build_one(tiny_unit())
    _truncate(path)
    r = subprocess.run([sys.executable, "-c", "import sys\nfrom epic.diagnostics import EpicError\n"
                        "from epic.runtime import loader\ntry:\n    loader.load(sys.argv[1], ['A:x'])\n"
                        "except EpicError as e:\n    print(*e.codes, e)\n", str(path)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0 and r.stdout.startswith("E704") and "where the manifest says" in r.stdout, r.stderr


@needs_gcc
def test_loader_checks_the_self_description(fake):
    fake.mode("gcc")
    path = build.build_one(tiny_unit())
    assert loader.load(path, ["A:x"]).info["kernel"] == "tiny"
    e = error(loader.load, path, ["A:x", "B:y"])
    assert e.codes == ["E704"] and "does not match" in str(e)
    other = build.build_one(build.Unit("tiny", TINY_C + "\n", uses_cutlass=False, expect={"kernel": "gelu"}))
    e = error(loader.load, other, ["A:x"])
    assert e.codes == ["E704"] and "kernel tiny vs gelu" in str(e)


# ---------------------------------------------------------------- fake nvccs that misbehave
@pytest.mark.parametrize("mode, says", [
    ("empty", "nvcc wrote no output file"),
    ("garbage", "not an ELF file"),
    ("crash", "killed by signal 9"),
])
def test_bad_nvcc_output_is_E705_and_never_cached(fake, mode, says):
    fake.mode(mode)
    for attempt in (1, 2):                                # a second attempt runs nvcc again
        e = error(build.build_all, [unit()], None, True)
        assert e.codes == ["E705"] and says in str(e)
        assert fake.calls == attempt
    assert fake.files() == []                             # no library, no source, no temporaries, no lock


@needs_gcc
def test_truncated_real_library_is_E705(fake):
    fake.so.write_bytes(gcc_so())
    fake.mode("truncated")
    e = error(build.build_one, unit())
    assert e.codes == ["E705"] and "truncated" in str(e)
    assert fake.files() == []


def test_library_without_the_abi_is_E705(fake):
    fake.so.write_bytes(tiny_elf(["epic_launch", "something_else"]))
    e = error(build.build_one, unit())
    assert e.codes == ["E705"] and "does not export epic_workspace_size, epic_info" in str(e)


def test_failing_nvcc_is_E701_and_keeps_only_source_and_log(fake):
    fake.mode("fail")
    e = error(build.build_one, unit())
    assert e.codes == ["E701"] and "planted failure" in str(e)
    key = next(fake.root.iterdir()).name
    assert fake.files() == [key, f"{key}/k.cu", f"{key}/k.log"]
    fake.mode("ok")                                       # fixed: the next build succeeds in the same place
    assert cache.problem(build.build_one(unit())) is None
    assert fake.files() == [key, f"{key}/build.txt", f"{key}/k.cu", f"{key}/k.json", f"{key}/k.so"]


@pytest.mark.parametrize("how", ["missing", "not executable", "cannot exec", "not on PATH", "version fails"])
def test_unusable_nvcc_is_E705(fake, monkeypatch, how):
    if how == "missing":
        monkeypatch.setenv("EPIC_NVCC", str(fake.dir / "no-such-nvcc"))
    elif how == "not executable":
        fake.exe.chmod(0o644)
    elif how == "cannot exec":
        fake.exe.write_text("#!/no/such/interpreter\n")
    elif how == "not on PATH":
        monkeypatch.delenv("EPIC_NVCC")
        monkeypatch.setenv("PATH", str(fake.dir / "empty"))
    else:
        fake.mode("version-fail")
    if how == "not executable" and os.access(fake.exe, os.X_OK):
        pytest.skip("root may execute anything")
    e = error(build.build_all, [unit()], None, True)
    assert e.codes == ["E705"] and "nvcc" in str(e) and "Traceback" not in str(e)
    assert fake.files() == []


# ---------------------------------------------------------------- timeouts and interrupts
def test_hanging_nvcc_times_out_and_its_process_group_is_killed(fake, monkeypatch):
    fake.mode("hang")
    monkeypatch.setenv("EPIC_NVCC_TIMEOUT", "1")
    e = error(build.build_one, unit())            # the message says the timeout fired (no clock read here)
    assert e.codes == ["E705"] and "did not finish in 1 s" in str(e) and "EPIC_NVCC_TIMEOUT" in str(e)
    pids = [int(p) for p in fake.pids.read_text().split()]
    assert wait_dead(pids), "nvcc or its child survived the timeout"
    assert fake.files() == []


def test_hanging_nvcc_version_times_out(fake, monkeypatch):
    fake.mode("version-hang")
    monkeypatch.setenv("EPIC_NVCC_TIMEOUT", "0.5")
    assert codes(build.build_one, unit()) == ["E705"]


INTERRUPTED = textwrap.dedent("""\
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as at a terminal, even when started in the
    from epic.runtime import build                              # background (where SIGINT is inherited ignored)
    u = build.Unit("k", "// k\\n", uses_cutlass=False)
    build.build_all([u], quiet=True) if {all!r} else build.build_one(u)
    """)


@pytest.mark.parametrize("via_build_all", [True, False])
def test_ctrl_c_kills_nvcc_and_leaves_nothing(fake, via_build_all):
    fake.mode("hang")
    p = subprocess.Popen([sys.executable, "-c", INTERRUPTED.format(all=via_build_all)],
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not fake.pids.exists():
        assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode != 0 and "KeyboardInterrupt" in err
    assert wait_dead([int(x) for x in fake.pids.read_text().split()]), "nvcc outlived the interrupt"
    assert fake.files() == []


def test_waiting_for_a_lock_is_bounded(fake):
    entry = fake.root / ("0" * 24)
    with cache.locked(entry, wait=1):
        e = error(lambda: cache.locked(entry, wait=0.3).__enter__())
        assert e.codes == ["E704"] and "waited 0 s" in str(e)
    assert not entry.exists()                             # the lock holder left nothing behind


# ---------------------------------------------------------------- cache directories that cannot be used
@pytest.fixture
def read_only(tmp_path, monkeypatch):
    """A read-only directory. Root ignores permission bits, so for root the refusal is simulated."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    probe = ro / "probe"
    try:
        probe.mkdir()
        probe.rmdir()
    except PermissionError:
        yield ro
    else:
        real_mkdir, real_open = os.mkdir, os.open

        def refuse(real):
            def call(path, *a, **kw):
                if str(path).startswith(str(ro)) and (real is real_mkdir or a and a[0] & os.O_CREAT):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                return real(path, *a, **kw)
            return call
        monkeypatch.setattr(os, "mkdir", refuse(real_mkdir))
        monkeypatch.setattr(os, "open", refuse(real_open))
        yield ro
    ro.chmod(0o755)


@pytest.mark.parametrize("where", ["under a read-only directory", "through a regular file", "a regular file"])
def test_unusable_cache_directory_is_E704(fake, monkeypatch, read_only, where):
    blocker = fake.dir / "file"
    blocker.write_text("not a directory")
    root = {"under a read-only directory": read_only / "cache", "through a regular file": blocker / "cache",
            "a regular file": blocker}[where]
    monkeypatch.setenv("EPIC_CACHE_DIR", str(root))
    e = error(build.build_all, [unit()], None, True)
    assert e.codes == ["E704"] and "cannot be used" in str(e) and "EPIC_CACHE_DIR" in str(e)
    assert fake.calls == 0 and blocker.read_text() == "not a directory"
    assert list(read_only.iterdir()) == []


# ---------------------------------------------------------------- environment switches
@pytest.mark.parametrize("value", ["0", "false", "no", "off", "", "OFF", " No "])
def test_no_build_unset_values_build(fake, monkeypatch, value):
    monkeypatch.setenv("EPIC_NO_BUILD", value)
    assert cache.problem(build.build_one(unit())) is None and fake.calls == 1


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", "Yes"])
def test_no_build_set_values_refuse_to_build(fake, monkeypatch, value):
    monkeypatch.setenv("EPIC_NO_BUILD", value)
    e = error(build.build_one, unit())
    assert e.codes == ["E704"] and "not in the cache" in str(e) and fake.calls == 0


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_bad_timeout_values_are_E706(fake, monkeypatch, value):
    monkeypatch.setenv("EPIC_NVCC_TIMEOUT", value)
    e = error(build.build_one, unit())
    assert e.codes == ["E706"] and "EPIC_NVCC_TIMEOUT" in str(e) and fake.calls == 0


# ---------------------------------------------------------------- `epic cache`
def epic(capsys, *argv):
    from cli.main import main           # the source tree (the installed epic_cli may predate `epic cache`)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def planted(fake: Fake) -> dict:
    """Two good entries, a damaged one, a failed build, and the leftovers of killed builds."""
    good = [build.build_one(unit(f"// {i}\n", f"k{i}")) for i in range(2)]
    bad = build.build_one(unit("// bad\n", "bad"))
    _truncate(bad)
    fake.mode("fail")
    with pytest.raises(EpicError):
        build.build_one(unit("// failed\n", "failed"))
    fake.mode("ok")
    temp = good[0].parent / ".tmp-abc123"
    temp.mkdir()
    (temp / "k0.so").write_bytes(b"half")
    lock = good[1].parent / cache.LOCK
    lock.write_text("")
    orphan = good[1].parent / "old.json"
    orphan.write_text("{}")
    unknown = fake.root / "notes.txt"                      # not ours: never touched
    unknown.write_text("mine")
    return dict(good=good, bad=bad, temp=temp, lock=lock, orphan=orphan, unknown=unknown)


def test_cache_command_on_a_missing_cache(fake, capsys):
    code, out, _ = epic(capsys, "cache")
    assert code == 0 and "not created yet" in out and str(fake.root) in out


def test_cache_command_shows_entries_and_problems(fake, capsys):
    p = planted(fake)
    code, out, _ = epic(capsys, "cache")
    assert code == 0
    assert f"cache: {fake.root}" in out and "entries: 2\n" in out and " KiB\n" in out
    assert "bad entries: 2" in out and f"{p['bad']}: " in out and "where the manifest says" in out and str(p["orphan"]) in out
    assert "orphaned temporary files: 1" in out and str(p["temp"]) in out
    assert "stale lock files: 1" in out and str(p["lock"]) in out
    assert "failed builds (source and log kept): 1" in out and "epic cache --prune" in out


def test_cache_prune_removes_only_what_is_broken(fake, capsys):
    p = planted(fake)
    code, out, _ = epic(capsys, "cache", "--prune")
    assert code == 0 and "pruned" in out and "2 bad entries, 1 temporary files, 1 stale lock files" in out
    for k in ("bad", "temp", "lock", "orphan"):
        assert not p[k].exists() and f"removed {p[k]}" in out
    assert not cache.manifest_path(p["bad"]).exists()
    assert all(cache.problem(g) is None for g in p["good"]) and p["unknown"].read_text() == "mine"
    assert any(fake.root.rglob("failed.cu"))               # a failed build's source stays for the report
    calls = fake.calls
    build.build_all([unit(f"// {i}\n", f"k{i}") for i in range(2)], quiet=True)
    assert fake.calls == calls                             # the good entries are still served
    code, out, _ = epic(capsys, "cache")
    assert "entries: 2\n" in out and "bad entries: 0" in out and "temporary files: 0" in out


def test_cache_prune_leaves_a_running_build_alone(fake, capsys):
    p = planted(fake)
    with cache.locked(p["temp"].parent, wait=1):         # as if a build were writing there now
        code, out, _ = epic(capsys, "cache", "--prune")
        assert code == 0 and p["temp"].exists() and "in use by a running build (left alone): 1" in out
    assert not p["bad"].exists()


def test_cache_clean_removes_every_entry(fake, capsys):
    p = planted(fake)
    code, out, _ = epic(capsys, "cache", "--clean")
    assert code == 0 and "removed 4 entries" in out
    assert sorted(x.name for x in fake.root.iterdir()) == ["notes.txt"]
    calls = fake.calls
    build.build_one(unit("// 0\n", "k0"))
    assert fake.calls == calls + 1
    code, out, _ = epic(capsys, "cache")
    assert "entries: 1\n" in out


def test_cache_command_on_an_unusable_directory(fake, monkeypatch, capsys):
    blocker = fake.dir / "file"
    blocker.write_text("x")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(blocker))
    for argv in (["cache"], ["cache", "--prune"], ["cache", "--clean"]):
        code, out, err = epic(capsys, *argv)
        assert code == 2 and "E704" in err and "internal error" not in err


# ---------------------------------------------------------------- the real nvcc (a few seconds)
TINY_CU = TINY_C.replace("#define API", '#define API extern "C"')


@pytest.mark.nvcc
def test_real_nvcc_output_passes_the_checks_and_loads(tmp_path, monkeypatch):
    if not shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EPIC_NVCC", raising=False)
    build.nvcc_version.cache_clear()
    u = build.Unit("tiny", TINY_CU, uses_cutlass=False, expect={"kernel": "tiny"})
    path = build.build_all([u], quiet=True)[0]
    assert cache.problem(path) is None and json.loads(cache.manifest_path(path).read_text())["expect"] == u.expect
    assert sorted(p.name for p in path.parent.iterdir()) == ["build.txt", "tiny.cu", "tiny.json", "tiny.so"]
    code = f"from epic.runtime import loader\nprint(loader.load({str(path)!r}, ['A:x']).info['kernel'])\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert (r.returncode, r.stdout) == (0, "tiny\n"), r.stderr
