"""LayerNorm before a gemm: the mean subtraction defers like RMSNorm's scale (epic/passes/affine_terms.py).
LN(h) @ W = r * ((h * gamma) @ W) - (r * mu) * (gamma @ W) + beta @ W, with gamma @ W and beta @ W derived
tensors computed from the weights (the reference interpreter before the kernels; the runtime with torch,
cached per weight tensor)."""
import pytest
import torch

from epic import pipeline, reference
from epic.checks.locality import reductions_feeding
from epic.plan import ledger, planner, verify
from epic.runtime import derived

from .conftest import ROOT, diagnose

CHAIN = str(ROOT / "tests" / "programs" / "layernorm_chain.epi")
RAGGED = dict(M=77, D=136, F=200)


def chain(form: str, dtype: str = "bf16", extra: str = "") -> str:
    return ("gemm a(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in z: bf16[M, D]\n  in g: bf16[D]\n  in b: bf16[D]\n"
            f"  h = acc + z\n{extra}  tmp n: {dtype} = {form}\n}}\n"
            "gemm up(n @ w2: bf16[D, E]) {\n  out y: f32 = acc\n}\n")


def test_the_chain_defers_the_mean_and_beta():
    a = pipeline.analyze(CHAIN)
    after = a.after("defer-row-scale")
    first = after.kernel("o_proj")
    n = next(s.value for s in first.stores if s.tensor == "n")
    assert n.id not in reductions_feeding(first)                  # n = h * gamma is tile-local
    assert {"n__rowscale", "n__rowshift0"} <= {s.tensor for s in first.stores}
    made = {t.name: t.derived for t in a.program.tensors.values() if t.role == "derived"}
    assert made == {"n__up__derived0": (("gamma",), "wu"), "n__up__derived1": (("beta",), "wu")}
    up = a.program.kernel("up")
    assert {v.attrs["tensor"] for v in up.values if v.op == "load"} == {"n__rowscale", "n__rowshift0", *made, "bias"}
    assert [k.kind for k in a.program.kernels] == ["gemm", "combine", "gemm"]


@pytest.mark.parametrize("tiles", [(64, 64), (128, 128), (128, 64)])
@pytest.mark.parametrize("sizes", [RAGGED, dict(M=1, D=40, F=24), dict(M=300, D=392, F=136)],
                         ids=lambda s: "x".join(map(str, s.values())))
def test_the_chain_rewrites_equivalently(sizes, tiles):
    a = pipeline.analyze(CHAIN)
    inputs = reference.random_inputs(a.source_program, sizes, seed=sizes["M"])
    errors = verify.equivalence(a, inputs, sizes, {k.name: tiles for k in a.program.kernels})
    assert errors and max(errors.values()) <= 1e-12, errors


def test_derived_tensors_are_the_weights_products():
    """Against torch's float64 products written here, not by epic: the interpreter's and the runtime's."""
    a = pipeline.analyze(CHAIN)
    inputs = reference.random_inputs(a.source_program, RAGGED, seed=5)
    gamma, beta, wu = (inputs[n].double() for n in ("gamma", "beta", "wu"))
    want = {"n__up__derived0": gamma @ wu, "n__up__derived1": beta @ wu}
    interp = reference.Interpreter(a.program, RAGGED, exact=True)
    interp.run(inputs)
    runtime = derived.Cache().all(derived.specs(a.program), inputs)
    for name, w in want.items():
        assert torch.allclose(interp.store[name], w, rtol=1e-12, atol=1e-12), name
        assert runtime[name].dtype == torch.float32
        assert torch.allclose(runtime[name].double(), w, rtol=1e-5, atol=1e-5), name


def test_a_row_vector_of_ones_and_a_repeated_vector():
    """layernorm(h, g, 0.5): beta is a number (0.5 * colsum(W), from a row of ones); layernorm(h, g, g):
    gamma's two terms share one derived tensor."""
    sizes = dict(M=19, D=72, E=40)
    for form, want in [("layernorm(h, g, 0.5)", {((), "w2"), (("g",), "w2")}), ("layernorm(h, g, g)", {(("g",), "w2")})]:
        a = pipeline.analyze(chain(form), name="t.epi")
        assert {t.derived for t in a.program.tensors.values() if t.role == "derived"} == want, form
        inputs = reference.random_inputs(a.source_program, sizes, seed=2)
        assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12, form
    w = torch.randn(72, 40, dtype=torch.float64)
    ones = derived.compute([], w.float())
    assert torch.allclose(ones.double(), w.sum(0), rtol=1e-5, atol=1e-5)


