"""nvcc driver with an on-disk cache.

A kernel's shared library lives at $EPIC_CACHE_DIR (default ~/.cache/epic)/<key>/<name>.so, where
the key hashes the source, the flags, and the nvcc and CUTLASS versions (layout and validation in
cache.py); bundles of prebuilt kernels (EPIC_BUNDLE, bundle.py) are looked in first and never
built into. EPIC_NO_BUILD=1 makes a missing or damaged kernel an error (E704) instead of an nvcc run
(for machines that only use prebuilt kernels). Two processes building the same kernel do not
collide: a lock file serializes them and the library appears by an atomic rename, after a check that
it is a whole shared object with epic's exports. A damaged entry is rebuilt, never loaded.
Independent kernels build in parallel processes; rich shows progress while nvcc runs. nvcc runs
under a timeout (EPIC_NVCC_TIMEOUT, seconds). An nvcc failure on generated code is a bug in epic:
it raises E701 and keeps the .cu; a missing, crashing, hanging or misbehaving nvcc is E705, a cache
that cannot be written E704.
"""
from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import envflags
from ..codegen.unit import Unit  # noqa: F401  (public: build.Unit)
from ..diagnostics import Diagnostic, EpicError
from . import bundle, cache, nvcc_split
from .cache import cache_dir  # noqa: F401  (public: build.cache_dir)

_STAGES = "Stages set to value 2 or more"     # CUTLASS's static_assert when the mainloop gets < 2 stages (E217)
CODEGEN_VERSION = "1"     # bump when generated code changes meaning without changing its text
BASE_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
              "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
              "-Xcompiler", "-fvisibility=hidden"]


def nvcc_path() -> str:
    exe = os.environ.get("EPIC_NVCC")
    if exe and not shutil.which(exe):
        raise EpicError(Diagnostic("E705", f"EPIC_NVCC is set to {exe!r}, which is not an executable file", None,
                                   "set EPIC_NVCC to nvcc's path, or unset it to use the nvcc on PATH"))
    exe = exe or shutil.which("nvcc")
    if not exe:
        raise EpicError(Diagnostic("E705", "nvcc not found", None,
                                   "install the CUDA toolkit (12.4 or newer) or set EPIC_NVCC to nvcc's path"))
    return exe


class TimedOut(EpicError):
    """_run's command ran past its timeout and was killed (E705)."""


VERSION_TIMEOUT = 60.0     # seconds `nvcc --version` may take (capped by EPIC_NVCC_TIMEOUT)


def version_of(exe: str, what: str) -> subprocess.CompletedProcess:
    """`exe --version` under a timeout, its process group killed when it fires (E705 says so)."""
    timeout = min(VERSION_TIMEOUT, nvcc_timeout())
    try:
        return _run([exe, "--version"], timeout)
    except TimedOut:
        raise EpicError(Diagnostic("E705", f"`{exe} --version` did not answer in {timeout:g} s and was stopped",
                                   None, f"check the {what} at {exe}")) from None


@functools.lru_cache(maxsize=None)
def nvcc_version(exe: str) -> str:
    r = version_of(exe, "nvcc (or set EPIC_NVCC to another)")
    if r.returncode != 0:
        excerpt = "\n".join((r.stderr or r.stdout).strip().splitlines()[:6])
        raise EpicError(Diagnostic("E705", f"`{exe} --version` failed (exit status {r.returncode})\n{excerpt}",
                                   None, "check the CUDA toolkit installation or set EPIC_NVCC"))
    m = re.search(r"release ([\d.]+), V([\d.]+)", r.stdout)
    lines = r.stdout.strip().splitlines()
    if not m and not lines:
        raise EpicError(Diagnostic("E705", f"`{exe} --version` printed nothing", None,
                                   "check the CUDA toolkit installation or set EPIC_NVCC"))
    return m.group(2) if m else lines[-1]


