"""Compiling translated kernels with g++ for the host, and loading them with ctypes.

Many kernels go into one translation unit (each in its own namespace, exported as
`hs_<key>_epic_launch` etc., key = hash of the generated source), so a test session compiles
everything it needs in a few g++ runs, in parallel up to the number of cores. Libraries are cached
in a per-process temporary directory (EPIC_HOSTSIM_CACHE names a persistent one instead) under the
hash of their translation unit; a kernel already built in this process is never built again.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .translate import translate

HERE = Path(__file__).resolve().parent
# the custom nodes' headers, where code generation reads them: hostsim.hpp includes their arithmetic
NODES = Path(str(resources.files("epic.templates").joinpath("nodes")))
FLAGS = ["-std=c++17", "-O1", "-w", "-shared", "-fPIC", "-fvisibility=hidden", "-fno-fast-math"]


class ToolchainMissing(Exception):
    """No g++, CUTLASS headers or CUDA headers: the host simulator cannot run here."""


@dataclass(frozen=True)
class Toolchain:
    gxx: str
    includes: tuple[str, ...]


def _cuda_include() -> str | None:
    """CUDA's include directory (for cuda_bf16.h & co.): $CUDA_HOME, next to nvcc, or what nvcc says."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which(os.environ.get("EPIC_NVCC") or "nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    for root in filter(None, candidates):
        inc = Path(root) / "include"
        if (inc / "cuda_bf16.h").exists():
            return str(inc)
    if nvcc:   # nvcc may be a wrapper script: ask it where its headers are
        r = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                           capture_output=True, text=True, timeout=60)
        for inc in re.findall(r'-I"?([^" ]+/include)"?', r.stdout + r.stderr):
            if Path(inc, "cuda_bf16.h").exists():
                return inc
    return None


@functools.lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    gxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if not gxx:
        raise ToolchainMissing("g++ not found")
    try:
        import cutlass_library
    except ImportError:
        raise ToolchainMissing("nvidia-cutlass (CUTLASS's headers) is not installed") from None
    cuda = _cuda_include()
    if cuda is None:
        raise ToolchainMissing("CUDA's headers (cuda_bf16.h) not found: set CUDA_HOME")
    includes = [str(HERE), str(Path(cutlass_library.source_path) / "include"), cuda]
    if Path(cuda, "cccl").is_dir():          # CUDA 13 keeps libcu++ (cuda/std/...) there
        includes.append(str(Path(cuda, "cccl")))
    return Toolchain(gxx, tuple(includes))


@functools.lru_cache(maxsize=1)
def cache_dir() -> Path:
    path = os.environ.get("EPIC_HOSTSIM_CACHE")
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    tmp = Path(tempfile.mkdtemp(prefix="epic-hostsim-"))
    atexit.register(shutil.rmtree, tmp, True)
    return tmp


