"""Derived backward programs (epic grad) against torch.autograd on the float64 reference.

The expected gradients come from torch.autograd through the reference interpreter's semantics of the
forward program; the derived forward and backward programs run as programs on the same interpreter.
"""
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from epic import pipeline, reference
from epic.autodiff import check, derive as D
from epic.autodiff.forward import program_text
from epic.diagnostics import EpicError
from epic.frontend.lower import load_program

from .conftest import ROOT
from .progen import program as random_program

S = ROOT / "samples"
# every sample whose outputs carry a gradient; the others are quantizers (E902 below)
DIFFERENTIABLE = ["bias_gelu", "cross_entropy", "f16_accumulate", "fp8_gemm_scaled", "prenorm_mlp", "residual_rmsnorm",
                  "rope", "swiglu", "swiglu_bwd", "swiglu_mlp", "w8a8", "q_proj_per_head", "qk_norm_rope", "qkv_qk_norm"]
QUANTIZERS = ["fp8_block_quant", "int4_pack", "mxfp8_block_quant", "swiglu_fp8_quant"]
# ragged sizes (not multiples of any tile), tiny ones, and pairs/heads kept whole where a program needs them
SIZES = [dict(M=37, K=24, N=48, D=40, F=24, V=56, E=24, H=2, Dh=16),
         dict(M=1, K=8, N=16, D=16, F=8, V=8, E=8, H=1, Dh=16),
         dict(M=130, K=72, N=136, D=72, F=40, V=200, E=40, H=3, Dh=32)]


def _derive(name, **kw):
    return D.derive_source(str(S / f"{name}.epi"), path=True, **kw)


def _sizes(d, sizes):
    return {k: v for k, v in sizes.items() if k in d.program.dims}


@pytest.mark.parametrize("policy", D.POLICIES)
@pytest.mark.parametrize("sizes", SIZES, ids=["ragged", "tiny", "larger"])
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_sample_gradients_match_autograd(name, sizes, policy):
    d = _derive(name, policy=policy)
    for seed in (0, 1):
        errors = check.compare(d, _sizes(d, sizes), seed)
        assert errors and max(errors.values()) < 1e-10, errors


@pytest.mark.parametrize("name", QUANTIZERS)
def test_quantizers_say_no_output_has_a_gradient(name):
    with pytest.raises(EpicError) as e:
        _derive(name)
    assert e.value.diagnostics[0].code == "E902"


