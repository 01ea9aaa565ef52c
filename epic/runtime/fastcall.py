"""The compiled call path: templates/launcher.cpp, built once per torch, Python and compiler into the
kernel cache, makes a call of a bound program one Python -> C++ transition (signature match,
allocation with ATen, every kernel's epic_launch through its function pointer) instead of Python
and ctypes work per tensor, buffer and launch. It runs the table and the memory layout of the
signature's Executable (runtime/executable.py), which register() hands it; the ctypes path runs
the same one.

It is an optimization only: where it cannot be built (no C++ compiler, torch without its headers,
EPIC_NO_BUILD and nothing cached) or EPIC_LAUNCHER=ctypes, calls take the ctypes path, with one
warning saying why. The C++ side never decides that a call is wrong: anything that does not match a
bound signature exactly goes back to the Python path, which validates and reports.

A call never waits for the C++ compiler (half a minute on 2 cores): where the launcher is not in the
cache, its build starts in a background thread (start()) and calls take the ctypes path until it has
finished (launcher(wait=False)); `epic build` and library() wait for it.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from .. import envflags
from ..diagnostics import Diagnostic, EpicError
from . import build, cache

SOURCE = Path(__file__).resolve().parent.parent / "templates" / "launcher.cpp"
MODULE = "epic_launcher"            # PYBIND11_MODULE's name; cache.LAUNCHER_EXPORTS names its PyInit
ABI = 4                             # the Launcher.add/run/names/label/call signatures; the module states its own
_DEVICE_TYPES = {"cpu": 0, "cuda": 1}   # c10::DeviceType

_LOCK = threading.Lock()
_STATE: dict = {"module": None, "why": None, "path": None}
_BUILDER: dict = {"thread": None}      # the background build's thread, once one was started


def _after_fork_in_child() -> None:
    """A child forked while the background build held _LOCK would wait for it forever: the child gets
    a fresh lock, and a build that had not finished is the child's to start again (the cache's file
    lock keeps the two processes from writing one entry)."""
    global _LOCK
    _LOCK = threading.Lock()
    if _STATE["module"] is None and _STATE["why"] is None:
        _BUILDER["thread"] = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def mode() -> str:
    """EPIC_LAUNCHER: "compiled" (the default) or "ctypes" (never build or use the launcher)."""
    value = os.environ.get("EPIC_LAUNCHER", "").strip().lower() or "compiled"
    if value not in ("compiled", "ctypes"):
        raise EpicError(Diagnostic("E706", f"EPIC_LAUNCHER={os.environ.get('EPIC_LAUNCHER')!r} is neither "
                                   "'compiled' nor 'ctypes'", None, "unset it, or set it to compiled or ctypes"))
    return value


def compiler() -> str | None:
    exe = os.environ.get("CXX") or "c++"
    return shutil.which(exe) or shutil.which("g++")


def flags() -> list[str]:
    """The compile and link flags (torch's include and library directories, its C++ ABI)."""
    from torch.utils import cpp_extension
    include = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    return ["-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden", f"-DTORCH_EXTENSION_NAME={MODULE}",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", *[f"-I{d}" for d in include],
            *[f"-L{d}" for d in libs], *[f"-Wl,-rpath,{d}" for d in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def library_path(exe: str) -> Path:
    """The cache entry: keyed by the source, the flags, torch, Python and the compiler's version."""
    h = hashlib.sha256()
    version = build.version_of(exe, "C++ compiler (CXX)").stdout     # bounded: a hanging compiler is E705
    for part in (SOURCE.read_text(), " ".join(flags()), torch.__version__, sys.version, version, str(ABI)):
        h.update(part.encode())
        h.update(b"\0")
    return cache.cache_dir() / h.hexdigest()[:24] / f"{MODULE}.so"


def launcher(tensor_names: list[str] = (), scalars: list = (), wait: bool = True):
    """A new Launcher (one per compiled program), or None where the compiled call path is off or
    unavailable (the first time, a warning says why). tensor_names and scalars (the program's scalar
    inputs) are what its call() looks up in a caller's keyword arguments. wait=False: None also while
    the launcher is being built (start()), so that the caller can take the ctypes path meanwhile."""
    module = _module() if wait else _module_if_ready()
    if module is None:
        return None
    fast = module.Launcher()
    fast.names(list(tensor_names), [t.name for t in scalars],
               [float(t.default) if t.default is not None else math.nan for t in scalars])
    return fast


def library() -> Path | None:
    """Build (or find) and load the launcher; its cache entry, or None (why_not() says why)."""
    return _STATE["path"] if _module() is not None else None


def why_not() -> str | None:
    """Why the compiled call path is not in use, once it has been tried (None: it is)."""
    return _STATE["why"]


def building() -> bool:
    """Whether the background build (start()) is still running."""
    thread = _BUILDER["thread"]
    return thread is not None and thread.is_alive()


def start(warn: bool = True) -> None:
    """Start building the launcher in a background thread where it is not in the cache and can be
    built; where it is there (or the compiled call path is off, or cannot be built), decide now:
    loading a cached launcher takes milliseconds. Never waits for the compiler. warn=False: no
    warning where the launcher cannot be had (the caller reports why_not() itself)."""
    if _STATE["module"] is not None or _STATE["why"] is not None or _BUILDER["thread"] is not None:
        return
    if not _must_compile():
        _module(warn)
        return
    with _LOCK:
        if _BUILDER["thread"] is None and _STATE["module"] is None and _STATE["why"] is None:
            from .background import stop_at_exit
            stop_at_exit()              # a process that exits meanwhile does not wait for the compiler
            _BUILDER["thread"] = threading.Thread(target=_module, args=(warn,), name="epic-launcher-build",
                                                  daemon=True)
            _BUILDER["thread"].start()


def _module_if_ready():
    """The module where it is loaded or can be at once; else None, with its build started."""
    if _STATE["module"] is None and _STATE["why"] is None:
        start()
        if _BUILDER["thread"] is not None:
            return None if building() else _module()
    return _STATE["module"]


def _must_compile() -> bool:
    """Whether loading the launcher would run the C++ compiler first (False where _module() decides
    without it: the path is off, nothing to build with, EPIC_NO_BUILD, or the cache holds it)."""
    if mode() == "ctypes" or envflags.enabled("EPIC_NO_BUILD"):
        return False
    exe = compiler()
    if exe is None:
        return False
    try:
        return cache.problem(library_path(exe)) is not None
    except (EpicError, OSError):        # _module() reports it
        return False


def _module(warn: bool = True):
    if _STATE["module"] is not None or _STATE["why"] is not None:
        return _STATE["module"]
    with _LOCK:
        if _STATE["module"] is None and _STATE["why"] is None:
            try:
                _STATE["module"] = _load()
            except _Unavailable as e:
                _STATE["why"] = str(e)
                if warn and mode() != "ctypes":
                    warnings.warn(f"epic: calls take the ctypes path: {e}", RuntimeWarning, stacklevel=4)
    return _STATE["module"]


class _Unavailable(Exception):
    pass


def _load():
    if mode() == "ctypes":
        raise _Unavailable("EPIC_LAUNCHER=ctypes")
    exe = compiler()
    if exe is None:
        raise _Unavailable("no C++ compiler to build the launcher (set CXX)")
    try:
        target = library_path(exe)
        if cache.problem(target) is not None:
            if envflags.enabled("EPIC_NO_BUILD"):
                raise _Unavailable(f"the launcher is not in the cache ({target.parent}) and EPIC_NO_BUILD is set")
            with cache.locked(target.parent, wait=build.nvcc_timeout() + 60):
                if cache.problem(target) is not None:
                    cache.discard(target)
                    _compile(exe, target)
        spec = importlib.util.spec_from_file_location(MODULE, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _STATE["path"] = target
    except EpicError as e:
        raise _Unavailable(e.diagnostics[0].message.splitlines()[0]) from None
    except (OSError, ImportError, subprocess.SubprocessError) as e:
        raise _Unavailable(f"the launcher cannot be built or loaded: {e}") from None
    if getattr(module, "ABI", None) != ABI:
        raise _Unavailable(f"the launcher module states ABI {getattr(module, 'ABI', None)}, epic expects {ABI}")
    return module


def _compile(exe: str, target: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=cache.TMP_PREFIX, dir=target.parent))
    try:
        out = tmp / target.name
        cmd = [exe, str(SOURCE), "-o", str(out), *flags()]
        r = build._run(cmd, build.nvcc_timeout(), env=dict(os.environ, TMPDIR=str(tmp)))
        if r.returncode != 0:
            log = target.with_suffix(".log")
            cache.write_file(log, " ".join(cmd) + "\n\n" + r.stdout + r.stderr)     # never through a planted link
            raise _Unavailable(f"building the launcher failed (exit status {r.returncode}); the log is at {log}")
        why = cache.commit(out, target, kind="launcher")
        if why:
            raise _Unavailable(f"the compiler's launcher is not a usable module: {why}")
        cache.write_file(target.parent / "build.txt", " ".join(cmd) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- registering an Executable
def register(fast, executable, tensors: list[torch.Tensor]) -> int:
    """Hand an Executable (runtime/executable.py) to a Launcher: the signature of `tensors` (the
    table's first entries, executable.inputs: its input tensors, then its derived tensors), and the
    table as it stands -- buffers with their arena offsets, per launch its function pointer, pointer
    slots, sizes, scalars and workspace offset, the arena's size; a vendor gemm's launch (no function
    pointer) with its operands' transposes, which the launcher runs with ATen's mm. Returns the plan's id, which
    run() and call() report back."""
    assert len(tensors) == len(executable.tensor_names) + len(executable.derived)
    slot = {n: i for i, n in enumerate(executable.names)}
    scalar_index = {n: i for i, n in enumerate(executable.scalar_names)}
    launches = executable.launches
    device = torch.device(executable.device)
    plan = fast.add(
        _DEVICE_TYPES[device.type], device.index if device.index is not None else -1,
        [torch.empty(0, dtype=x.dtype) for x in tensors], [list(x.shape) for x in tensors],
        [list(x.stride()) for x in tensors],
        [torch.empty(0, dtype=getattr(torch, b.torch_dtype)) for b in executable.allocations],
        [list(b.shape) for b in executable.allocations], [int(o) for o in executable.offsets],
        [0 if l.vendor else launch_address(l.library) for l in launches],
        [[slot[n] if n else -1 for n in l.pointer_tensors] for l in launches],
        [list(l.dims) for l in launches],
        [[0.0 if isinstance(v, str) else float(v) for v in l.scalars] for l in launches],
        [[x for i, name in l.runtime_scalars for x in (i, scalar_index[name])] for l in launches],
        [int(l.workspace) for l in launches], [int(l.workspace_offset) for l in launches], int(executable.arena),
        [slot[n] for n in executable.outputs], [slot[n] for n in executable.keep],
        [[int(l.library.spec.a_t), int(l.library.spec.b_t)] if l.vendor else [] for l in launches])
    fast.label(plan, list(executable.outputs), list(executable.keep))
    return plan


def launch_address(library) -> int:
    """The address of a loaded library's epic_launch (runtime/loader.KernelLibrary, or anything with
    the same interface that names it `launch_function`)."""
    return ctypes.cast(library.launch_function, ctypes.c_void_p).value
