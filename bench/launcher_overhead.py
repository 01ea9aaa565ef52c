"""The compiled launcher's own host cost per call, on any machine (no GPU): templates/launcher.cpp
drives a kernel that does nothing (a C function returning 0, built here with the C compiler) on CPU
tensors, so what is timed is the keyword lookup, the signature match, the buffer allocations and the
launch bookkeeping, without CUDA's launch or the GPU allocator.

  python bench/launcher_overhead.py
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from epic.runtime import fastcall  # noqa: E402

NOOP = "#include <stddef.h>\nint noop(void** p, const long long* d, const float* s, void* st, void* ws, size_t n) { return 0; }\n"


def noop_address(tmp: str) -> tuple[ctypes.CDLL, int]:
    src, lib = os.path.join(tmp, "noop.c"), os.path.join(tmp, "libnoop.so")
    with open(src, "w") as f:
        f.write(NOOP)
    subprocess.run([fastcall.compiler() or "cc", "-x", "c", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
    handle = ctypes.CDLL(lib)
    return handle, ctypes.cast(handle.noop, ctypes.c_void_p).value


def launcher(module, address: int, inputs: int, buffers: int, launches: int):
    """A plan of `inputs` [64, 128] float tensors and `buffers` more, the first buffer the only output
    (the rest land in the arena), and `launches` no-op launches that each see every tensor."""
    fast = module.Launcher()
    xs = [torch.zeros(64, 128) for _ in range(inputs)]
    outputs = list(range(inputs, inputs + min(1, buffers)))
    fast.add(0, -1, xs, [list(x.shape) for x in xs], [list(x.stride()) for x in xs],
             [torch.empty(0)] * buffers, [[64, 128]] * buffers, [address] * launches,
             [list(range(inputs + buffers))] * launches, [[64, 128, 64]] * launches, [[]] * launches,
             [[]] * launches, [0] * launches, outputs, list(range(inputs, inputs + buffers)))
    names = [f"t{i}" for i in range(inputs)]
    fast.names(names, [], [])
    fast.label(0, [f"b{j}" for j in range(len(outputs))], [f"b{j}" for j in range(buffers)])
    return fast, dict(zip(names, xs))


def per_call_us(fn, n: int = 20000, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> int:
    os.environ.setdefault("EPIC_LAUNCHER", "compiled")
    module = fastcall._module()
    if module is None:
        print(f"no compiled launcher: {fastcall.why_not()}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        handle, address = noop_address(tmp)
        print("inputs buffers launches   call() us   (best of 5 x 20000 calls)")
        for inputs, buffers, launches in [(1, 0, 1), (1, 1, 1), (3, 1, 1), (8, 1, 1), (7, 3, 4), (7, 6, 4)]:
            fast, kwargs = launcher(module, address, inputs, buffers, launches)
            assert isinstance(fast.call(kwargs, False), dict)
            print(f"{inputs:6d} {buffers:7d} {launches:8d}   {per_call_us(lambda: fast.call(kwargs, False)):9.2f}")
        print(f"torch.empty(64, 128) alone: {per_call_us(lambda: torch.empty(64, 128)):.2f} us")
        del handle
    return 0


if __name__ == "__main__":
    sys.exit(main())
