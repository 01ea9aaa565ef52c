"""Tensors handed to a compiled program are checked before anything launches (no GPU needed:
every check runs before the device check, and CPU tensors end in E604)."""
import pytest
import torch

import epic
from epic.diagnostics import EpicError

from .conftest import ROOT

BF = torch.bfloat16


@pytest.fixture(scope="module")
def prog():
    return epic.compile(str(ROOT / "samples" / "bias_gelu.epi"))


def good(m=64, k=128, n=256):
    return dict(x=torch.randn(m, k, dtype=BF), w=torch.randn(n, k, dtype=BF).t(), bias=torch.randn(n, dtype=BF))


def refused(prog, **args) -> EpicError:
    with pytest.raises(EpicError) as info:
        prog(**args)
    return info.value


def test_all_checks_pass_until_the_device(prog):
    e = refused(prog, **good())
    assert e.codes == ["E604"] and "'x' is on cpu" in str(e) and ".cuda()" in str(e)


def test_missing_and_unexpected(prog):
    args = good()
    del args["bias"]
    e = refused(prog, **args)
    assert e.codes == ["E601"] and "missing tensor 'bias' (bf16[N])" in str(e)
    e = refused(prog, **good(), gamma=torch.ones(3))
    assert e.codes == ["E601"] and "unexpected argument(s) gamma" in str(e)
    e = refused(prog, **dict(good(), x=[[1.0]]))
    assert e.codes == ["E601"] and "torch.Tensor" in str(e)


def test_dtype(prog):
    e = refused(prog, **dict(good(), x=torch.randn(64, 128)))
    assert e.codes == ["E603"] and "torch.float32" in str(e) and "bf16[M, K]" in str(e)


def test_shape(prog):
    e = refused(prog, **dict(good(), bias=torch.randn(255, dtype=BF)))
    assert e.codes == ["E602"] and "'bias' dimension 0 is 255, but N = 256" in str(e)
    e = refused(prog, **dict(good(), bias=torch.randn(2, 256, dtype=BF)))
    assert e.codes == ["E602"]


def test_layout_rules_at_call(prog):
    e = refused(prog, **good(n=260))      # 260 bf16 = 520 bytes per output row: not a multiple of 16
    assert e.codes == ["E403"] and "contiguous dimension of 'y'" in str(e) and "(it is 260)" in str(e)


def test_strides(prog):
    e = refused(prog, **dict(good(), w=torch.randn(128, 256, dtype=BF)))      # row-major [K, N]
    assert e.codes == ["E605"] and "W.t()" in str(e)
    e = refused(prog, **dict(good(), x=torch.randn(128, 64, dtype=BF).t()))
    assert e.codes == ["E605"] and "contiguous" in str(e)


def test_alignment(prog):
    x = torch.randn(64 * 128 + 1, dtype=BF)[1:].view(64, 128)
    e = refused(prog, **dict(good(), x=x))
    assert e.codes == ["E606"] and "16-byte" in str(e)


def test_scalars_take_defaults_and_values():
    p = epic.compile(str(ROOT / "samples" / "residual_rmsnorm.epi"))
    args = dict(x=torch.randn(64, 128, dtype=BF), wo=torch.randn(128, 128, dtype=BF).t(),
                z=torch.randn(64, 128, dtype=BF), gamma=torch.randn(128, dtype=BF))
    assert refused(p, **args).codes == ["E604"]               # eps defaults to 1e-6
    assert refused(p, **args, eps=torch.tensor(1e-5)).codes == ["E604"]


def test_reference_method_runs_on_cpu(prog):
    args = good(m=4, k=16, n=8)
    out = prog.reference(**args)
    want = torch.nn.functional.gelu(args["x"].double() @ args["w"].double() + args["bias"].double(),
                                    approximate="tanh")
    assert torch.allclose(out["y"], want)


def test_torch_op_shapes_under_fake_tensors():
    """The custom op's fake (meta) kernel gives torch.compile the output shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    p = epic.compile(str(ROOT / "samples" / "residual_rmsnorm.epi"))
    op = p.torch_op()
    with FakeTensorMode():
        x = torch.empty(33, 256, dtype=BF)
        w = torch.empty(256, 256, dtype=BF).t()
        out = op(x=x, wo=w, z=torch.empty(33, 256, dtype=BF), gamma=torch.empty(256, dtype=BF))
    assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {
        "resid": ((33, 256), BF), "hg": ((33, 256), BF), "r": ((33,), torch.float32)}


def test_torch_op_derives_half_width_shapes():
    from epic import sizes as sizes_mod
    from epic import pipeline
    prog = pipeline.analyze(str(ROOT / "samples" / "swiglu.epi")).program
    sizes = sizes_mod.solve_integer(prog, {"x": (5, 64), "wgu": (64, 96)})
    assert sizes == {"M": 5, "D": 64, "F": 48}
    assert [sizes_mod.evaluate_integer(d, sizes) for d in prog.tensors["y"].dims] == [5, 48]
