"""Dynamic per-token quantization: a quantizing tile store that needs a whole-row statistic.

A per-row scale must never be moved across a rounding, saturating store (i8(a / s) with s = amax / 127
stored as i8(a * 127) saturates wherever |a| > 1). Such stores are finished by the row combine kernel
from the unquantized value the gemm stores (epic/checks/row_finish.py). Checked here on the float64
interpreter: the rewritten plan computes what the source program means, per quantized dtype; the
kernels themselves run on the host in tests/test_hostsim.py (tests/programs/per_token_*.epi) and on
the H200 in tests/test_gpu.py.
"""
import pytest
import torch

from epic import pipeline, reference
from epic.diagnostics import EpicError
from epic.passes import defer_row_scale
from epic.plan import ledger, planner, verify

from .conftest import ROOT

CHAIN = """
gemm g1(x: bf16[M, K] @ w1: bf16[K, N]) {{
  s = row_amax(acc) / {qmax}
  tmp sc: f32[M] = s
  tmp q: {dt} = acc / s
}}
gemm g2(q @ w2: {dt}[N, P]) {{
  out y: bf16 = acc * sc
}}
"""
OUT = """
gemm g(x: bf16[M, K] @ w: bf16[K, N]) {{
  in bias: bf16[N]
  h = acc + bias
  s = row_amax(h) / {qmax}
  out sc: f32[M] = s
  out q: {dt} = h / s
}}
"""
SIZES = dict(M=77, K=200, N=400, P=136)       # ragged against every tile


def errors(text, seed=0):
    a = pipeline.analyze(text, name="t.epi")
    sizes = {d: v for d, v in SIZES.items() if d in a.source_program.dims}
    inputs = reference.random_inputs(a.source_program, sizes, seed)
    for x in inputs.values():       # accumulators well above 1, so that a scale moved across the store saturates
        if x.dtype == torch.bfloat16 and x.dim() == 2:
            x.mul_(4)
    return a, verify.equivalence(a, inputs, sizes)


@pytest.mark.parametrize("dt, qmax", [("i8", 127), ("e4m3", 448)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_quantized_a_operand_keeps_its_row_scale(dt, qmax, seed):
    a, err = errors(CHAIN.format(dt=dt, qmax=qmax), seed)
    assert err["y"] <= 1e-12, err
    assert "q__rowscale" not in a.program.tensors      # nothing deferred across the store


@pytest.mark.parametrize("dt, qmax", [("i8", 127), ("i4", 7), ("e4m3", 448), ("e5m2", 57344), ("f16", 1)])
def test_a_quantized_output_is_finished_row_by_row(dt, qmax):
    a, err = errors(OUT.format(dt=dt, qmax=qmax))
    assert err == {"sc": pytest.approx(0, abs=1e-12), "q": pytest.approx(0, abs=1e-12)}
    combine = a.program.kernel("g__row_combine")
    assert [s.tensor for s in combine.stores] == ["sc", "q"]
    gemm = a.program.kernel("g")
    assert [s.tensor for s in gemm.stores if not s.tensor.startswith("g__")] == ["q__pre0"]
    assert a.program.tensors["q__pre0"].dtype.name == "f32"      # unquantized: nothing rounded the source does not round


def test_an_explicit_quantizing_cast_inside_a_bf16_store_is_not_crossed():
    text = CHAIN.format(dt="bf16", qmax=448).replace("tmp q: bf16 = acc / s", "tmp q: bf16 = e4m3(acc / s)")
    a, err = errors(text)
    assert err["y"] <= 1e-12
    assert "q__rowscale" not in a.program.tensors


def test_a_bf16_a_operand_is_still_deferred():
    a, err = errors(CHAIN.format(dt="bf16", qmax=1))
    assert err["y"] <= 1e-12
    assert "q__rowscale" in a.program.tensors      # the scale moves into g2: no round trip of the row


@pytest.mark.parametrize("name", ["per_token_i8", "per_token_fp8", "per_token_i4"])
def test_programs_rewrite_equivalently(name):
    text = (ROOT / "tests" / "programs" / f"{name}.epi").read_text()
    _, err = errors(text)
    assert all(e <= 1e-12 for e in err.values()), err


def test_the_plan_shows_the_row_combine_kernel_quantizing():
    a = pipeline.analyze(CHAIN.format(dt="i8", qmax=127), name="t.epi")
    plan = planner.make_plan(a.program, SIZES, {"g1": {"combine": "kernel"}})    # at M = 77, not the tail
    text = ledger.render(plan, a.source_program)
    assert "g1__row_combine: combine of g1's per-tile partials (rows)" in text
    assert "quantizes q from q__pre0" in text
    combine = next(s for s in plan.steps if s.kernel.name == "g1__row_combine")
    assert combine.reads == ["g1__row_amax_part0", "q__pre0"] and combine.writes == ["sc", "q"]
    assert "q__pre0" in next(s for s in plan.steps if s.kernel.name == "g1").writes


def test_ensures_catches_a_scale_moved_across_a_quantizing_store(monkeypatch):
    """The pass's guarantee is checked independently of the pass: a deferral that ignores the store's
    dtype is caught by `ensures row-scales-deferred` (EPIC_VERIFY is set for the suite)."""
    monkeypatch.setattr(defer_row_scale, "_stays", lambda *a: False)
    with pytest.raises(Exception) as info:
        pipeline.analyze(CHAIN.format(dt="i8", qmax=127), name="t.epi")
    assert "moved across its i8 store" in str(info.value)


def test_a_quantized_store_that_needs_a_column_statistic_is_still_refused():
    text = OUT.format(dt="i8", qmax=127).replace("out q: i8 = h / s", "out q: i8 = h / col_amax(h)")
    with pytest.raises(EpicError) as info:
        pipeline.analyze(text, name="t.epi")
    assert info.value.diagnostics[0].code == "E302"

