"""The kernel libraries of one compiled program, per plan configuration: generated (epic/codegen),
compiled or found in the kernel cache (runtime/build.py) and loaded (runtime/loader.py) once, for
every input signature whose plan has that configuration. Under EPIC_BUILD_IN_BACKGROUND a call asks
first whether they are ready (runtime/background.py builds them meanwhile)."""
from __future__ import annotations

import threading

from ..codegen import emit, vendor
from . import background, build, loader, vendor_gemm


def key(configs: dict) -> tuple:
    """A plan's configurations as a key: the same kernels for every signature that has them."""
    return tuple(sorted((k, str(c)) for k, c in configs.items()))


class Kernels:
    """The libraries of one program's kernels (see the module docstring)."""

    def __init__(self, program):
        self.program = program
        self._loaded: dict[tuple, list] = {}        # key(configs) -> (spec, KernelLibrary) per kernel
        self._lock = threading.Lock()
        self._builds = background.Builds()

    def ready(self, configs: dict) -> bool:
        """Whether libraries(configs) can load them without waiting for nvcc; starts their build in the
        background, once, where it cannot."""
        k = key(configs)
        return k in self._loaded or self._builds.ready(k, lambda: [u for _, u in emit.units(self.program, configs)])

    def libraries(self, configs: dict) -> list:
        """(spec, KernelLibrary) per launched kernel, in the program's order; built and loaded the first
        time (a failed build raises what nvcc said)."""
        k = key(configs)
        with self._lock:
            if k not in self._loaded:
                pairs = emit.units(self.program, configs)
                paths = dict(zip((spec.name for spec, _ in pairs), build.build_all([u for _, u in pairs])))
                self._loaded[k] = [(spec, library(spec, paths)) for spec in emit.specs(self.program, configs)]
            return self._loaded[k]


def library(spec, paths: dict):
    """The loaded library of one launched kernel: its built unit's (paths: kernel name -> library
    path), or the vendor's gemm."""
    if isinstance(spec, vendor.VendorGemmSpec):
        return vendor_gemm.VendorGemm(spec)
    return loader.load(paths[spec.name], [f"{p.role}:{p.tensor}" for p in spec.pointers])
