import importlib.util
import os
import pathlib
import sys

import pytest

# Every program the suite compiles is verified after every pass (epic/ir/verify.py and each pass's
# `ensures`): a pass that breaks an invariant fails the test that compiled the program.
os.environ.setdefault("EPIC_VERIFY", "1")

# Without a GPU the compiled launcher (epic/runtime/fastcall.py) would only be built, never used:
# tests that run `epic build` in a fresh cache would each spend ~40 s on it. tests/test_fastcall.py
# turns it on for itself; on a GPU machine every test uses it, as users do.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("EPIC_LAUNCHER", "ctypes")

from epic import pipeline
from epic.diagnostics import EpicError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "samples").glob("*.epi"))


def bench_module(name: str):
    """bench/NAME.py imported as module `bench_NAME` (bench/ is scripts, not a package); bench/ goes on
    sys.path first, for the scripts that import their neighbours (bench.py, profiling.py)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def analyze(text: str, **kw):
    return pipeline.analyze(text, name="t.epi", **kw)


def planned_plain(options: str, sizes: dict, override: dict | None = None):
    """The identity gemm `g` written `with OPTIONS`, planned at sizes (with a call's override):
    (program, its kernel configuration)."""
    from epic.codegen import emit
    prog = analyze(f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) with {options} {{\n  out y: bf16 = acc\n}}\n").program
    [cfg] = emit.kernel_configs(prog, sizes["M"], override, sizes).values()
    return prog, cfg


def diagnose(text: str, **kw) -> EpicError:
    """The EpicError a program raises (fails the test if it compiles)."""
    with pytest.raises(EpicError) as info:
        analyze(text, **kw)
    return info.value


def nvcc_host_program(tmp_path_factory, name: str, source: str) -> pathlib.Path:
    """A CUDA source compiled for the host with nvcc against CUTLASS and epic's node headers (for tests of
    a header's host-side logic); skips where nvcc is missing. Returns the executable."""
    import shutil
    import subprocess
    from epic.runtime import build
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc not installed")
    d = tmp_path_factory.mktemp(name)
    (d / "driver.cu").write_text(source)
    exe = d / "driver"
    includes = [f"-I{p}" for p in build.cutlass_paths()[1]] + [f"-I{ROOT / 'templates' / 'nodes'}"]
    subprocess.run([nvcc, "-std=c++17", "-O1", "--expt-relaxed-constexpr", *includes, str(d / "driver.cu"),
                    "-o", str(exe)], check=True, capture_output=True)
    return exe
