"""GEMM operand layouts (docs/LANGUAGE.md, "Operand layouts"): `name.T` operands, row-major (N-major)
B operands, M-major A operands, and gemms of one program with different row counts (a backward
program's dW gemm has N rows): parsing and lowering, the reference interpreter and the unfused form
against torch, call-time strides, the generated CUDA's layouts, per-gemm configurations, and a
host-simulated run (tests/hostsim) that sees a wrong layout."""
import math
import re

import pytest
import torch

from epic import reference
from epic.codegen import emit
from epic.ir import operands
from epic.plan import planner
from epic.runtime import validate
from epic.runtime.unfused import Unfused

from .conftest import ROOT, analyze, diagnose

BACKWARD = str(ROOT / "tests" / "programs" / "backward_layouts.epi")

FWD = "gemm fwd(x: bf16[M, K] @ w: bf16[K, N]) { tmp h: bf16 = acc }\n"
DX_DW = FWD + ("gemm dx(h @ wt: bf16[N, K]) with b_major = n { out dx: f32 = acc }\n"
               "gemm dw(h.T @ x) { out dw: f32 = acc }\n")


def majors(program, name):
    return operands.kernel_majors(program.kernel(name), program.tensors)


def kernel(program, name):
    k = program.kernel(name)
    return (k.a + ".T" * k.a_t, k.b + ".T" * k.b_t, str(k.rows), str(k.k), str(k.n))


# ------------------------------------------------------------------------------ parsing and lowering
def test_transposed_earlier_result_and_row_major_b():
    p = analyze(DX_DW).program
    assert kernel(p, "dx") == ("h", "wt", "M", "N", "K") and majors(p, "dx") == ("k", "n")
    assert kernel(p, "dw") == ("h.T", "x", "N", "M", "K") and majors(p, "dw") == ("m", "n")
    assert p.tensors["wt"].layout == "row" and p.tensors["w"].layout == "kmajor"


@pytest.mark.parametrize("text, gemm, expect", [
    # a top-level `in` read as B: row-major, N-major
    ("in w2: bf16[N, P]\n" + FWD.replace("tmp h", "out y") + "gemm g(x @ w) { out z: f32 = acc }\n"
     "gemm g2(y @ w2) { out u: f32 = acc }\n", "g2", (("y", "w2", "M", "N", "P"), ("k", "n"))),
    # the transpose of a top-level `in` [N, K] as B: K contiguous, the plain K-major B
    ("in wn: bf16[N, K]\ngemm g(x: bf16[M, K] @ wn.T) { out y: f32 = acc }\n", "g",
     (("x", "wn.T", "M", "K", "N"), ("k", "k"))),
    # an earlier A operand transposed as A: M-major
    (FWD + "gemm g(x.T @ h) { out y: f32 = acc }\n", "g", (("x.T", "h", "K", "M", "N"), ("m", "n"))),
    # an earlier (K-major) B operand transposed as B: the weight W [N, K] row-major, N-major
    (FWD + "gemm g(h @ w.T) { out y: f32 = acc }\n", "g", (("h", "w.T", "M", "N", "K"), ("k", "n"))),
    # and as A: W [N, K] row-major is a K-major A with N rows
    (FWD + "gemm g(w.T @ wk: bf16[K, P]) { out y: f32 = acc }\n", "g", (("w.T", "wk", "N", "K", "P"), ("k", "k"))),
])
def test_each_kind_of_tensor_can_be_read_transposed_or_as_b(text, gemm, expect):
    p = analyze(text).program
    assert (kernel(p, gemm), majors(p, gemm)) == expect


def test_gemms_of_one_program_have_their_own_rows_and_column_vectors():
    text = DX_DW.replace("{ out dw: f32 = acc }", "{ in s: f32[N]\n out dw: f32 = acc * s }")
    p = analyze(text).program
    load = next(v for v in p.kernel("dw").values if v.op == "load" and v.attrs["tensor"] == "s")
    assert load.kind.value == "col"      # [N] is a column vector of dw, whose rows are N
    e = diagnose(DX_DW.replace("{ out dw: f32 = acc }", "{ in r: f32[M]\n out dw: f32 = acc * r }"))
    assert e.codes == ["E208"] and "matches neither rows nor columns" in str(e)


