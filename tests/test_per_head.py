"""Per-head vectors: a [Dh] vector in a gemm whose columns are written H*Dh repeats along the row
(vec[col % Dh]), e.g. QK-norm's gamma or RoPE's frequencies. Meaning checked against torch by hand;
the kernels run against the reference in tests/test_hostsim.py and tests/test_gpu.py through
tests/programs/per_head.epi."""
import pytest
import torch

from epic import reference, sizes as sizes_mod
from epic.diagnostics import EpicError

from .conftest import analyze, diagnose

GEMM = "gemm q_proj(x: bf16[M, D] @ wq: bf16[D, H*Dh]) {\n  in gamma: bf16[Dh]\n"


def test_the_vector_repeats_once_per_head():
    prog = analyze(GEMM + "  out g: f32 = acc * gamma\n}\n").source_program
    inputs = reference.random_inputs(prog, dict(M=5, D=16, H=3, Dh=10), seed=1)
    out = reference.run(prog, inputs)["g"]
    acc = inputs["x"].double() @ inputs["wq"].double()
    want = acc * torch.cat([inputs["gamma"].double()] * 3)
    assert torch.equal(out, want)


def test_constant_head_size_and_coefficients():
    prog = analyze("gemm q(x: bf16[M, D] @ w: bf16[D, 128*H]) {\n  in gamma: f32[128]\n"
                   "  out g: f32 = acc + gamma\n}\n").source_program
    inputs = reference.random_inputs(prog, dict(M=2, D=8, H=2), seed=2)
    out = reference.run(prog, inputs)["g"]
    acc = inputs["x"].double() @ inputs["w"].double()
    assert torch.equal(out, acc + inputs["gamma"].double().repeat(2))


def test_sizes_come_from_the_vector():
    prog = analyze(GEMM + "  out g: f32 = acc * gamma\n}\n").program
    sizes = sizes_mod.bind_from_tensors(prog, {"x": (4, 16), "wq": (16, 96), "gamma": (32,)})
    assert sizes == dict(M=4, D=16, H=3, Dh=32)
    with pytest.raises(EpicError) as info:
        sizes_mod.bind_from_tensors(prog, {"x": (4, 16), "wq": (16, 100), "gamma": (32,)})
    assert info.value.codes == ["E602"] and "for any whole" in str(info.value)


def test_dump_says_it_repeats():
    from epic.ir import dump
    prog = analyze(GEMM + "  out g: f32 = acc * gamma\n}\n").source_program
    assert "load gamma every Dh columns" in dump.to_text(prog)


@pytest.mark.parametrize("decl", ["f32[K]", "f32[2*Dh]", "f32[Dh*Dh]"])
def test_a_vector_that_is_not_a_factor_of_the_columns_is_refused(decl):
    err = diagnose(GEMM + f"  in v: {decl}\n  out g: f32 = acc * v\n}}\n")
    assert err.codes == ["E208"]
    assert "H*" in str(err) and "repeated along the row" in str(err)
