"""The reference interpreter against the same math written directly in torch, for every sample."""
import math

import pytest
import torch
import torch.nn.functional as F

from epic import pipeline, reference
from epic.diagnostics import EpicError

from .conftest import ROOT, analyze

D64 = torch.float64


def run_sample(name, sizes, exact=True, seed=0):
    program = pipeline.analyze(str(ROOT / "samples" / f"{name}.epi")).source_program
    inputs = reference.random_inputs(program, sizes, seed)
    out = reference.run(program, inputs, exact=exact, sizes=sizes)
    return {k: v.to(D64) if v.is_floating_point() else v for k, v in inputs.items()}, out


def close(a, b, tol=1e-12):
    assert a.shape == b.shape, (a.shape, b.shape)
    err = (a - b).abs().max().item()
    assert err <= tol * max(1.0, b.abs().max().item()), err


@pytest.mark.parametrize("m", [1, 7, 33])
def test_bias_gelu(m):
    i, o = run_sample("bias_gelu", dict(M=m, K=40, N=24), seed=m)
    close(o["y"], F.gelu(i["x"] @ i["w"] + i["bias"], approximate="tanh"))


def test_residual_rmsnorm():
    i, o = run_sample("residual_rmsnorm", dict(M=9, D=48))
    h = i["x"] @ i["wo"] + i["z"]
    close(o["resid"], h)
    close(o["hg"], h * i["gamma"])
    close(o["r"], torch.rsqrt((h * h).mean(-1) + 1e-6))


def test_prenorm_mlp():
    i, o = run_sample("prenorm_mlp", dict(M=5, D=32, F=24))
    h = i["attn"] @ i["wo"] + i["z"]
    n = F.rms_norm(h, (32,), i["gamma"], 1e-6)
    y = n @ i["wgu"]
    a = F.silu(y[:, 0::2]) * y[:, 1::2]
    close(o["resid"], h)
    close(o["y"], a @ i["wd"] + h)


def test_swiglu():
    i, o = run_sample("swiglu", dict(M=3, D=16, F=10))
    y = i["x"] @ i["wgu"]
    close(o["y"], F.silu(y[:, 0::2]) * y[:, 1::2])


def test_rope():
    i, o = run_sample("rope", dict(M=6, D=16, N=12))
    h = i["x"] @ i["wqkv"]
    theta = i["pos"][:, None] * i["freq"][None, :]
    a, b = h[:, 0::2], h[:, 1::2]
    c, s = theta[:, 0::2].cos(), theta[:, 0::2].sin()
    want = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(1)
    close(o["qkv"], want)


def test_cross_entropy():
    i, o = run_sample("cross_entropy", dict(M=8, D=16, V=50))
    logits = i["x"] @ i["w"]
    close(o["loss"], F.cross_entropy(logits, i["label"].long(), reduction="none"))
    close(o["lse_out"], torch.logsumexp(logits, -1))


@pytest.mark.parametrize("exact", [True, False])
def test_fp8_block_quant(exact):
    i, o = run_sample("fp8_block_quant", dict(M=4, D=32, N=256), exact=exact)
    h = (i["x"] @ i["w"]).unflatten(-1, (-1, 128))
    s = h.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    q = h / s
    if not exact:
        q = q.clamp(-448, 448).to(torch.float8_e4m3fn).to(D64)
        s = s.float().to(D64)
    close(o["q"], q.flatten(1))
    close(o["q_scale"], s.squeeze(-1))


def test_int4_pack():
    i, o = run_sample("int4_pack", dict(M=3, D=16, N=64), exact=False)
    h = (i["x"] @ i["w"]).unflatten(-1, (-1, 32))
    s = h.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 7.0
    q = torch.round(h / s).clamp(-8, 7)
    close(o["q"], q.flatten(1))
    close(o["q_scale"], s.squeeze(-1).to(torch.bfloat16).to(D64))
    assert o["q"].min() >= -8 and o["q"].max() <= 7


