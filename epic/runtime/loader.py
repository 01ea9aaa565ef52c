"""Load a built kernel library with ctypes and call its C ABI (see templates/*.cu.j2)."""
from __future__ import annotations

import ctypes
import json
import threading
from pathlib import Path

from ..diagnostics import Diagnostic, EpicError
from . import cache

_LOCK = threading.Lock()
_LOADED: dict[str, "KernelLibrary"] = {}

_STATUS = {1: "misaligned operand", 2: "invalid data type", 3: "invalid layout", 4: "invalid problem",
           5: "not supported", 6: "workspace null", 7: "internal error (the launch failed)",
           8: "architecture mismatch", 9: "insufficient driver", 10: "memory allocation", 11: "invalid",
           -1: "null argument", -2: "workspace too small", -3: "CUDA error while querying the device",
           -4: "the device is not sm_90 (Hopper)",
           -5: "could not allocate the kernel's per-stream scratch (cudaMalloc failed)"}


class KernelLibrary:
    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.epic_launch.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong),
                                         ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_size_t]   # ptrs, sizes, scalars, stream, workspace, bytes
        self.lib.epic_launch.restype = ctypes.c_int
        self.lib.epic_workspace_size.argtypes = [ctypes.POINTER(ctypes.c_longlong)]
        self.lib.epic_workspace_size.restype = ctypes.c_size_t
        self.lib.epic_info.restype = ctypes.c_char_p
        info = self.lib.epic_info()
        self.info = json.loads(info.decode()) if info else None
        if not isinstance(self.info, dict):
            raise ValueError(f"epic_info() returned {info!r}, not a JSON object")

    def workspace_size(self, sizes: list[int]) -> int:
        arr = (ctypes.c_longlong * len(sizes))(*sizes)
        n = self.lib.epic_workspace_size(arr)
        if n == ctypes.c_size_t(-1).value:
            raise EpicError(Diagnostic("E703", f"kernel {self.info['kernel']}: cannot query the CUDA device"))
        return int(n)

    def launch(self, ptrs: list[int], sizes, scalars, stream: int, workspace: int = 0, workspace_bytes: int = 0) -> None:
        """ptrs, sizes and scalars may be prebuilt ctypes arrays (the runtime builds them once per binding)."""
        p = ptrs if isinstance(ptrs, ctypes.Array) else (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        s = sizes if isinstance(sizes, ctypes.Array) else (ctypes.c_longlong * len(sizes))(*sizes)
        f = scalars if isinstance(scalars, ctypes.Array) else (ctypes.c_float * max(1, len(scalars)))(*scalars)
        rc = self.lib.epic_launch(p, s, f, stream, workspace or None, workspace_bytes)
        if rc != 0:
            raise self.launch_error(rc)

    def function(self, name: str):
        """An optional export of the library (a trace=tiles kernel's epic_trace_*), or None."""
        return getattr(self.lib, name, None)

    @property
    def launch_function(self):
        """epic_launch itself, for the compiled call path (runtime/fastcall.py)."""
        return self.lib.epic_launch

    def launch_error(self, rc: int) -> EpicError:
        what = _STATUS.get(rc, f"CUDA error {rc}" if self.info.get("kind") == "combine" else f"status {rc}")
        return EpicError(Diagnostic("E703", f"kernel '{self.info['kernel']}' did not launch: {what}", None,
                                    f"library {self.path}"))


def loaded() -> list[KernelLibrary]:
    """The kernel libraries this process has loaded, in load order."""
    with _LOCK:
        return list(_LOADED.values())


def load(path: Path, expect_ptrs: list[str]) -> KernelLibrary:
    """dlopen a cache entry after checking it (a damaged library must never reach dlopen: a truncated
    one kills the process with SIGBUS), then check that it describes the kernel the caller expects."""
    path = Path(path)
    key = str(path)
    with _LOCK:
        lib = _LOADED.get(key)
        if lib is None:
            why = cache.problem(path)
            if why is not None:
                raise EpicError(Diagnostic("E704", f"kernel library {path} cannot be loaded: {why}", None,
                                           "build it again (`epic build`, or run without EPIC_NO_BUILD); "
                                           "`epic cache --prune` removes damaged entries"))
            try:
                lib = KernelLibrary(path)
            except (OSError, AttributeError, ValueError) as e:   # dlopen failed, a symbol or epic_info is bad
                raise EpicError(Diagnostic("E704", f"kernel library {path} cannot be loaded: {e}", None,
                                           "`epic cache --clean` removes the cache; the next run rebuilds")) from None
            _LOADED[key] = lib
    expect = {"ptrs": expect_ptrs}
    try:
        expect = {**(cache.read_manifest(path).get("expect") or {}), **expect}
    except (OSError, ValueError):
        pass                                    # the manifest was checked before dlopen; it may be gone since
    wrong = {k: (lib.info.get(k), v) for k, v in expect.items() if lib.info.get(k) != v}
    if wrong:
        what = "; ".join(f"{k} {got} vs {want}" for k, (got, want) in wrong.items())
        raise EpicError(Diagnostic("E704", f"library {path} does not match the kernel it should hold ({what})",
                                   None, "remove the cache entry (`epic cache --clean`); the next run rebuilds it"))
    return lib
