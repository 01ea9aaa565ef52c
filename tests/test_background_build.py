"""EPIC_BUILD_IN_BACKGROUND=1 (epic/runtime/background.py): while a call's kernels build, calls run
the unfused torch form; the first call after the build binds the kernels. On this CPU machine the
call sees a CUDA device (validate is patched) and binding is where the test stops (a sentinel)."""
import threading
import time

import pytest
import torch

import epic
from epic.runtime import build, compiled

from .test_cache import Fake

PLAIN = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n"


class Bound(Exception):
    """Raised where the call would bind (and launch) the fused kernels."""


@pytest.fixture
def setup(tmp_path, monkeypatch):
    fake = Fake(tmp_path, monkeypatch)
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    monkeypatch.delenv("EPIC_BUNDLE", raising=False)
    real = compiled.validate

    def on_a_gpu(program, args):
        tensors, scalars, _, sizes = real(program, args, cuda=False)
        return tensors, scalars, torch.device("cuda", 0), sizes

    monkeypatch.setattr(compiled, "validate", on_a_gpu)
    monkeypatch.setattr(compiled.CompiledProgram, "_bind", lambda self, sizes, device: (_ for _ in ()).throw(Bound()))
    gate = threading.Event()
    real_build_all = build.build_all
    monkeypatch.setattr(build, "build_all", lambda units, jobs=None, quiet=False:
                        (gate.wait(60), real_build_all(units, jobs, quiet))[1])
    args = dict(x=torch.randn(64, 128).bfloat16(), w=torch.randn(64, 128).bfloat16().t())
    return fake, gate, args


def wait_built(prog):
    deadline = time.monotonic() + 60
    while not all(f.done() for f in prog._kernels._builds._pending.values()):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_calls_run_the_unfused_form_until_the_kernels_are_built(setup, monkeypatch):
    fake, gate, args = setup
    monkeypatch.setenv("EPIC_BUILD_IN_BACKGROUND", "1")
    prog = epic.compile(PLAIN)
    for _ in range(2):
        out = prog(**args)
        assert torch.equal(out["y"], prog.unfused(**args)["y"])
    assert fake.calls == 0                      # the build waits on the gate: nvcc has not run
    gate.set()
    wait_built(prog)
    with pytest.raises(Bound):
        prog(**args)
    assert fake.calls == 1


def test_built_kernels_are_bound_at_once(setup, monkeypatch):
    fake, gate, args = setup
    gate.set()
    prog = epic.compile(PLAIN)
    build.build_all([u for _, u in prog.units({"M": 64, "K": 128, "N": 64})], quiet=True)
    monkeypatch.setenv("EPIC_BUILD_IN_BACKGROUND", "1")
    with pytest.raises(Bound):
        prog(**args)


def test_off_by_default(setup):
    fake, gate, args = setup
    gate.set()
    with pytest.raises(Bound):
        epic.compile(PLAIN)(**args)


def test_a_process_that_exits_mid_build_stops_its_nvcc(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    from .test_cache import wait_dead
    fake = Fake(tmp_path, monkeypatch)
    fake.mode("hang")                           # an nvcc that never finishes
    code = ("import os, time\n"
            "from epic.runtime import background, build\n"
            "u = build.Unit('k', '// kernel\\n', uses_cutlass=False)\n"
            "assert not background.Builds().ready(('k',), lambda: [u])\n"
            f"while not os.path.exists({str(fake.pids)!r}): time.sleep(0.05)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert wait_dead(int(p) for p in fake.pids.read_text().split())
