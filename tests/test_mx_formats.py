"""The MX formats e8m0 and e2m1 and the math MX block scales use (exp2, log2, ceil, floor).

Expected values are hand-written or computed here with torch float64 directly, never with epic's
own rounding helpers. The element-wise semantics (each primitive, each cast and store) are in
tests/test_primitive_semantics.py; this file holds what they do together, the packed e2m1 layout,
and what is refused.
"""
from __future__ import annotations

import pathlib

import pytest
import torch

import epic
from epic import pipeline, reference
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import planner

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "mxfp8_block_quant.epi"


def _program(text: str):
    return pipeline.analyze(text, name="t.epi").source_program


def test_mxfp8_sample_reference_matches_a_hand_computation():
    program = pipeline.analyze(str(SAMPLE)).source_program
    g = torch.Generator().manual_seed(3)
    m, d, n = 5, 64, 96
    x = torch.randn(m, d, generator=g).to(torch.bfloat16)
    w = (torch.randn(d, n, generator=g) * 4).to(torch.bfloat16)
    x[1] = 0                                          # an all-zero row: every block of it is zero
    out = reference.run(program, {"x": x, "w": w}, exact=True)
    acc = x.double() @ w.double()
    blocks = acc.unflatten(1, (n // 32, 32))
    amax = blocks.abs().amax(-1)
    # the smallest power of two >= max(amax / 448, 1e-38), by search rather than by log2
    want_scale = torch.empty_like(amax)
    for idx, a in enumerate(torch.clamp(amax / 448, min=1e-38).reshape(-1).tolist()):
        e = -130
        while 2.0 ** e < a:
            e += 1
        want_scale.view(-1)[idx] = 2.0 ** e
    want_q = (blocks / want_scale[..., None]).flatten(1)
    assert torch.equal(out["q_scale"], want_scale)
    assert torch.equal(out["q"], want_q)              # exact mode keeps e4m3 values unrounded
    assert out["q"].abs().max() <= 448
    assert torch.equal(out["q_scale"][1], torch.full((n // 32,), 2.0**-126, dtype=torch.float64))
    # rounded mode: q is an e4m3 value of acc / scale
    rounded = reference.run(program, {"x": x, "w": w}, exact=False)
    assert torch.equal(rounded["q"], want_q.float().to(torch.float8_e4m3fn).double())


def test_e8m0_cast_rounds_float64_in_exact_mode_and_f32_in_rounded_mode():
    # 1 + 2**-40 is above 1 in float64 (rounds up to 2) but is 1 in f32, as kernels see it
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in u: f32[M, N]\n  in v: f32[M, N]\n  out y: e8m0 = u + v\n}\n"
    feeds = {"x": torch.zeros(2, 4, dtype=torch.bfloat16), "w": torch.zeros(4, 2, dtype=torch.bfloat16),
             "u": torch.ones(2, 2), "v": torch.full((2, 2), 2.0**-40)}
    assert reference.run(_program(text), feeds, exact=True)["y"].unique().tolist() == [2.0]
    assert reference.run(_program(text), feeds, exact=False)["y"].unique().tolist() == [1.0]


def test_e2m1_packing_by_hand():
    # codes: 0.5 -> 1, -6 -> 0xF, 0 -> 0, 3 -> 5, -0 -> 8, 1.5 -> 3 (low nibble = even column)
    values = torch.tensor([[0.5, -6.0, 0.0, 3.0, -0.0, 1.5]], dtype=torch.float64)
    packed = reference.pack_e2m1(values)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0xF1, 0x50, 0x38]]
    back = reference.unpack_e2m1(packed)
    assert back.tolist() == [[0.5, -6.0, 0.0, 3.0, -0.0, 1.5]]
    assert torch.signbit(back[0, 4])


def test_e2m1_outputs_are_planned_packed():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out q: e2m1 = acc\n  out s: e8m0 = acc\n}\n"
    prog = pipeline.analyze(text, name="t.epi").program
    plan = planner.make_plan(prog, dict(M=64, K=64, N=128))
    q, s = plan.buffers["q"], plan.buffers["s"]
    assert (q.shape, q.torch_dtype) == ((64, 64), "uint8")
    assert (s.shape, s.torch_dtype) == ((64, 128), "float8_e8m0fnu")


@pytest.mark.parametrize("text, code", [
    ("in q: e2m1[M, N]\n  out y: f32 = acc + q", "E205"),            # a storage-only format as an input
    ("out r: e2m1[M] = row_max(acc)", "E205"),                       # packed pairs: only tiles
], ids=["e2m1-input", "e2m1-vector"])
def test_e2m1_refusals(text, code):
    with pytest.raises(EpicError) as info:
        pipeline.analyze(f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) {{\n  {text}\n}}\n", name="t.epi")
    assert info.value.codes == [code]


def test_block_scaled_e2m1_is_refused_by_code_generation():
    text = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  s = max(block_amax(acc, 16), 1e-12) / 6\n"
            "  out q: e2m1 = acc / s\n  out qs: e4m3[M, N/16] = s\n}\n")
    prog = pipeline.analyze(text, name="t.epi").program
    with pytest.raises(EpicError) as info:
        emit.units(prog, emit.kernel_configs(prog, 64))
    assert info.value.codes == ["E702"]
    assert "not supported by code generation yet" in str(info.value)