@pytest.mark.parametrize("text, code, words", [
    (FWD + "gemm g(q.T @ x) { out y: f32 = acc }\n", "E201", "unknown tensor 'q'"),
    ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) { in v: bf16[N]\n out y: bf16 = acc + v }\n"
     "gemm g2(v.T @ x) { out z: f32 = acc }\n", "E209", "'v.T' is a bf16[N], not a matrix"),
    (FWD + "gemm g(h.t @ x) { out y: f32 = acc }\n", "E102", "'.t' after operand 'h'"),
    (FWD + "gemm g(h.T @ w.T) { out y: f32 = acc }\n", "E209", "inner dimensions differ"),
    # sm90 reads 8-bit operands K-major only
    ("gemm f(x: e4m3[M, K] @ w: e4m3[K, N]) { tmp h: e4m3 = acc }\ngemm g(h.T @ x) { out y: f32 = acc }\n",
     "E205", "e4m3 read M-major"),
    ("gemm g(x: i8[M, K] @ w: i8[K, N]) with b_major = n { out y: f32 = acc }\n", "E205", "i8 read N-major"),
    (FWD + "gemm g(h @ x.T) with b_major = n { out y: f32 = acc }\n", "E215", "b_major applies to a B operand"),
    ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with b_major = m { out y: f32 = acc }\n", "E215",
     "b_major must be one of k, n"),
    # a row-major B's contiguous dimension is its N: 12 bf16 = 24 bytes is no TMA row
    ("gemm g(x: bf16[M, K] @ w: bf16[K, 12]) with b_major = n { out y: f32 = acc }\n", "E403",
     "contiguous dimension of 'w'"),
])
def test_bad_operands_are_refused(text, code, words):
    e = diagnose(text)
    assert e.codes == [code] and words in str(e), str(e)


def test_an_m_major_a_needs_16_byte_columns():
    # a.T reads a [K, 12] as an M-major A [12, K]: each column of the operand is a row of 12 bf16 in memory
    e = diagnose("in a: bf16[K, 12]\ngemm g(a.T @ w: bf16[K, N]) { out y: f32 = acc }\n")
    assert e.codes == ["E403"] and "contiguous dimension of 'a'" in str(e)


@pytest.mark.parametrize("reader", ["gemm c(n.T @ x) { out z: f32 = acc }", "gemm c(x2: bf16[P, M] @ n) { out z: f32 = acc }"])
def test_a_normalized_tile_read_transposed_or_as_b_is_finished_by_the_combine(reader):
    """A row scale cannot move into a gemm that reads the tile transposed or as its B operand (it would
    be a column scale there): the row combine kernel finishes the tile instead, and the rewritten
    program computes what the source does."""
    text = ("gemm a(x: bf16[M, D] @ w: bf16[D, D]) {\n  in g: bf16[D]\n  tmp n: bf16 = rmsnorm(acc, g)\n}\n"
            "gemm b(n @ w2: bf16[D, E]) { out y: bf16 = acc }\n" + reader + "\n")
    a = analyze(text)
    combine = next(k for k in a.program.kernels if k.kind == "combine")
    assert [s.tensor for s in combine.stores] == ["n"] and "n__rowscale" not in a.program.tensors
    sizes = {d: v for d, v in dict(M=12, D=40, E=24, P=8).items() if d in a.source_program.dims}
    inputs = reference.random_inputs(a.source_program, sizes, 1)
    for name in ("y", "z"):
        torch.testing.assert_close(reference.run(a.program, inputs, sizes=sizes)[name],
                                   reference.run(a.source_program, inputs, sizes=sizes)[name])


LN = ("gemm o(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in g: bf16[D]\n  in b: bf16[D]\n"
      "  tmp n: bf16 = layernorm(acc, g, b)\n}\n")


