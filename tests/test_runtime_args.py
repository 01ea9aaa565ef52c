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


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors", "ignore:Sparse CSR tensor support")
@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "nested"])
def test_tensors_that_are_not_dense_are_refused(prog, kind):
    x = good()["x"]
    odd = {"sparse_coo": x.to_sparse, "sparse_csr": x.to_sparse_csr,
           "nested": lambda: torch.nested.nested_tensor([x[0], x[1]])}[kind]()
    for _ in range(2):                       # the second time through the bound-signature lookup
        e = refused(prog, **dict(good(), x=odd))
        assert e.codes == ["E605"] and f"'x' is a {kind} tensor" in str(e)
    with pytest.raises(EpicError) as info:     # the reference interpreter too
        prog.reference(**dict(good(), x=odd))
    assert info.value.codes == ["E603"] and "dense" in str(info.value)


def test_a_tensor_inside_vmap_is_refused(prog):
    args, caught = good(), []

    def call(xb):
        try:
            prog(**dict(args, x=xb))
        except EpicError as e:
            caught.append(e)
        return xb
    torch.func.vmap(call)(args["x"].unsqueeze(0))
    assert len(caught) == 1 and caught[0].codes == ["E605"] and "vmap" in str(caught[0])


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


# ------------------------------------------------------------------ every refusal points at the declaration
# (the program's line of each input, read from its text here, not from epic) and says how to fix it
SCALAR_FIRST = """gemm g(x: bf16[M, K] @ w: bf16[K, N]) {
  in alpha: f32
  in beta: f32 = 2.0
  in z: bf16[M, N]
  in s: f32[M]
  out y: bf16 = acc * alpha + z * beta + s
}
"""


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture(scope="module")
def scalar_first():
    return epic.compile(SCALAR_FIRST)


def args_sf(m=4, k=16, n=8, **over):
    base = dict(x=torch.randn(m, k, dtype=BF), w=torch.randn(n, k, dtype=BF).t(), alpha=0.5,
                z=torch.randn(m, n, dtype=BF), s=torch.randn(m))
    base.update(over)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("case, code, decl, words, hint", [
    ("missing z", "E601", "in z:", "missing tensor 'z' (bf16[M, N])", None),
    ("missing alpha", "E601", "in alpha:", "missing scalar 'alpha'", "pass alpha="),
    ("alpha a string", "E603", "in alpha:", "scalar 'alpha' must be a real number", None),
    ("alpha two numbers", "E603", "in alpha:", "must be one real number", None),
    ("alpha nan", "E603", "in alpha:", "must be finite", None),
    ("z f32", "E603", "in z:", "'z' is torch.float32, the program declares bf16[M, N]", "z.to(torch.bfloat16)"),
    ("z not a tensor", "E601", "in z:", "'z' must be a torch.Tensor", None),
    ("s wrong length", "E602", "in s:", "'s' dimension 0 is 5, but M = 4", None),
    ("z transposed", "E605", "in z:", "'z' has strides", "z.contiguous()"),
    ("z unaligned", "E606", "in z:", "'z' does not start on a 16-byte boundary", "z.clone()"),
    ("all good", "E604", "@ w:", "'x' is on cpu", "x.cuda()"),
])
def test_each_refusal_points_at_its_declaration(scalar_first, case, code, decl, words, hint):
    over = {"missing z": dict(z=None), "missing alpha": dict(alpha=None), "alpha a string": dict(alpha="abc"),
            "alpha two numbers": dict(alpha=torch.ones(2)), "alpha nan": dict(alpha=float("nan")),
            "z f32": dict(z=torch.randn(4, 8)), "z not a tensor": dict(z=[[1.0]]),
            "s wrong length": dict(s=torch.randn(5)), "z transposed": dict(z=torch.randn(8, 4, dtype=BF).t()),
            "z unaligned": dict(z=torch.randn(4 * 8 + 1, dtype=BF)[1:].view(4, 8)), "all good": {}}[case]
    e = refused(scalar_first, **args_sf(**over))
    assert e.codes == [code], str(e)
    d = e.diagnostics[0]
    assert words in d.message, d.message
    line = _line_of(SCALAR_FIRST, decl) if decl != "@ w:" else 1
    assert d.span is not None and d.span.line == line, (d.span, line)
    if hint:
        assert d.hint and hint in d.hint, d.hint


def test_a_defaulted_scalar_may_be_left_out_given_or_none(scalar_first):
    for beta in (None, 3.0, torch.tensor(3.0)):
        e = refused(scalar_first, **args_sf(beta=beta))
        assert e.codes == ["E604"]          # every check before the device passed


def test_unexpected_names_are_listed(scalar_first):
    e = refused(scalar_first, **args_sf(gamma=torch.ones(3), delta=1.0))
    assert e.codes == ["E601"] and "unexpected argument(s) gamma, delta" in str(e)
    assert "alpha" in e.diagnostics[0].hint and "z" in e.diagnostics[0].hint
