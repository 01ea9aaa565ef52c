"""Gemms on the vendor's library (`backend=cublas`: epic/plan/backend.py, codegen/vendor.py,
runtime/vendor_gemm.py, templates/launcher.cpp's vendor launches), without a GPU.

Which gemms may take it (the accumulator, or the accumulator plus one tensor, in the operands'
dtype), what the heuristic and the tuner choose, and the launches themselves: run by the host
simulator's harness (torch's CPU gemm where cuBLAS runs on the GPU) on both launch paths and checked
against the reference interpreter, operands transposed or not. tests/test_gpu_vendor_gemm.py runs
them on the H200."""
import itertools
import re

import pytest
import torch

import epic
from epic.autodiff import derive as D
from epic.codegen import emit, vendor
from epic.diagnostics import EpicError
from epic.plan import backend, planner
from epic.runtime import vendor_gemm
from epic.tuning import space

from .conftest import ROOT
from .hostsim import harness
from .test_fastcall import module as launcher  # noqa: F401  (the compiled launcher, built once per module)

CE = str(ROOT / "samples" / "cross_entropy.epi")


def _program(tmp_path, text: str, name: str = "p.epi"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _gemm(body: str, operands: str = "a: bf16[M, K] @ b: bf16[K, N]", options: str = "") -> str:
    return f"gemm g({operands}){options} {{\n{body}\n}}\n"


def _form(tmp_path, text: str):
    prog = epic.compile(_program(tmp_path, text)).program
    return backend.vendor_form(prog.kernels[0], prog.tensors)


# ------------------------------------------------------------------------------- which gemms
def test_the_accumulator_and_the_accumulator_plus_a_tensor_fit(tmp_path):
    assert _form(tmp_path, _gemm("  out d: bf16 = acc")) == backend.VendorForm("d", None)
    assert _form(tmp_path, _gemm("  in c: bf16[M, N]\n  out d: bf16 = c + acc")) == backend.VendorForm("d", "c")
    assert _form(tmp_path, _gemm("  out d: f16 = acc", "a: f16[M, K] @ b: f16[K, N]")) == backend.VendorForm("d", None)


@pytest.mark.parametrize("body,operands,why", [
    ("  out d: bf16 = acc * 2.0", None, "a value computed from the accumulator in 'd' (mul)"),
    ("  out d: bf16 = acc\n  out e: bf16 = acc", None, "stores 2 tensors"),
    ("  out d: f32 = acc", None, "stores 'd' as f32"),
    ("  in c: f32[M, N]\n  out d: bf16 = acc + c", None, "adds 'c'"),
    ("  in c: bf16[N]\n  out d: bf16 = acc + c", None, "adds 'c'"),
    ("  out d: bf16 = acc", "a: e4m3[M, K] @ b: e4m3[K, N]", "operands are e4m3"),
])
def test_anything_else_is_refused_with_the_reason(tmp_path, body, operands, why):
    got = _form(tmp_path, _gemm(body, operands or "a: bf16[M, K] @ b: bf16[K, N]"))
    assert isinstance(got, str) and why in got, got


def test_a_file_asking_for_the_vendor_gemm_where_it_cannot_run_gets_e216(tmp_path):
    path = _program(tmp_path, _gemm("  out d: bf16 = silu(acc)", options=" with backend=cublas"))
    with pytest.raises(EpicError) as e:
        planner.make_plan(epic.compile(path).program, dict(M=64, N=64, K=64))
    d = e.value.diagnostics[0]
    assert d.code == "E216" and "cannot run on backend=cublas" in d.message and "computed from the accumulator" in d.message
    assert d.span is not None and d.span.line == 1


def test_the_vendor_gemm_takes_none_of_epics_kernel_options(tmp_path):
    path = _program(tmp_path, _gemm("  out d: bf16 = acc", options=" with backend=cublas, tile=128x128x64"))
    with pytest.raises(EpicError) as e:
        planner.make_plan(epic.compile(path).program, dict(M=64, N=64, K=64))
    assert e.value.diagnostics[0].code == "E216" and "tile" in e.value.diagnostics[0].message


def test_an_unknown_backend_is_a_syntax_level_refusal(tmp_path):
    path = _program(tmp_path, _gemm("  out d: bf16 = acc", options=" with backend=mkl"))
    with pytest.raises(EpicError) as e:
        epic.compile(path)
    assert "backend" in str(e.value) and "cublas" in str(e.value)


# ------------------------------------------------------------------------------- what is chosen
def _fused_ce(accumulate: bool = False):
    d = D.derive_source(CE, path=True, policy="fused", accumulate=accumulate)
    return epic.compile(d.forward_text).program


def test_the_heuristic_takes_the_vendor_gemm_for_a_loss_heads_gradients_at_a_vocabulary():
    """The fused loss's dX (K = V) and dW (M = V) gemms store their accumulator alone (dW plus the
    earlier chunks' sum): at V = 128256 they take cuBLAS, the gemm with the loss in its epilogue stays
    epic's; at V = 32000 all three stay epic's."""
    prog = _fused_ce(accumulate=True)
    big = planner.make_plan(prog, dict(M=4096, D=4096, V=128256)).configs
    assert {k: c.backend for k, c in big.items()} == {
        "lm_head_fused": "cutlass", "lm_head_da": "cublas", "lm_head_db": "cublas"}
    small = planner.make_plan(prog, dict(M=4096, D=4096, V=32000)).configs
    assert {c.backend for c in small.values()} == {"cutlass"}
    # a call's config wins over the heuristic, either way
    forced = planner.make_plan(prog, dict(M=4096, D=4096, V=128256), {"lm_head_da": {"backend": "cutlass"}}).configs
    assert forced["lm_head_da"].backend == "cutlass" and forced["lm_head_db"].backend == "cublas"
    tiled = planner.make_plan(prog, dict(M=4096, D=4096, V=128256), {"lm_head_db": {"tile": (128, 256, 64)}}).configs
    assert not tiled["lm_head_db"].vendor and tiled["lm_head_db"].tile == (128, 256, 64)


def test_epic_plan_names_the_backend_and_compile_writes_no_source_for_it(tmp_path, capsys):
    from epic_cli.main import main
    path = _program(tmp_path, _gemm("  out d: bf16 = acc", options=" with backend=cublas"))
    assert main(["plan", path, "--shape", "M=64,N=64,K=64"]) == 0
    assert re.search(r"g: gemm a @ b\s+\[cublas", capsys.readouterr().out)
    assert main(["compile", path, "-o", str(tmp_path / "out")]) == 0
    assert "g: no source (backend cublas" in capsys.readouterr().out
    assert not list((tmp_path / "out").glob("*.cu"))
    assert emit.units(epic.compile(path).program, {"g": planner.make_plan(epic.compile(path).program,
                                                                             dict(M=64, N=64, K=64)).configs["g"]}) == []


def test_the_tuner_times_the_vendor_gemm_beside_epics_where_it_can_run():
    prog = _fused_ce()
    kernels = {k.name: k for k in prog.kernels if k.kind == "gemm"}
    da = space.candidates(kernels["lm_head_da"], prog.tensors, 4096, 4096, depth=128256)
    assert da[0].backend == "cublas" and [c for c in da[1:] if c.vendor] == []   # the heuristic's first
    assert len(da) > 2 and all(c.backend == "cutlass" for c in da[1:])
    small = space.candidates(kernels["lm_head_da"], prog.tensors, 4096, 4096, depth=32000)
    assert small[0].backend == "cutlass" and small[1].backend == "cublas"
    assert sum(c.vendor for c in small) == 1
    head = space.candidates(kernels["lm_head_fused"], prog.tensors, 4096, 128256, depth=4096)
    assert not any(c.vendor for c in head)
    assert space.override(da[0]) == {"backend": "cublas"}


# ------------------------------------------------------------------------------- the launches
def _case(tmp_path, a_t: bool, b_t: bool, c: bool, sizes=dict(M=40, N=24, K=56)):
    text = (f"in a: {'bf16[K, M]' if a_t else 'bf16[M, K]'}\nin b: {'bf16[N, K]' if b_t else 'bf16[K, N]'}\n"
            + _gemm(("  in c: bf16[M, N]\n" if c else "") + f"  out d: bf16 = acc{' + c' if c else ''}",
                    f"{'a.T' if a_t else 'a'} @ {'b.T' if b_t else 'b'}", " with backend=cublas"))
    case = harness.prepare(_program(tmp_path, text, f"v{int(a_t)}{int(b_t)}{int(c)}.epi"), sizes, 64)
    assert case.sources == [] and [type(s) for s in case.vendor] == [vendor.VendorGemmSpec]
    return case


@pytest.mark.parametrize("a_t,b_t,c", list(itertools.product([False, True], repeat=3)))
def test_the_vendor_gemm_matches_the_reference(tmp_path, a_t, b_t, c):
    case = _case(tmp_path, a_t, b_t, c)
    assert [p.role for p in case.vendor[0].pointers] == (["A", "B", "C", "D"] if c else ["A", "B", "D"])
    with harness.one_torch_thread():
        assert harness.problems(case, harness.make_inputs(case, seed=3)) == []


def test_a_launch_that_ignores_a_transpose_is_caught(tmp_path, monkeypatch):
    """The check can fail: a square problem whose A is read untransposed gives wrong values."""
    case = _case(tmp_path, True, False, False, dict(M=48, N=16, K=48))
    monkeypatch.setattr(case.vendor[0], "a_t", False)
    with harness.one_torch_thread():
        found = harness.problems(case, harness.make_inputs(case, seed=3))
    assert found and "d" in found[0]


def test_the_fused_losss_later_chunks_with_their_gradients_on_the_vendor_gemm(tmp_path):
    """The program the fused loss runs on its second and later chunks, its dX and dW gemms given the
    vendor's gemm in its .epi text (dW adds the earlier chunks' sum: cuBLAS's beta = 1), against the
    reference; a ragged row count."""
    d = D.derive_source(CE, path=True, policy="fused", accumulate=True)
    text = re.sub(r"(gemm lm_head_d[ab]\([^)]*\))", r"\1 with backend=cublas", d.forward_text)
    assert text.count("with backend=cublas") == 2
    case = harness.prepare(_program(tmp_path, text, "later.epi"), dict(M=37, D=24, V=56), 64)
    assert sorted(s.name for s in case.vendor) == ["lm_head_da", "lm_head_db"]
    assert [p.role for p in next(s for s in case.vendor if s.name == "lm_head_db").pointers] == ["A", "B", "C", "D"]
    with harness.one_torch_thread():
        assert harness.problems(case, harness.make_inputs(case, seed=5)) == []


@pytest.mark.parametrize("a_t,b_t,c", [(False, True, True), (True, False, False)])
def test_the_compiled_launcher_runs_the_vendor_gemm_as_the_ctypes_path_does(tmp_path, launcher, a_t, b_t, c):
    case = _case(tmp_path, a_t, b_t, c)
    inputs = harness.make_inputs(case, seed=9)
    with harness.one_torch_thread():
        want = harness.run(case, inputs)
        kept, outputs = harness.run_compiled(case, inputs, launcher.Launcher())
    assert torch.equal(kept["d"].view(torch.uint8), want["d"].view(torch.uint8))
    assert torch.equal(outputs["d"].view(torch.uint8), want["d"].view(torch.uint8))


def test_the_compiled_launcher_refuses_a_stream_that_is_not_torchs(tmp_path, launcher):
    """ATen launches on torch's current stream: a call for another stream fails with -101 (the Python
    side turns it into E703), before anything runs."""
    from epic.runtime import binding, derived, fastcall
    case = _case(tmp_path, False, False, False)
    bound = binding.bind(case.plan, harness.libraries(case), -1)
    bound.device = torch.device("cpu")
    inputs = harness.make_inputs(case, seed=9)
    tensors = bound.inputs({n: inputs[n].contiguous() for n in ("a", "b")}, derived.Cache())
    fast = launcher.Launcher()
    plan = fastcall.register(fast, bound, tensors)
    got, failed, rc, _ = fast.run(tensors, [], 12345, False)
    assert (got, failed, rc) == (plan, 0, vendor_gemm.WRONG_STREAM)
    assert "not torch's current stream" in str(bound.launches[0].library.launch_error(rc))


def test_a_calls_backend_replaces_a_tuned_entry_instead_of_mixing_with_it():
    from epic.runtime.compiled import _merged
    tuned = {"tile": (128, 256, 64), "swizzle": 8}
    assert _merged(tuned, {"backend": "cublas"}) == {"backend": "cublas"}
    assert _merged({"backend": "cublas"}, {"swizzle": 2}) == {"swizzle": 2}
    assert _merged(tuned, {"swizzle": 2}) == {"tile": (128, 256, 64), "swizzle": 2}
    assert _merged(None, {"backend": "cublas"}) == {"backend": "cublas"}