def test_mx_stores_generate_their_conversions():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out q: e2m1 = acc\n  out s: e8m0 = acc\n}\n"
    prog = pipeline.analyze(text, name="t.epi").program
    source = "\n".join(u.source for _, u in emit.units(prog, emit.kernel_configs(prog, 64)))
    assert "epic_e2m1_code(" in source and "epic_nodes::Sm90PackedInt4Store" in source
    assert "epic_e8m0(" in source and "Sm90AuxStore<" in source and "uint8_t, RN" in source


def test_unfused_form_returns_packed_e2m1_and_e8m0_tensors():
    prog = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out q: e2m1 = acc\n  out s: e8m0 = acc\n}\n")
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    x[0, 0] = x[1, 1] = 1                             # acc rows = the first two rows of w
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    w[0, :4] = torch.tensor([0.5, -6.0, 2.75, 100.0])
    w[1, :4] = torch.tensor([0.375, 1.25, 0.0, 3.0])
    out = prog.unfused(x=x, w=w.t().contiguous().t())
    # e2m1 codes: 0.5 -> 1, -6 -> 0xF, 2.75 -> 3 (5), 100 -> 6 (7), 0.375 -> 0.5 (1), 1.25 -> 1 (2, tie to
    # even), 0 -> 0, 3 -> 5; low nibble = even column
    assert out["q"].dtype == torch.uint8 and out["q"].shape == (2, 16)
    assert out["q"][:, :2].tolist() == [[0xF1, 0x75], [0x21, 0x50]]
    assert out["q"][:, 2:].eq(0).all()
    assert out["s"].dtype == torch.float8_e8m0fnu
    assert out["s"][:, :4].float().tolist() == [[0.5, 8.0, 4.0, 128.0], [0.5, 2.0, 2.0**-127, 4.0]]


def test_e8m0_inputs_are_powers_of_two():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in s: e8m0[M, N]\n  out y: f32 = acc + s\n}\n"
    s = torch.tensor([[1.0, 0.25, 2.0**-127, 2.0**127]]).to(torch.float8_e8m0fnu)
    feeds = {"x": torch.zeros(1, 4, dtype=torch.bfloat16), "w": torch.zeros(4, 4, dtype=torch.bfloat16), "s": s}
    assert reference.run(_program(text), feeds)["y"].tolist() == [[1.0, 0.25, 2.0**-127, 2.0**127]]


def test_e8m0_loads_are_refused_by_code_generation_and_check_warns(tmp_path, capsys):
    # CUTLASS's stock loads do not compile with float_ue8m0_t: E702 rather than a failed nvcc build
    from epic_cli.main import main
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in s: e8m0[M, N]\n  out y: f32 = acc * s\n}\n"
    prog = pipeline.analyze(text, name="t.epi").program
    with pytest.raises(EpicError) as info:
        emit.units(prog, emit.kernel_configs(prog, 64))
    assert info.value.codes == ["E702"] and "'s' (a e8m0 tile)" in str(info.value)
    path = tmp_path / "load.epi"
    path.write_text(text)
    assert main(["check", str(path)]) == 0
    assert "warning[E702]: gemm 'g' will not build: 's' (a e8m0 tile)" in capsys.readouterr().err