def test_layernorm_shift_terms_need_b_as_stored():
    """LayerNorm's deferred mean adds (row vectors @ B), computed from the weight tensor as stored: a
    consumer reading its B transposed is refused; an N-major B declared inline is fine."""
    e = diagnose(LN + "in wu: bf16[F, D]\ngemm up(n @ wu.T) { out y: bf16 = acc }\n")
    assert e.codes == ["E502"] and "reads transposed ('wu.T')" in str(e)
    a = analyze(LN + "gemm up(n @ wu: bf16[D, F]) with b_major=n { out y: bf16 = acc }\n")
    inputs = reference.random_inputs(a.source_program, dict(M=4, D=16, F=24))
    torch.testing.assert_close(reference.run(a.program, inputs)["y"], reference.run(a.source_program, inputs)["y"])


def test_a_row_scale_moves_into_a_gemm_whose_b_is_transposed():
    text = LN.replace("layernorm(acc, g, b)", "rmsnorm(acc, g)").replace("  in b: bf16[D]\n", "")
    a = analyze(text + "in wu: bf16[F, D]\ngemm up(n @ wu.T) { out y: bf16 = acc }\n")
    inputs = reference.random_inputs(a.source_program, dict(M=4, D=16, F=24))
    torch.testing.assert_close(reference.run(a.program, inputs)["y"], reference.run(a.source_program, inputs)["y"])


# ------------------------------------------------------------------------------ meaning
def _backward_inputs(m=5, k=16, n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, k, generator=g).bfloat16()
    return dict(x=torch.randn(m, k, generator=g).bfloat16(), w=W.t(), bias=torch.randn(n, generator=g).bfloat16(),
                dy=torch.randn(m, n, generator=g).bfloat16(), s=torch.randn(n, generator=g)), W


def _torch_backward(inputs, W, round_dh):
    x, W = inputs["x"].double(), W.double()
    h = x @ W.t() + inputs["bias"].double()
    dgelu = 0.5 * (1 + torch.erf(h / math.sqrt(2))) + h * torch.exp(-h * h / 2) / math.sqrt(2 * math.pi)
    dh = inputs["dy"].double() * dgelu
    if round_dh:
        dh = dh.bfloat16().double()
    return dh @ W, (dh.t() @ x) * inputs["s"].double()[:, None]


def test_interpreter_multiplies_by_the_transposes():
    prog = analyze(str(BACKWARD)).program
    inputs, W = _backward_inputs()
    got = reference.run(prog, inputs)
    dx, dw = _torch_backward(inputs, W, round_dh=False)
    torch.testing.assert_close(got["dx"], dx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["dw"], dw, rtol=1e-12, atol=1e-12)


def test_unfused_form_multiplies_by_the_transposes():
    a = analyze(str(BACKWARD))
    inputs, W = _backward_inputs()
    got = Unfused(a.program, a.source_program)(**inputs)
    dx, dw = _torch_backward(inputs, W, round_dh=True)
    torch.testing.assert_close(got["dx"].double(), dx, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got["dw"].double(), dw, rtol=1e-4, atol=1e-4)


def test_random_inputs_scale_a_transposed_b_by_its_reduction_dimension():
    p = analyze("in wn: bf16[N, K]\ngemm g(x: bf16[M, K] @ wn.T) { out y: f32 = acc }\n").program
    x = reference.random_inputs(p, dict(M=64, K=4096, N=16))["wn"].float()
    assert 0.5 / 64 < x.std() < 2 / 64          # 1/sqrt(K), not 1/sqrt(N)


# ------------------------------------------------------------------------------ call-time strides
def test_wrong_strides_are_refused_before_anything_runs():
    p = analyze(DX_DW).program
    args = dict(x=torch.randn(8, 16).bfloat16(), w=torch.randn(24, 16).bfloat16().t(),
                wt=torch.randn(24, 16).bfloat16())
    validate.validate(p, args, cuda=False)                  # as declared: fine
    with pytest.raises(Exception) as info:                  # the row-major wt passed as a .t() view
        validate.validate(p, {**args, "wt": torch.randn(16, 24).bfloat16().t()}, cuda=False)
    assert info.value.codes == ["E605"] and "transposed view" in str(info.value)
    with pytest.raises(Exception) as info:                  # the K-major w passed row-major
        validate.validate(p, {**args, "w": torch.randn(16, 24).bfloat16()}, cuda=False)
    assert info.value.codes == ["E605"] and "W.t()" in str(info.value)