def key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------ libraries
_SIGNATURES = {
    "epic_launch": ([ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong), ctypes.POINTER(ctypes.c_float),
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
    "epic_workspace_size": ([ctypes.POINTER(ctypes.c_longlong)], ctypes.c_size_t),
    "epic_info": ([], ctypes.c_char_p),
}


class HostLibrary:
    """One host-compiled kernel, with runtime/loader.KernelLibrary's interface (info, workspace_size,
    launch), so runtime/binding.py binds it like a built kernel."""

    def __init__(self, dll: ctypes.CDLL, prefix: str, name: str):
        self.name = name
        self.fns = {}
        for fn, (argtypes, restype) in _SIGNATURES.items():
            f = getattr(dll, prefix + fn)
            f.argtypes, f.restype = argtypes, restype
            self.fns[fn] = f
        self.info = json.loads(self.fns["epic_info"]().decode())

    def workspace_size(self, sizes: list[int]) -> int:
        return int(self.fns["epic_workspace_size"]((ctypes.c_longlong * len(sizes))(*sizes)))

    def launch(self, ptrs, sizes, scalars, stream: int = 0, workspace: int = 0, workspace_bytes: int = 0) -> None:
        p = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        s = sizes if isinstance(sizes, ctypes.Array) else (ctypes.c_longlong * len(sizes))(*sizes)
        f = scalars if isinstance(scalars, ctypes.Array) else (ctypes.c_float * max(1, len(scalars)))(*scalars)
        rc = self.fns["epic_launch"](p, s, f, stream, workspace or None, workspace_bytes)
        if rc != 0:
            raise self.launch_error(rc)

    @property
    def launch_function(self):
        return self.fns["epic_launch"]

    def launch_error(self, rc: int) -> AssertionError:
        return AssertionError(f"host kernel {self.info.get('kernel')} ({self.name}) returned {rc}")


_BUILT: dict[str, HostLibrary] = {}     # source key -> library, for this process
_REFUSED: dict[str, Exception] = {}     # source key -> why it cannot be translated


def _unit_text(translations: list[tuple[str, str]]) -> str:
    """One translation unit of translated kernels, each exported under its key."""
    parts = ["// epic host simulator: generated kernels translated for the host (tests/hostsim)",
             '#include "hostsim.hpp"', "#define EPIC_API", ""]
    exports = []
    for k, cxx in translations:
        ns = f"hs_{k}"
        parts.append(cxx)
        exports += [
            f'extern "C" __attribute__((visibility("default"))) int {ns}_epic_launch(void* const* p, '
            f"const long long* s, const float* f, void* st, void* w, size_t wb) {{ return {ns}::epic_launch(p, s, f, st, w, wb); }}",
            f'extern "C" __attribute__((visibility("default"))) size_t {ns}_epic_workspace_size(const long long* s) '
            f"{{ return {ns}::epic_workspace_size(s); }}",
            f'extern "C" __attribute__((visibility("default"))) const char* {ns}_epic_info(void) '
            f"{{ return {ns}::epic_info(); }}"]
    return "\n".join(parts + exports) + "\n"


def _compile(text: str) -> Path:
    tc = toolchain()
    headers = "".join(p.read_text() for p in (HERE / "hostsim.hpp", NODES / "epic_nodes" / "arith.hpp"))
    h = key(text + headers + " ".join(FLAGS))
    lib = cache_dir() / f"hostsim_{h}.so"
    if lib.exists():
        return lib
    cpp = cache_dir() / f"hostsim_{h}.cpp"
    cpp.write_text(text)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    cmd = [tc.gxx, *FLAGS, f"-I{NODES}", *[f"-I{i}" for i in tc.includes], str(cpp), "-o", str(tmp)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        errors = "\n".join(line for line in r.stderr.splitlines() if "error" in line)[:6000]
        raise AssertionError(f"g++ failed on the host translation {cpp}:\n{errors or r.stderr[-6000:]}")
    os.replace(tmp, lib)
    return lib


def prebuild(sources: list[str], jobs: int | None = None) -> None:
    """Compile every source not built yet in this process, spread over `jobs` translation units
    (default: one per core) compiled in parallel. A source that cannot be translated (a node type
    without emulation, an unknown shape) is remembered: build() raises its error."""
    translations = {}
    for s in sources:
        k = key(s)
        if k in _BUILT or k in _REFUSED or k in translations:
            continue
        try:
            translations[k] = translate(s, f"hs_{k}")
        except AssertionError as e:
            _REFUSED[k] = e
    if not translations:
        return
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(translations)))
    groups: list[list[tuple[str, str]]] = [[] for _ in range(jobs)]
    for k, cxx in sorted(translations.items(), key=lambda kv: -len(kv[1])):   # balance by size
        min(groups, key=lambda g: sum(len(x[1]) for x in g)).append((k, cxx))
    with ThreadPoolExecutor(jobs) as pool:
        libs = list(pool.map(_compile, [_unit_text(g) for g in groups]))
    for group, lib in zip(groups, libs):
        dll = ctypes.CDLL(str(lib))
        for k, _ in group:
            _BUILT[k] = HostLibrary(dll, f"hs_{k}_", k)


def build(sources: list[str]) -> list[HostLibrary]:
    """Host libraries of generated kernel sources, compiled (prebuild) where needed."""
    prebuild(sources)
    for s in sources:
        if key(s) in _REFUSED:
            raise _REFUSED[key(s)]
    return [_BUILT[key(s)] for s in sources]
