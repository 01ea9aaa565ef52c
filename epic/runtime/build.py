"""nvcc driver with an on-disk cache.

A kernel's shared library lives at $EPIC_CACHE_DIR (default ~/.cache/epic)/<key>/<name>.so, where
the key hashes the source, the flags, and the nvcc and CUTLASS versions. EPIC_NO_BUILD=1 makes a
missing kernel an error instead of an nvcc run (for machines that only use prebuilt kernels). Two processes building
the same kernel do not collide: a lock file serializes them and the library appears by an atomic
rename. Independent kernels build in parallel processes; rich shows progress while nvcc runs.
An nvcc failure is a bug in epic: it raises E701 and keeps the .cu.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..diagnostics import Diagnostic, EpicError

CODEGEN_VERSION = "1"     # bump when generated code changes meaning without changing its text
BASE_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
              "-gencode=arch=compute_90a,code=sm_90a", "-shared", "-Xcompiler", "-fPIC",
              "-Xcompiler", "-fvisibility=hidden"]


@dataclass(frozen=True)
class Unit:
    """One translation unit to build: a name (for messages) and its CUDA source."""
    name: str
    source: str
    uses_cutlass: bool = True


def cache_dir() -> Path:
    env = os.environ.get("EPIC_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epic"


def nvcc_path() -> str:
    exe = os.environ.get("EPIC_NVCC") or shutil.which("nvcc")
    if not exe:
        raise EpicError(Diagnostic("E701", "nvcc not found", None,
                                   "install the CUDA toolkit (12.4 or newer) or set EPIC_NVCC to nvcc's path"))
    return exe


@functools.lru_cache(maxsize=None)
def nvcc_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=1)
def cutlass_paths() -> tuple[str, list[str]]:
    """(CUTLASS version, include directories) from the nvidia-cutlass wheel."""
    try:
        import cutlass_library
    except ImportError:
        raise EpicError(Diagnostic("E701", "the nvidia-cutlass package is not installed", None,
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
    h = hashlib.sha256()
    for part in (unit.source, " ".join(BASE_FLAGS), nvcc_version(exe), CODEGEN_VERSION,
                 cutlass_paths()[0] if unit.uses_cutlass else "-"):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def library_path(unit: Unit) -> Path:
    exe = nvcc_path()
    return cache_dir() / cache_key(unit, exe) / f"{_safe(unit.name)}.so"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def build_one(unit: Unit) -> Path:
    exe = nvcc_path()
    target = library_path(unit)
    if target.exists():
        return target
    if os.environ.get("EPIC_NO_BUILD"):
        raise EpicError(Diagnostic("E701", f"kernel '{unit.name}' is not in the cache ({cache_dir()}) and "
                                   "EPIC_NO_BUILD is set", None, "build it first with `epic build` or unset EPIC_NO_BUILD"))
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # a second builder waits here, then finds the library
        if target.exists():
            return target
        src = target.with_suffix(".cu")
        src.write_text(unit.source)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        cmd = [exe, *flags_for(unit), str(src), "-o", tmp]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            os.unlink(tmp)
            log = target.with_suffix(".log")
            log.write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
            if "Stages set to value 2 or more" in r.stdout + r.stderr:
                raise EpicError(Diagnostic(
                    "E215", f"kernel '{unit.name}': the epilogue's shared memory leaves the mainloop fewer than "
                    "2 pipeline stages", None, "choose a smaller tile or epilogue tile (with tile=..., epi_tile=...)"))
            excerpt = "\n".join((r.stderr or r.stdout).strip().splitlines()[:12])
            raise EpicError(Diagnostic(
                "E701", f"nvcc failed on the generated kernel '{unit.name}' (this is a bug in epic, not in your "
                f"program)\n{excerpt}", None, f"the source is kept at {src}; the full log at {log}"))
        (target.parent / "build.txt").write_text(" ".join(cmd) + f"\n{time.time() - t0:.1f} s\n")
        os.replace(tmp, target)                   # atomic: readers see no library or a whole one
    return target


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
    todo = [u for u in units if not library_path(u).exists()]
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
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(build_one, u): u for u in todo}
        if progress is not None:
            with progress:
                task = progress.add_task(f"nvcc: building {len(todo)} kernel(s)", total=len(todo))
                for f in concurrent.futures.as_completed(futures):
                    f.result()
                    progress.update(task, advance=1,
                                    description=f"nvcc: built {futures[f].name}")
        for f in futures:
            f.result()
    return [library_path(u) for u in units]