# ------------------------------------------------------------------------------ code generation
def _sources(path_or_text, m=64, sizes=None):
    p = analyze(path_or_text).program
    return {spec.name: unit.source for spec, unit in emit.units(p, emit.kernel_configs(p, m, None, sizes))}


def _layouts(source):
    return tuple(re.search(rf"using Layout{r} = cutlass::layout::(\w+);", source).group(1) for r in "AB")


def test_generated_layouts_and_header():
    src = _sources(BACKWARD, sizes=dict(M=64, K=256, N=512))
    assert _layouts(src["fwd"]) == ("RowMajor", "ColumnMajor")
    assert _layouts(src["dx"]) == ("RowMajor", "RowMajor")
    assert _layouts(src["dw"]) == ("ColumnMajor", "RowMajor")
    assert "A cutlass::bfloat16_t [M, K] M-major (column-major), B cutlass::bfloat16_t [K, N] N-major (row-major)" \
        in src["dw"].splitlines()[1]
    assert "[M, K] row-major, B cutlass::bfloat16_t [K, N] K-major," in src["fwd"].splitlines()[1]
    b_major = _sources(DX_DW)["dx"]
    assert _layouts(b_major) == ("RowMajor", "RowMajor")


def test_each_gemm_is_configured_for_its_own_rows():
    p = analyze(BACKWARD).program
    sizes = dict(M=64, K=256, N=8192)
    rows = emit.kernel_rows(p, 64, sizes)
    assert rows == {"fwd": 64, "dx": 64, "dw": 8192}
    configs = emit.kernel_configs(p, emit.rows(p, sizes), None, sizes)
    assert configs["fwd"].tile[0] == 64 and configs["dw"].tile[0] == 128     # small-M and large-M tiles
    assert planner.make_plan(p, sizes).configs == configs                   # the call's plan agrees
    assert emit.kernel_rows(p, 64) == {"fwd": 64, "dx": 64, "dw": 64}      # no sizes: the row dimension's


def test_a_bundle_builds_each_gemm_for_its_own_rows():
    from epic.runtime import bundle_build
    p = analyze(BACKWARD).program
    units = bundle_build.units(p, dict(M=64, K=256, N=8192), [64, 8192])
    names = sorted(u.name for u in units)
    # dw: N rows at either M; an H100's heuristic (plan/gpus.py) adds dw's and dx's cooperative 128x256
    assert [n.split(".")[0] for n in names] == ["dw", "dw", "dx", "dx", "dx", "fwd", "fwd"]
    assert sum(".coop_128x256x64_c2x1" in n for n in names) == 2


# ------------------------------------------------------------------------------ host simulation
def test_host_simulation_sees_a_wrong_operand_layout():
    """tests/test_hostsim.py runs backward_layouts.epi at ragged sizes; here: the simulation reads the
    layouts from the source, so a kernel that read dh.T as row-major would disagree with the reference."""
    from . import hostsim
    from .hostsim import harness
    hostsim.require_toolchain()
    case = harness.prepare(BACKWARD, dict(M=77, K=200, N=392), 64)
    harness.check(case, seed=3)
    wrong = case.with_sources(lambda s: s.replace("using LayoutA = cutlass::layout::ColumnMajor;",
                                                  "using LayoutA = cutlass::layout::RowMajor;"))
    with pytest.raises(AssertionError, match="dw"):
        harness.check(wrong, seed=3)


# ------------------------------------------------------------------------------ nvcc
@pytest.mark.nvcc
def test_nvcc_builds_the_transposed_and_row_major_operands(tmp_path, monkeypatch):
    from epic.runtime import build, loader
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    p = analyze(BACKWARD).program
    pairs = emit.units(p, emit.kernel_configs(p, 64, None, dict(M=64, K=256, N=512)))
    pairs = [(s, u) for s, u in pairs if s.name in ("dx", "dw")]
    paths = build.build_all([u for _, u in pairs], quiet=True)
    for (spec, _), path in zip(pairs, paths):
        assert loader.load(path, [f"{x.role}:{x.tensor}" for x in spec.pointers]).info["kernel"] == spec.name
