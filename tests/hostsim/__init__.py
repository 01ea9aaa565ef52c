"""A host (CPU) simulator of epic's generated kernels: runs what a generated source says, compiled
with g++ for the host, and compares it with the reference interpreter (no GPU needed).

  parse.py      reads a generated gemm or combine source (functors, nodes, edges, initializers, ...)
  abi.py        checks its C ABI by roles (which pointer each use names, against epic_info)
  nodes.py      the host emulation of each visitor node type, keyed by the type's name
  hostsim.hpp   the emulations (CUTLASS semantics) and CUDA shims, in C++; the emulations of epic's
                custom nodes call the nodes' own arithmetic (templates/nodes/epic_nodes/arith.hpp)
  translate.py  a source -> host C++ (gemm: an emulation of its epilogue DAG; combine: the source
                itself, its launch run warp by warp with shuffles emulated)
  compiler.py   g++ in few translation units, cached; ctypes libraries with the runtime's interface
  compare.py    tolerances (those of the GPU tests; integers exact)
  harness.py    a program at sizes and a configuration: run on the host, check against the reference
  program.py    a program whose kernels run on the host, called like a CompiledProgram (run_sharded)

What it cannot see: anything CUTLASS does (the emulations encode CUTLASS's semantics as its
sources and epic's node headers state them; of the custom nodes only the arithmetic is their own
code), the fragment layout beyond column pairs, performance, and device-only numerics (fast-math
intrinsics run as accurate host functions).

Adding a visitor node kind: an entry in nodes.py and a host struct in hostsim.hpp.
"""
from .compiler import ToolchainMissing, toolchain


def require_toolchain() -> None:
    """Skip the calling test or fixture where the host compiler is missing (say why)."""
    import pytest
    try:
        toolchain()
    except ToolchainMissing as e:
        pytest.skip(f"host simulator unavailable: {e}")

from .harness import Case, check, make_inputs, prepare, problems, run
from .nodes import EMULATIONS, NoHostEmulation

__all__ = ["Case", "check", "make_inputs", "prepare", "problems", "run", "toolchain", "ToolchainMissing",
           "EMULATIONS", "NoHostEmulation", "require_toolchain"]