@pytest.mark.parametrize("policy", D.POLICIES)
def test_derived_swiglu_backward_is_the_hand_written_one(policy):
    """The derived gradient of SwiGLU's accumulator equals the prelude's hand-written swiglu_bwd (run as
    samples/swiglu_bwd.epi with an identity down-projection, so its acc is the incoming gradient)."""
    d = _derive("swiglu", policy=policy)
    sizes = dict(M=29, D=24, F=16)
    inputs = {k: v.double() for k, v in reference.random_inputs(d.program, sizes, 3).items()}
    dy = torch.randn(29, 16, dtype=torch.float64)
    _, got = check.derived_grads(d, inputs, {"y": dy})
    hand = pipeline.lower(str(S / "swiglu_bwd.epi"), path=True)
    h = inputs["x"] @ inputs["wgu"]
    dh = reference.run(hand, {"grad_out": dy, "wd_t": torch.eye(16, dtype=torch.float64), "h": h})["dh"]
    torch.testing.assert_close(got["x"], dh @ inputs["wgu"].t(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["wgu"], inputs["x"].t() @ dh, rtol=1e-12, atol=1e-12)


def test_cross_entropy_backward_is_softmax_minus_onehot_without_logits_in_the_forward():
    d = _derive("cross_entropy")
    assert "exp(acc - lm_head_lse)" in d.backward_text and "col == label" in d.backward_text
    fwd = load_program(d.forward_text, "<fwd>", ".")
    assert not any(len(t.dims) == 2 and t.dims[1] == fwd.tensors["w"].dims[1]
                   for t in fwd.outputs()), "the forward must not store [M, V] logits"


@pytest.mark.parametrize("policy", D.POLICIES)
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_derived_programs_pass_every_check(name, policy):
    """The forward and backward go through the same checks and passes as a hand-written program."""
    d = _derive(name, policy=policy)
    pipeline.analyze(d.backward_text, name="backward")
    pipeline.analyze(d.forward_text, name="forward")


def test_prenorm_forward_returns_the_normalized_rows():
    """The forward keeps n = rmsnorm(h) for the backward: an output, so the row combine kernel finishes it
    (the gemm stores h, the combine kernel scales it) and gate_up reads it as it is."""
    d = _derive("prenorm_mlp")
    program = pipeline.analyze(d.forward_text, name="forward").program
    combine = next(k for k in program.kernels if k.kind == "combine")
    assert "n" in [s.tensor for s in combine.stores]
    assert not any(name.startswith("n__rowscale") for name in program.tensors)


def test_pattern_d_runs_swiglus_backward_in_the_down_projections_dA_gemm():
    """With the "save" policy the forward keeps gate_up's accumulator, and the gemm that computes the
    gradient of a (d_y @ wd^T) applies SwiGLU's derivative in its epilogue: no gemm recomputes gate_up."""
    saved = _derive("prenorm_mlp")
    recomputed = _derive("prenorm_mlp", policy="recompute")
    assert "gate_up_acc" in saved.saved and "gemm gate_up_bwd" not in saved.backward_text
    assert "gemm gate_up_bwd" in recomputed.backward_text and "gate_up_acc" not in recomputed.saved
    down_da = saved.backward_text.split("gemm down_da(")[1].split("}")[0]
    assert "tmp d_gate_up_acc" in down_da and "gate_up_acc" in down_da
    assert saved.backward_text.count("\ngemm ") == 6          # dA and dB of each forward gemm, nothing else
    assert recomputed.backward_text.count("\ngemm ") > 6
    assert "out gate_up_acc: bf16[M, 2*F] = acc" in saved.forward_text


def test_rmsnorm_backward_runs_where_dn_is_computed_its_row_sum_finished_by_the_combine():
    """With "save", RMSNorm's backward needs rowsum(dn * gamma * h) in every element of dh: it runs in
    the epilogue of the gemm computing dn (gate_up's dA) on o_proj's saved accumulator, and the row
    combine kernel finishes dh (read transposed by dW's gemm, so no scale can be deferred into it);
    no gemm recomputes o_proj. With "recompute", stages: one gemm computes the row sum, the next uses it."""
    d = _derive("prenorm_mlp")
    text = d.backward_text
    assert "o_proj_bwd" not in text and "o_proj_acc" in d.saved
    assert "row_sum(" in text.split("gemm gate_up_da(")[1].split("}")[0]
    program = pipeline.analyze(text).program
    combine = next(k for k in program.kernels if k.kind == "combine" and k.name.startswith("gate_up_da"))
    assert {"d_o_proj_acc", "d_z"} <= {s.tensor for s in combine.stores}
    staged = _derive("prenorm_mlp", policy="recompute").backward_text
    assert "gemm o_proj_bwd0(" in staged and "gemm o_proj_bwd1(" in staged
    assert "row_sum(" in staged.split("gemm o_proj_bwd0(")[1].split("}")[0]


def test_wrt_selects_gradients_and_prunes_the_rest():
    d = _derive("bias_gelu", wrt=["bias"])
    assert set(d.grads) == {"bias"}
    assert "gemm up_da" not in d.backward_text and "gemm up_db" not in d.backward_text
    errors = check.compare(d, dict(M=20, K=16, N=24))
    assert errors["bias"] < 1e-12


@pytest.mark.parametrize("wrt, code", [(["nope"], "E902"), (["label"], "E902"), (["loss"], "E902")])
def test_bad_wrt(wrt, code):
    with pytest.raises(EpicError) as e:
        _derive("cross_entropy", wrt=wrt)
    assert e.value.diagnostics[0].code == code


def test_scalar_wrt_is_refused():
    with pytest.raises(EpicError) as e:
        _derive("residual_rmsnorm", wrt=["eps"])
    assert e.value.diagnostics[0].code == "E902"


def test_per_head_vector_gradient_is_refused_not_dropped():
    with pytest.raises(EpicError) as e:
        _derive("q_proj_per_head", wrt=["gamma"])
    assert e.value.diagnostics[0].code == "E903"
    assert "Not derived yet: freq, gamma" in _derive("q_proj_per_head").backward_text


QUANTIZED_CHAIN = """
gemm a(x: bf16[M, D] @ w: bf16[D, D]) {
  tmp n: i8 = acc / 4
}
gemm b(n @ w2: i8[D, E]) {
  out y: f32 = acc
}
"""


def test_gradient_through_a_quantized_store_is_refused():
    with pytest.raises(EpicError) as e:
        D.derive_source(QUANTIZED_CHAIN, wrt=["x"])
    assert e.value.diagnostics[0].code in ("E901", "E903")


CAST = """
gemm a(x: bf16[M, D] @ w: bf16[D, N]) {
  out y: f32 = f32(e4m3(acc)) * 2
}
"""


def test_quantizing_cast_refused_unless_straight_through():
    with pytest.raises(EpicError) as e:
        D.derive_source(CAST)
    assert e.value.diagnostics[0].code == "E901"
    d = D.derive_source(CAST, straight_through=True)
    assert "d_x" in d.backward_text


@pytest.mark.parametrize("name", DIFFERENTIABLE + QUANTIZERS)
def test_printed_program_means_the_same(name):
    """The .epi printer: the source program printed and read back computes the same outputs."""
    p = pipeline.lower(str(S / f"{name}.epi"), path=True)
    again = load_program(program_text(p), "<printed>", ".")
    sizes = {k: v for k, v in SIZES[0].items() if k in p.dims}
    inputs = reference.random_inputs(p, sizes, 5)
    want = reference.run(p, inputs, sizes=sizes)
    got = reference.run(again, inputs, sizes=sizes)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, equal_nan=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(random_program(), st.integers(0, 2**16))
def test_random_programs_differentiate_like_autograd(text, seed):
    try:
        d = D.derive_source(text, policy=D.POLICIES[seed % 2])
    except EpicError as e:
        code = e.diagnostics[0].code
        # a gradient through a quantized tmp (i8/e4m3 chain) is refused; nothing else may fail
        assume(code == "E901" and ("tmp n: i8" in text or "tmp n: e4m3" in text))
        return
    errors = check.compare(d, {k: v for k, v in dict(M=19, D=64, E=24).items() if k in d.program.dims}, seed)
    assert max(errors.values()) < 1e-8, (errors, text)
    pipeline.analyze(d.forward_text, name="forward")        # and both pass epic's checks
    if d.has_kernels:
        pipeline.analyze(d.backward_text, name="backward")


def test_cli_grad_prints_a_program_that_compiles(tmp_path, capsys):
    from epic_cli.main import main
    assert main(["grad", str(S / "swiglu.epi"), "--policy", "recompute"]) == 0
    text = capsys.readouterr().out
    assert "gemm gate_up_bwd(" in text
    pipeline.analyze(text, name="printed")
    assert main(["grad", str(S / "bias_gelu.epi"), "--forward"]) == 0
    assert "gemm up(" in capsys.readouterr().out
    assert main(["grad", str(S / "bias_gelu.epi"), "--check", "M=17,K=24,N=40"]) == 0
    err = capsys.readouterr().err
    assert err.count("relative error") == 3
    assert main(["grad", str(S / "bias_gelu.epi"), "--wrt", "nope"]) == 1
    assert "E902" in capsys.readouterr().err


def test_ledger_says_what_is_saved_and_recomputed():
    sizes = dict(M=64, D=32, F=48)
    saved = _derive("prenorm_mlp").ledger(sizes)
    recomputed = _derive("prenorm_mlp", policy="recompute").ledger(sizes)
    assert f"saved by the forward: gate_up_acc bf16[M, 2*F] = {64 * 96 * 2:,} B" in saved
    assert not any("gemm gate_up " in line for line in saved)
    assert f"recomputed in the backward: gemm gate_up ({2 * 64 * 32 * 96:,} flops)" in recomputed
    assert not any("recomputed" in line for line in saved)        # RMSNorm's backward on the saved o_proj_acc
    assert f"saved by the forward: o_proj_acc bf16[M, D] = {64 * 32 * 2:,} B" in saved
    assert sum("gemm o_proj" in line for line in recomputed) == 2  # RMSNorm's two stages


EVERY = {"every_primitive": ["x", "w"], "every_primitive_custom": None}   # every_primitive's z meets quantizing casts


@pytest.mark.parametrize("name", list(EVERY))
def test_every_primitives_derivative_matches_autograd(name):
    """tests/programs/every_primitive*.epi use every primitive (a test holds them to it); their
    derived gradients equal torch.autograd's. Its gemms share x and w: their gradients are sums."""
    d = D.derive_source(str(ROOT / "tests" / "programs" / f"{name}.epi"), EVERY[name], path=True)
    sizes = {k: v for k, v in dict(M=37, K=24, N=48, D=40, P=64, F=24).items() if k in d.program.dims}
    errors = check.compare(d, sizes, seed=3)
    assert max(errors.values()) < 1e-10, errors


def test_every_derivative_rule_is_exercised():
    ops = set()
    for name, wrt in EVERY.items():
        d = D.derive_source(str(ROOT / "tests" / "programs" / f"{name}.epi"), wrt, path=True)
        ops |= {v.op for k in d.program.kernels for v in k.values}
    from epic.ir import primitives as P
    assert not {o for o, p in P.PRIMITIVES.items() if p.vjp} - ops


def test_the_derivative_of_the_lowest_power():
    """d/dx x ** -64 = -64 x ** -65, which no powi holds (|n| <= 64): written as y / x."""
    d = D.derive_source("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: f32 = (acc * acc + 1) ** -64 * 1e30\n}\n")
    assert max(check.compare(d, dict(M=9, K=16, N=24)).values()) < 1e-10


def test_a_gemm_reading_a_transposed_operand_is_refused_not_misderived():
    text = ("gemm f(x: bf16[M, K] @ w: bf16[K, N]) {\n  tmp h: bf16 = acc\n}\n"
            "gemm g(h.T @ x) {\n  out y: f32 = acc\n}\n")
    with pytest.raises(EpicError) as e:
        D.derive_source(text, wrt=["w"])
    assert e.value.diagnostics[0].code == "E903" and "transposed" in e.value.diagnostics[0].message


def test_the_backward_test_program_is_what_epic_grad_derives():
    """tests/programs/prenorm_mlp_backward.epi (run by the host simulator and the GPU tests) is the
    derivation's current output, comments aside."""
    def code(text):
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    kept = (ROOT / "tests" / "programs" / "prenorm_mlp_backward.epi").read_text()
    assert code(kept) == code(_derive("prenorm_mlp").backward_text)


@pytest.mark.parametrize("wrt", [["attn"], ["z"], ["attn", "z"], ["gamma", "attn"], ["wo"], ["attn", "wo"], ["wgu"]])
def test_every_choice_of_gradients_derives_a_program_that_passes_the_checks(wrt):
    """With wo left out (frozen weights) no gemm reads dh transposed, so its row sum cannot be finished
    by the row combine kernel and RMSNorm's backward falls back to stages; every choice compiles and
    matches torch.autograd."""
    d = _derive("prenorm_mlp", wrt=wrt)
    pipeline.analyze(d.backward_text, name="derived")
    errors = check.compare(d, dict(M=19, D=24, F=16), 3)
    assert max(errors.values()) < 1e-10, errors