@functools.lru_cache(maxsize=1)
def cutlass_paths() -> tuple[str, list[str]]:
    """(CUTLASS version, include directories) from the nvidia-cutlass wheel."""
    try:
        import cutlass_library
    except ImportError:
        raise EpicError(Diagnostic("E705", "the nvidia-cutlass package (CUTLASS's headers) is not installed", None,
                                   "pip install nvidia-cutlass==4.2.0.0")) from None
    root = Path(cutlass_library.source_path)
    from importlib import metadata
    try:
        version = metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return version, [str(root / "include"), str(root / "tools" / "util" / "include")]


def flags_for(unit: Unit) -> list[str]:
    flags = list(BASE_FLAGS)
    if unit.uses_cutlass:
        flags += [f"-I{d}" for d in cutlass_paths()[1]]
    return flags


def cache_key(unit: Unit, exe: str) -> str:
    return unit_key(unit, nvcc_version(exe), cutlass_paths()[0] if unit.uses_cutlass else "-")


def unit_key(unit: Unit, nvcc: str, cutlass: str) -> str:
    h = hashlib.sha256()
    for part in (unit.source, " ".join(BASE_FLAGS), nvcc, CODEGEN_VERSION, cutlass if unit.uses_cutlass else "-"):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def library_path(unit: Unit) -> Path:
    """The kernel's library: a bundle's (EPIC_BUNDLE, runtime/bundle.py) that passes the cache's
    checks, else its place in the cache."""
    return bundled(unit) or cache_path(unit)


def cache_path(unit: Unit) -> Path:
    exe = nvcc_path()
    return cache_dir() / cache_key(unit, exe) / f"{_safe(unit.name)}.so"


def bundled(unit: Unit) -> Path | None:
    """The kernel's library in a bundle, or None. Without nvcc (or CUTLASS's headers) here to compute
    its key with, under the versions each bundle was built with: a machine that only runs kernels."""
    if not bundle.roots():
        return None
    name = f"{_safe(unit.name)}.so"
    try:
        key = cache_key(unit, nvcc_path())
    except EpicError as e:
        if e.diagnostics[0].code != "E705":
            raise
        return bundle.find_built_elsewhere(name, lambda nvcc, cutlass: unit_key(unit, nvcc, cutlass))
    return bundle.find(key, name)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def check_paths(unit: Unit, exe: str, target: Path) -> None:
    """Refuse, before anything is created or run, a path that reaches a shell during the build (nvcc's
    steps, nvcc_split's `bash -c`) holding a character the shell would interpret: the cache entry
    (source, output and nvcc's temporaries live there; E704), nvcc's own directory and CUTLASS's
    include directories (E705)."""
    def bad(path: str) -> str | None:
        c = nvcc_split.shell_hazard(path)
        return None if c is None else repr(c) if not c.isprintable() else f"'{c}'"

    entry = os.path.abspath(target.parent)
    if c := bad(entry):
        raise EpicError(Diagnostic("E704", f"the kernel cache path {entry!r} contains {c}, which the shell that "
                                   "runs nvcc's steps would interpret", None,
                                   "set EPIC_CACHE_DIR to a path without any of " + " ".join(sorted(nvcc_split.SHELL_CHARS))))
    dirs = [os.path.dirname(os.path.realpath(exe)), *(cutlass_paths()[1] if unit.uses_cutlass else [])]
    for d in dirs:
        if c := bad(os.path.abspath(d)):
            raise EpicError(Diagnostic("E705", f"nvcc would pass the path {d!r} through a shell, and it contains "
                                       f"{c}, which the shell would interpret", None,
                                       "install the CUDA toolkit and Python packages under a plain path"))


def nvcc_timeout() -> float:
    """Seconds one nvcc run may take (EPIC_NVCC_TIMEOUT, default 1200: a CUTLASS kernel takes about 60)."""
    text = os.environ.get("EPIC_NVCC_TIMEOUT", "").strip()
    try:
        seconds = float(text) if text else 1200.0
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):        # also refuses nan
        raise EpicError(Diagnostic("E706", f"EPIC_NVCC_TIMEOUT={text!r} is not a positive number of seconds"))
    return seconds