def test_a_quantizing_store_is_finished_not_deferred():
    a = pipeline.analyze(chain("layernorm(h, g, b)", "i8").replace("w2: bf16", "w2: i8").replace("f32 = acc", "i32 = acc"),
                         name="t.epi")
    assert not [t for t in a.program.tensors.values() if t.role == "derived"]
    assert "n__rowscale" not in a.program.tensors
    sizes = dict(M=19, D=80, E=48)
    inputs = reference.random_inputs(a.source_program, sizes, seed=4)
    assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12


@pytest.mark.parametrize("form, words", [
    ("layernorm(h, g, b) + z", "is a sum of 2 tile-shaped terms"),
    ("(h - row_mean(h)) * rsqrt(row_mean(h * h) + 1e-5) * (g * 2 + b)", "a product of input row vectors"),
])
def test_refusals_say_why(form, words):
    e = diagnose(chain(form))
    assert e.codes == ["E501"]
    d = e.diagnostics[0]
    assert "cannot move the row statistics of 'n' into gemm 'up'" in d.message and words in d.message, d.message


def test_the_plan_shows_derived_tensors():
    a = pipeline.analyze(CHAIN)
    plan = planner.make_plan(a.program, dict(M=64, D=512, F=256))
    b = plan.buffers["n__up__derived1"]
    assert (b.role, b.shape, b.nbytes, b.writer, b.readers) == ("derived", (256,), 1024, planner.DERIVED_WRITER, ["up"])
    assert "n__up__derived1" not in {x.name for x in plan.allocations()}      # not a kernel's: the runtime's
    assert plan.buffers["beta"].readers == ["n__up__derived1"]
    text = ledger.render(plan, a.source_program)
    assert "(beta) @ wu, computed once per weight tensor" in text
    assert "epilogue adds n__up__derived0[col], n__up__derived1[col]" in text


def test_the_runtime_cache_recomputes_after_an_in_place_update():
    cache = derived.Cache()
    gamma = torch.randn(72, dtype=torch.bfloat16)
    w = torch.randn(40, 72, dtype=torch.bfloat16)            # an nn.Linear weight, passed as w.t()
    first = cache.get([gamma], w.t())
    assert cache.get([gamma], w.t()) is first                  # a fresh view of the same weight: cached
    w.mul_(2)                                                  # bumps the version counter the views share
    second = cache.get([gamma], w.t())
    assert second is not first
    assert torch.allclose(second.double(), gamma.double() @ w.t().double(), rtol=1e-5, atol=1e-4)
    gamma.add_(1)
    assert torch.allclose(cache.get([gamma], w.t()).double(), gamma.double() @ w.t().double(), rtol=1e-5, atol=1e-4)
    other = w.clone()                                          # another tensor with equal values: its own entry
    assert cache.get([gamma], other.t()) is not cache.get([gamma], w.t())


def test_another_tensor_at_the_same_address_is_not_taken_for_the_cached_one():
    """What a weight freed and another allocated where it was looks like: same pointer, shape and
    version, another tensor."""
    cache = derived.Cache()
    w = torch.randn(8, 4)
    w.add_(0)                                 # version 1, as set_ leaves the alias
    first = cache.get([], w)
    alias = torch.empty(0).set_(w.untyped_storage(), 0, w.shape, w.stride())
    assert (alias.data_ptr(), alias._version) == (w.data_ptr(), w._version)
    assert cache.get([], alias) is not first


def test_the_cache_is_bounded():
    cache = derived.Cache()
    keep = [torch.randn(8, 4) for _ in range(derived.MAX_ENTRIES + 5)]
    for w in keep:
        cache.get([], w)
    assert len(cache) == derived.MAX_ENTRIES
