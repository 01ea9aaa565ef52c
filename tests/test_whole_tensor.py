"""Whole-tensor reductions (all_f(x) = col_f(row_f(x))): their meaning, checked against torch by hand,
the kernels split-reductions makes for them, the code those kernels get, and the errors around them.
The generated kernels themselves run against the reference in tests/test_hostsim.py (CPU) and
tests/test_gpu.py (H200) through tests/programs/whole_tensor.epi and samples/fp8_delayed_scaling.epi."""
import math

import pytest
import torch

from epic import reference
from epic.plan import planner

from .conftest import ROOT, analyze, diagnose

GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in bias: f32[N]\n  h = acc + bias\n"


def _run(body: str, sizes=dict(M=37, K=24, N=50), seed=3):
    prog = analyze(GEMM + body + "}\n").source_program
    inputs = reference.random_inputs(prog, sizes, seed)
    h = inputs["x"].double() @ inputs["w"].double() + inputs["bias"].double()
    return reference.run(prog, inputs), h


@pytest.mark.parametrize("fn, by_hand", [
    ("sum", lambda h: h.sum()),
    ("mean", lambda h: h.mean()),
    ("max", lambda h: h.max()),
    ("min", lambda h: h.min()),
    ("amax", lambda h: h.abs().max()),
    ("lse", lambda h: torch.log(torch.exp(h).sum())),
])
def test_each_reduction_over_the_whole_result(fn, by_hand):
    out, h = _run(f"  out a: f32 = all_{fn}(h)\n")
    assert out["a"].shape == ()
    assert math.isclose(out["a"].item(), by_hand(h).item(), rel_tol=1e-12, abs_tol=1e-12)


def test_two_step_spellings_and_scalar_math():
    out, h = _run("  out peak: f32 = col_max(row_max(h))\n"
                  "  out least_peak: f32 = row_min(col_max(h))\n"
                  "  out inv: f32 = 448 / max(all_amax(h), 1e-12)\n")
    assert out["peak"].item() == h.max().item()
    assert out["least_peak"].item() == h.max(0).values.min().item()
    assert math.isclose(out["inv"].item(), 448 / h.abs().max().item(), rel_tol=1e-12)


def _kernels(path: str):
    return analyze((ROOT / path).read_text()).program.kernels


def test_split_gives_a_one_warp_kernel_after_the_row_and_column_combines():
    ks = _kernels("tests/programs/whole_tensor.epi")
    assert [(k.name, getattr(k, "axis", k.kind)) for k in ks] == [
        ("g", "gemm"), ("g__row_combine", "row"), ("g__col_combine", "col"), ("g__all_combine", "all"),
        ("g2", "gemm")]
    stats = {"amax", "total", "avg", "lo", "lse", "peak", "least_peak", "inv"}
    assert {s.tensor for s in ks[3].stores} == stats
    assert not any(s.tensor in stats for k in ks if k.name != "g__all_combine" for s in k.stores)
    lanes = {s.tensor for k in ks[1:3] for s in k.stores if "__" in s.tensor}
    read = {v.attrs["buffer"] for v in ks[3].values if v.op == "combine"}
    assert read == lanes and len(lanes) == 7       # amax and inv share one


def test_later_gemm_reads_the_statistic_from_device_memory():
    a = analyze((ROOT / "tests/programs/whole_tensor.epi").read_text())
    plan = planner.make_plan(a.program, dict(M=77, K=200, N=392, P=64))
    step = next(s for s in plan.steps if s.kernel.name == "g2")
    assert "inv" in step.reads
    assert plan.buffers["inv"].shape == () and plan.buffers["inv"].writer == "g__all_combine"


def test_generated_code():
    from epic.codegen import emit
    a = analyze((ROOT / "tests/programs/whole_tensor.epi").read_text())
    units = emit.units(a.program, emit.kernel_configs(a.program, 77))
    sources = {k.name: u.source for k, (_, u) in zip(a.program.kernels, units)}
    assert "const dim3 grid(1), block(32);" in sources["g__all_combine"]
    assert "griddepcontrol.wait" in sources["g__all_combine"]     # launched as a dependent of g (PDL)
    assert "__syncthreads" not in sources["g__all_combine"]      # one warp: shuffles only
    assert "{{0.f}, {static_cast<float const*>(p[3])}, {}}" in sources["g2"]   # p[3]: scalar:inv
    assert '\\"scalar:inv\\"' in sources["g2"]


@pytest.mark.parametrize("body, code, words", [
    ("  out y: bf16 = acc / all_max(acc)\n", "E303", ["'y'", "all_max", "later gemm"]),
    ("  out r: f32[M] = row_sum(h) / all_sum(h)\n", "E303", ["'r'", "all_sum"]),
    ("  out a: f32 = all_max(row_max(h))\n", "E206", ["all_max", "column vector", "col_max"]),
    ("  out a: f32 = col_max(bias)\n", "E206", ["col_max", "row vector", "row_max"]),
    ("  out a: bf16 = all_max(h)\n", "E205", ["f32"]),
    ("  in alpha: f32\n  out a: f32 = alpha * 2\n", "E206", ["host", "all_amax"]),
])
def test_misuse_is_a_located_error(body, code, words):
    err = diagnose(GEMM + body + "}\n")
    assert err.codes[0] == code, err
    text = str(err)
    for w in words:
        assert w in text, (w, text)
    assert ":4:" in text or ":5:" in text       # the line of the offending statement