def test_swiglu_bwd_matches_autograd():
    i, o = run_sample("swiglu_bwd", dict(M=4, D=16, F=6))
    dy = i["grad_out"] @ i["wd_t"]
    h = i["h"].clone().requires_grad_(True)
    y = F.silu(h[:, 0::2]) * h[:, 1::2]
    (dh,) = torch.autograd.grad(y, h, dy)
    close(o["dh"], dh, 1e-10)


def test_fp8_gemm_scaled():
    i, o = run_sample("fp8_gemm_scaled", dict(M=5, K=32, N=16))
    want = F.relu(i["x"] @ i["w"] * (i["x_scale"] * i["w_scale"]) + i["bias"])
    close(o["y"], want)


def test_rounding_mode_rounds_stores_to_dtype():
    i, o_exact = run_sample("bias_gelu", dict(M=4, K=16, N=8))
    _, o_round = run_sample("bias_gelu", dict(M=4, K=16, N=8), exact=False)
    assert not torch.equal(o_exact["y"], o_round["y"])
    assert torch.equal(o_round["y"], o_exact["y"].to(torch.bfloat16).to(D64))


def test_casts_saturate_and_round_half_even():
    prog = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in c: f32\n"
            "  out a: i8 = acc * 0 + c\n  out b: e4m3 = acc * 0 + c * 100\n}\n")
    program = analyze(prog).source_program
    x = torch.ones(2, 8, dtype=torch.bfloat16)
    w = torch.ones(8, 8, dtype=torch.bfloat16)
    out = reference.run(program, {"x": x, "w": w, "c": 2.5}, exact=False)
    assert out["a"].unique().tolist() == [2.0]          # half to even
    assert out["b"].unique().tolist() == [256.0]        # 250 -> nearest e4m3 (step 16 above 128)
    out = reference.run(program, {"x": x, "w": w, "c": 1000.0}, exact=False)
    assert out["a"].unique().tolist() == [127.0]        # saturates
    assert out["b"].unique().tolist() == [448.0]


def test_pairwise_map_on_odd_width_is_a_diagnostic():
    program = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = swiglu(acc)\n}\n").source_program
    inputs = reference.random_inputs(program, dict(M=2, K=8, N=5))
    with pytest.raises(EpicError) as info:
        reference.run(program, inputs)
    assert info.value.codes == ["E401"]


def test_missing_input_is_a_diagnostic():
    program = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in b: f32[N]\n  out y: bf16 = acc + b\n}\n")
    inputs = reference.random_inputs(program.source_program, dict(M=2, K=8, N=4))
    del inputs["b"]
    with pytest.raises(EpicError) as info:
        reference.run(program.source_program, inputs)
    assert info.value.codes == ["E601"]


def test_sizes_are_solved_from_tensors():
    program = pipeline.analyze(str(ROOT / "samples" / "swiglu.epi")).source_program
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w = torch.randn(16, 20, dtype=torch.bfloat16)
    out = reference.run(program, {"x": x, "wgu": w})
    assert out["y"].shape == (3, 10)
    with pytest.raises(EpicError) as info:
        reference.run(program, {"x": x, "wgu": torch.randn(15, 20, dtype=torch.bfloat16)})
    assert info.value.codes == ["E602"]
    with pytest.raises(EpicError):
        reference.run(program, {"x": x, "wgu": torch.randn(16, 21, dtype=torch.bfloat16)})  # 2*F odd


def test_lse_is_stable_for_large_logits():
    prog = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out l: f32[M] = row_lse(acc * 1000)\n}\n"
    program = analyze(prog).source_program
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    out = reference.run(program, {"x": x, "w": w})
    assert torch.isfinite(out["l"]).all()
    logits = x.double() @ w.double() * 1000
    close(out["l"], logits.max(-1).values + torch.log(torch.exp(logits - logits.max(-1, keepdim=True).values).sum(-1)))
    assert math.isfinite(out["l"].sum().item())