_RUNNING: set[subprocess.Popen] = set()       # nvcc processes of this process, for stop_all()
_RUNNING_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run nvcc in a process group of its own, so that a timeout or an interrupt kills it and every
    child it started (cicc, ptxas, the host compiler)."""
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, errors="replace", env=env, start_new_session=True)
    except OSError as e:
        raise EpicError(Diagnostic("E705", f"cannot run nvcc ({cmd[0]}): {e.strerror or e}", None,
                                   "install the CUDA toolkit (12.4 or newer) or set EPIC_NVCC to nvcc's path")) from None
    with _RUNNING_LOCK:
        _RUNNING.add(p)
        if _STOPPING.is_set():                  # started just as the build was interrupted
            _kill(p, wait=False)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p)
        raise TimedOut(Diagnostic("E705", f"nvcc did not finish in {timeout:g} s and was stopped", None,
                                  "allow more time with EPIC_NVCC_TIMEOUT=SECONDS")) from None
    except BaseException:                       # KeyboardInterrupt: Ctrl-C does not reach nvcc's own group
        _kill(p)
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(p)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _kill(p: subprocess.Popen, wait: bool = True) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if wait:
        try:
            p.communicate(timeout=10)           # reap it and close the pipes
        except subprocess.TimeoutExpired:       # a child left the group and holds the pipes
            p.wait()


def stop_all() -> None:
    """Kill every nvcc this process is running (build_all calls it when interrupted)."""
    with _RUNNING_LOCK:
        _STOPPING.set()
        for p in _RUNNING:
            _kill(p, wait=False)


def build_one(unit: Unit, split: bool = True) -> Path:
    found = bundled(unit)
    if found is not None:                       # never built into: a bundle is read-only
        return found
    exe = nvcc_path()
    target = cache_path(unit)
    if target.parent.is_symlink():              # epic makes none: it would serve or write files elsewhere
        raise EpicError(Diagnostic("E704", f"the cache entry {target.parent} is a symbolic link, not a directory",
                                   None, "`epic cache --prune` removes such links (never what they point at)"))
    why = cache.problem(target)
    if why is None:
        return target
    if envflags.enabled("EPIC_NO_BUILD"):
        what = "is not in the cache" if why == cache.MISSING else f"is damaged in the cache ({why}): {target}"
        bundles = ", ".join(str(r) for r in bundle.roots())
        what += f" nor in a bundle ({bundles})" if bundles else ""
        raise EpicError(Diagnostic("E704", f"kernel '{unit.name}' {what} ({cache_dir()}) and EPIC_NO_BUILD is set",
                                   None, "build it first with `epic build` or unset EPIC_NO_BUILD"))
    check_paths(unit, exe, target)
    timeout = nvcc_timeout()
    with cache.locked(target.parent, wait=timeout + 60):   # a second builder waits here, then finds the library
        if cache.problem(target) is None:
            return target
        cache.discard(target)                   # a damaged entry is never served: rebuild it
        _compile(unit, exe, target, timeout, split)
    return target


def _compile(unit: Unit, exe: str, target: Path, timeout: float, split: bool = True) -> None:
    """nvcc into a temporary directory inside the entry (nvcc's own temporaries too), then verify and
    commit. Every way out but success and E701/E217 removes the source; the temporaries always go.
    split: run nvcc's host and device halves concurrently (nvcc_split.py) when a core is free for it."""
    src = target.with_suffix(".cu")
    try:
        cache.write_file(src, unit.source)
        tmp = Path(tempfile.mkdtemp(prefix=cache.TMP_PREFIX, dir=target.parent))
    except OSError as e:
        src.unlink(missing_ok=True)
        raise cache.unusable(Path(e.filename or target.parent), e) from None
    keep_src = False
    try:
        out = tmp / target.name
        cmd = [exe, *flags_for(unit), str(src), "-o", str(out)]
        t0 = time.time()
        env = dict(os.environ, TMPDIR=str(tmp))
        r = None
        if split and unit.uses_cutlass and envflags.enabled("EPIC_NVCC_SPLIT", default=True):
            r = nvcc_split.build(cmd, env, timeout, _run, str(src), unit.source)   # None: another nvcc
            if r is not None and r.returncode != 0 and _STAGES not in r.stdout + r.stderr:
                r = None                        # whatever failed, plain nvcc has the last word (and the log)
        how = "host and device halves in parallel" if r is not None else "plain nvcc"
        if r is None:
            r = _run(cmd, max(1.0, timeout - (time.time() - t0)), env=env)
        if r.returncode < 0:
            raise EpicError(Diagnostic("E705", f"nvcc was killed by signal {-r.returncode} while building "
                                       f"'{unit.name}'", None, "out of memory? build fewer kernels at a time (-j)"))
        if r.returncode != 0:
            keep_src = True
            log = target.with_suffix(".log")
            cache.write_file(log, " ".join(cmd) + "\n\n" + r.stdout + r.stderr)
            if _STAGES in r.stdout + r.stderr:
                raise EpicError(Diagnostic(
                    "E217", f"kernel '{unit.name}': the epilogue's shared memory leaves the mainloop fewer than "
                    "2 pipeline stages", None, "choose a smaller tile or epilogue tile (with tile=..., epi_tile=...)"))
            excerpt = "\n".join((r.stderr or r.stdout).strip().splitlines()[:12])
            raise EpicError(Diagnostic(
                "E701", f"nvcc failed on the generated kernel '{unit.name}' (this is a bug in epic, not in your "
                f"program)\n{excerpt}", None, f"the source is kept at {src}; the full log at {log}"))
        why = cache.commit(out, target, unit.expect)
        if why:
            raise EpicError(Diagnostic("E705", f"nvcc reported success on '{unit.name}' but its output is not a "
                                       f"usable library: {why}", None, f"check the nvcc at {exe}"))
        keep_src = True
        target.with_suffix(".log").unlink(missing_ok=True)      # an earlier failure's log
        cache.write_file(target.parent / "build.txt", " ".join(cmd) + f"\n{time.time() - t0:.1f} s ({how})\n")
    except OSError as e:
        raise cache.unusable(Path(e.filename or target.parent), e) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not keep_src:
            src.unlink(missing_ok=True)


def default_jobs(n: int) -> int:
    """Parallel nvcc processes: one per core, at most one per 6 GiB of memory (a CUTLASS
    instantiation peaks near 6 GB)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 16
    return max(1, min(n, os.cpu_count() or 1, int(mem // 6) or 1))


def build_all(units: list[Unit], jobs: int | None = None, quiet: bool = False) -> list[Path]:
    """Build units in parallel (cached ones return at once); progress on stderr."""
    todo = [u for u in units if cache.problem(library_path(u)) is not None]
    if not todo:
        return [library_path(u) for u in units]
    jobs = jobs or default_jobs(len(todo))
    progress = None
    if not quiet and sys.stderr.isatty():
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            transient=True)
    elif not quiet:
        print(f"epic: building {len(todo)} kernel(s) with nvcc ({jobs} at a time)...", file=sys.stderr)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        heavy = sum(1 for u in todo if u.uses_cutlass)  # the builds that take a minute, not seconds
        split = 2 * min(jobs, heavy) <= (os.cpu_count() or 1)   # a free core for each one's second half
        futures = {pool.submit(build_one, u, split): u for u in todo}
        if progress is not None:
            with progress:
                task = progress.add_task(f"nvcc: building {len(todo)} kernel(s)", total=len(todo))
                for f in concurrent.futures.as_completed(futures):
                    f.result()
                    progress.update(task, advance=1,
                                    description=f"nvcc: built {futures[f].name}")
        for f in futures:
            f.result()
    except KeyboardInterrupt:
        # Ctrl-C reaches only this thread, and nvcc runs in a process group of its own: stop the
        # queue and the running nvccs, or the pool would wait for them to finish.
        pool.shutdown(wait=False, cancel_futures=True)
        stop_all()
        raise
    finally:
        pool.shutdown(wait=True)
        _STOPPING.clear()
    return [library_path(u) for u in units]
