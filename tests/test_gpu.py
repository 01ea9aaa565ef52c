"""Generated kernels on a GPU against the reference interpreter (run on the H200: docs/GPU.md).

Every supported program, at tile-multiple and ragged sizes, on fresh random inputs, outputs and
intermediates poisoned with NaN first. Each kernel is compared with the reference run of the
*rewritten* program in dtype-rounding mode (the roundings the kernels make), fed with the
intermediate tensors the GPU's earlier kernels produced: a chain is then checked kernel by kernel
on exactly the inputs each kernel saw (otherwise a 1-ulp difference in a bf16 intermediate, which
f32 vs float64 arithmetic makes now and then, would be amplified by the next GEMM). The rewrite
itself is proven against the source program in tests/test_passes.py.
"""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import epic
from epic import reference
from epic.diagnostics import EpicError

from .gpu_cases import PROGRAMS, SIZES, make_inputs, path, to_device

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

_COMPILED = {}


def compiled(name):
    if name not in _COMPILED:
        _COMPILED[name] = epic.compile(path(name))
    return _COMPILED[name]


def check_close(name, got, want, dtype):
    got = got.detach().cpu().double()
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert not torch.isnan(got).any(), f"{name}: {int(torch.isnan(got).sum())} elements unwritten (still NaN)"
    scale = want.pow(2).mean().sqrt().item() + 1e-30
    if dtype in ("bf16", "f16"):
        rtol, atol = 2 ** -7, 1e-3 * scale
    elif dtype in ("e4m3", "e5m2"):       # one step of a 3-bit mantissa, where f32 and float64 round apart
        rtol, atol = 2 ** -3, 1e-3 * scale
    elif dtype in ("i8", "i32"):
        rtol, atol = 0.0, 1.0
    else:
        rtol, atol = 1e-4, 1e-5 * scale
    bad = (got - want).abs() > atol + rtol * want.abs()
    if bad.any():
        idx = bad.nonzero()[:8].tolist()
        rows = sorted(set(bad.nonzero()[:, 0].tolist())) if got.dim() > 1 else []
        detail = "; ".join(f"{tuple(i)}: got {got[tuple(i)].item():.6g} want {want[tuple(i)].item():.6g}" for i in idx)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements off (rtol {rtol:.3g}, atol {atol:.3g}); "
                             f"rows {rows[:10]}{'...' if len(rows) > 10 else ''}; {detail}")


def _recompute(prog, inputs, out, sizes, plan, name):
    """The reference value of intermediate `name`, computed from the GPU's values of every other
    intermediate (so only the kernel that stores `name` is under test)."""
    others = {t.name: out[t.name] for t in prog.program.tensors.values()
              if t.role in ("tmp", "buffer") and t.name != name}
    interp = reference.Interpreter(prog.program, sizes, exact=False, tiles=plan.tiles())
    interp.run(inputs, override=others)
    return interp.store[name]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernel_matches_reference(name, size):
    prog = compiled(name)
    sizes = PROGRAMS[name](*size)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed=hash((name, size)) % 2**16)
    out = prog(poison=True, keep=True, **to_device(prog.program, inputs))
    torch.cuda.synchronize()
    plan = prog.plan(sizes)
    checked = [t for t in prog.program.tensors.values() if t.role in ("out", "tmp", "buffer")]
    interp = reference.Interpreter(prog.program, sizes, exact=False, tiles=plan.tiles())
    interp.run(inputs, override={t.name: out[t.name] for t in checked if t.role != "out"})
    for t in checked:
        want = interp.store[t.name] if t.role == "out" else _recompute(prog, inputs, out, sizes, plan, t.name)
        check_close(t.name, out[t.name], want, t.dtype.name)


def test_results_do_not_depend_on_the_run():
    """Deterministic partials: the same inputs give bit-identical outputs, run after run."""
    prog = compiled("samples/residual_rmsnorm.epi")
    sizes = dict(M=333, D=392)
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 1))
    first = prog(**inputs)
    for _ in range(3):
        again = prog(**inputs)
        for k in first:
            assert torch.equal(first[k], again[k])


def test_inside_torch_compile():
    prog = compiled("samples/bias_gelu.epi")
    op = prog.torch_op()

    def model(x, w, bias):
        return op(x=x, w=w, bias=bias)["y"].float() * 2

    sizes = dict(M=64, K=128, N=256)
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 2))
    eager = model(**inputs)
    fn = torch.compile(model, fullgraph=True)
    assert torch.equal(fn(**inputs), eager)


def test_wrong_tensors_are_refused_before_launch():
    prog = compiled("samples/bias_gelu.epi")
    sizes = dict(M=64, K=128, N=256)
    good = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 3))
    with pytest.raises(EpicError) as info:
        prog(**dict(good, w=good["w"].contiguous()))          # row-major B
    assert info.value.codes == ["E605"]
    with pytest.raises(EpicError) as info:
        prog(**dict(good, x=good["x"].cpu()))
    assert info.value.codes == ["E604"]
    unaligned = torch.empty(64 * 128 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(64, 128)
    with pytest.raises(EpicError) as info:
        prog(**dict(good, x=unaligned))
    assert info.value.codes == ["E606"]


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not installed")
def test_ragged_case_is_memcheck_clean():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import torch, epic\n"
            "from tests.gpu_cases import make_inputs, to_device, path\n"
            "p = epic.compile(path('samples/residual_rmsnorm.epi'))\n"
            "s = dict(M=77, D=392)\n"
            "out = p(poison=True, **to_device(p.program, make_inputs(p.analysis.source_program, s, 5)))\n"
            "torch.cuda.synchronize(); print('ran', {k: tuple(v.shape) for k, v in out.items()})\n")
    r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", sys.executable, "-c", code],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(path(".")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ERROR SUMMARY: 0 errors" in r.stdout + r.stderr
