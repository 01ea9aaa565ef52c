"""prog(..., out={name: tensor}): outputs written into tensors the caller gives, one of them possibly an
input the output overwrites in place (the fused loss's later chunks write dW over the running sum)."""
import pytest
import torch

import epic
from epic.autodiff.derive import derive_source
from epic.diagnostics import EpicError
from epic.plan import planner
from epic.runtime import given_outputs

from . import hostsim
from .conftest import ROOT

SIZES = dict(M=300, D=200, V=392)


@pytest.fixture(scope="module")
def later(tmp_path_factory):
    """The fused cross entropy's program for later chunks: its dW gemm stores acc + d_w_sum."""
    d = derive_source(str(ROOT / "samples" / "cross_entropy.epi"), None, False, policy="fused", accumulate=True)
    assert d.sums == {"d_w": "d_w_sum"}
    path = tmp_path_factory.mktemp("later") / "later.epi"
    path.write_text(d.forward_text)
    return str(path)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    m, d, v = SIZES["M"], SIZES["D"], SIZES["V"]
    return dict(x=torch.randn(m, d, generator=g).bfloat16(), w=torch.randn(v, d, generator=g).bfloat16().t(),
                label=torch.randint(0, v, (m,), generator=g, dtype=torch.int32),
                d_loss=torch.full((m,), 1.0 / m), d_lse_out=torch.zeros(m), d_w_sum=torch.randn(v, d, generator=g).bfloat16())


def test_the_dw_gemm_may_write_over_its_running_sum_and_nothing_else_in_place(later):
    plan = epic.compile(later).plan(SIZES)
    assert planner.overwrite_problem(plan, "d_w", "d_w_sum") is None
    assert "read by lm_head_fused, lm_head_db" in planner.overwrite_problem(plan, "d_x", "x")
    assert "not only by the kernel" in planner.overwrite_problem(plan, "d_x", "d_w_sum")


def test_an_operand_is_never_overwritten(tmp_path):
    path = tmp_path / "square.epi"
    path.write_text("gemm g(a: bf16[M, M] @ w: bf16[M, M]) {\n  out y: bf16 = acc\n}\n")
    plan = epic.compile(str(path)).plan(dict(M=64))
    assert "as a gemm operand" in planner.overwrite_problem(plan, "y", "a")


def _check(later, given, args=None):
    prog = epic.compile(later)
    plan = prog.plan(SIZES)
    args = args or inputs()
    tensors = {t.name: args[t.name] for t in prog.program.inputs() if not t.is_scalar}
    given_outputs.check(plan, [t.name for t in prog.outputs], torch.device("cpu"), tensors, given)


@pytest.mark.parametrize("given, code, words", [
    ({"lse": torch.empty(300)}, "E611", "not an output"),
    ({"d_w": torch.empty(392, 100, dtype=torch.bfloat16)}, "E602", "shape [392, 100]"),
    ({"d_w": torch.empty(392, 200)}, "E603", "torch.float32"),
    ({"d_w": torch.empty(200, 392, dtype=torch.bfloat16).t()}, "E605", "not contiguous"),
    ({"d_w": "a tensor"}, "E611", "must be a dense torch.Tensor"),
    ({"d_w": torch.zeros(392, 200).to_sparse()}, "E611", "must be a dense torch.Tensor"),
    ({"d_w": torch.zeros(392, 200, dtype=torch.bfloat16, requires_grad=True)}, "E611", "requires grad"),
    ({"d_w": torch.empty(392, 200, dtype=torch.bfloat16, device="meta")}, "E604", "is on meta"),
    ([1, 2], "E611", "takes a dict"),
])
def test_a_bad_given_output_is_refused_before_anything_runs(later, given, code, words):
    with pytest.raises(EpicError) as info:
        _check(later, given)
    assert info.value.codes == [code] and words in str(info.value)


def test_an_output_over_an_input_it_may_not_overwrite_is_e611(later):
    args = inputs()
    _check(later, {"d_w": args["d_w_sum"]}, args)                     # allowed: the running sum, whole
    with pytest.raises(EpicError) as info:                            # x is read by two gemms
        _check(later, {"d_x": args["x"]}, args)
    assert info.value.codes == ["E611"] and "shares memory with the input 'x'" in str(info.value)
    shifted = torch.empty(392 * 200 + 8, dtype=torch.bfloat16)
    args["d_w_sum"] = shifted[:392 * 200].view(392, 200)
    with pytest.raises(EpicError) as info:                            # part of the sum, shifted
        _check(later, {"d_w": shifted[8:].view(392, 200)}, args)
    assert info.value.codes == ["E611"] and "covers part of 'd_w_sum'" in str(info.value)
    big = torch.empty(392 * 200, dtype=torch.bfloat16)
    with pytest.raises(EpicError) as info:                            # two outputs in one tensor's memory
        _check(later, {"d_x": big[:300 * 200].view(300, 200), "d_w": big.view(392, 200)})
    assert info.value.codes == ["E611"] and "share memory" in str(info.value)


def test_a_call_with_out_writes_into_the_given_tensors():
    """The unfused form (a CPU machine): the values are the plain call's, in the tensors given."""
    prog = epic.compile(str(ROOT / "samples" / "bias_gelu.epi"), fallback="eager")
    g = torch.Generator().manual_seed(1)
    args = dict(x=torch.randn(64, 128, generator=g).bfloat16(), w=torch.randn(256, 128, generator=g).bfloat16().t(),
                bias=torch.randn(256, generator=g).bfloat16())
    plain = prog(**args)
    y = torch.full((64, 256), float("nan"), dtype=torch.bfloat16)
    got = prog(**args, out={"y": y})
    assert got["y"] is y and torch.equal(y, plain["y"])


def test_the_dw_gemm_writes_over_its_running_sum_on_the_host(later):
    """The kernels of the later-chunk program, run on the host through the runtime's Executable: with
    out={"d_w": d_w_sum} the sum is overwritten in place by exactly what a fresh output gets."""
    hostsim.require_toolchain()
    from epic.runtime import binding, derived
    from .hostsim import compiler, harness
    case = harness.prepare(later, SIZES, 64)
    args = {n: harness._host_tensor(case.program.tensors[n], x) for n, x in harness.make_inputs(case, 7).items()
            if not case.program.tensors[n].is_scalar}
    exe = binding.bind(case.plan, list(zip(case.specs, compiler.build(case.sources))), -1)
    exe.device = torch.device("cpu")
    scalars = binding.scalar_values([t for t in case.program.inputs() if t.is_scalar], args)
    fresh = exe.run(args, scalars, 0, derived.Cache())
    total = args["d_w_sum"].clone()
    got = exe.run({**args, "d_w_sum": total}, scalars, 0, derived.Cache(), into={"d_w": total})
    assert got["d_w"] is total
    assert torch.equal(total.view(torch.uint8), fresh["d_w"].view(torch.uint8))
    assert not torch.equal(total, args["d_w_sum"])
