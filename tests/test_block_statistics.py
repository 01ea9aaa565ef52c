"""Block statistics that scale a stored tile (QK-norm's per-head RMS in the same epilogue) and f16
accumulation (`with accumulate=f16`): meaning checked against torch written here, the rewrite
(hoist-block-scale) against the reference, refusals and diagnostics. The generated kernels run against
the reference in tests/test_hostsim.py and tests/test_gpu.py (samples/qk_norm_rope.epi,
tests/programs/block_stats.epi, tests/programs/f16_accumulate.epi)."""
import pytest
import torch

import epic
from epic import dtypes, reference
from epic.diagnostics import EpicError
from epic.ir import primitives as P
from epic.passes import hoist_block_scale
from epic.shapes import Kind

from .conftest import ROOT, analyze, diagnose
from .test_diagnostics import marked

QK = ("gemm q_proj(x: bf16[M, D] @ wq: bf16[D, H*Dh]) {\n  in pos: f32[M]\n  in gamma: bf16[Dh]\n"
      "  in freq: f32[Dh]\n  out q: f32 = rope(head_rmsnorm(acc, gamma, 16), pos, freq)\n}\n")


def _qk_norm_rope_by_hand(x, w, gamma, pos, freq, dh, eps=1e-6):
    """Qwen3's q_norm then RoPE on interleaved pairs, written directly in torch (float64)."""
    h = x.double() @ w.double()
    m, n = h.shape
    heads = h.reshape(m, n // dh, dh)
    normed = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + eps) * gamma.double()
    normed = normed.reshape(m, n)
    angle = pos.double()[:, None] * freq.double().repeat(n // dh)[None, :]
    c, s = torch.cos(angle[:, 0::2]), torch.sin(angle[:, 0::2])
    x0, x1 = normed[:, 0::2], normed[:, 1::2]
    out = torch.empty_like(normed)
    out[:, 0::2] = x0 * c - x1 * s
    out[:, 1::2] = x0 * s + x1 * c
    return out


def test_qk_norm_means_per_head_rmsnorm_then_rope():
    prog = analyze(QK).source_program
    sizes = dict(M=6, D=32, H=3, Dh=16)
    inputs = reference.random_inputs(prog, sizes, seed=3)
    out = reference.run(prog, inputs)["q"]
    want = _qk_norm_rope_by_hand(inputs["x"], inputs["wq"], inputs["gamma"], inputs["pos"], inputs["freq"], 16)
    assert torch.allclose(out, want, rtol=1e-12, atol=1e-12)


def test_the_scale_moves_to_the_store_and_the_meaning_stays():
    a = analyze(QK)
    k = a.program.kernels[0]
    v = k.stores[0].value
    assert P.prim(v.op).algebra == "product" and v.args[1].kind is Kind.BLOCK
    rest = v.args[0]
    assert not any(x.kind is Kind.BLOCK for x in _reach(rest)), "the element-wise part still reads the block value"
    sizes = dict(M=5, D=32, H=4, Dh=16)
    inputs = reference.random_inputs(a.source_program, sizes, seed=4)
    before = reference.run(a.source_program, inputs)["q"]
    after = reference.run(a.program, inputs)["q"]
    assert torch.allclose(before, after, rtol=1e-12, atol=1e-12)


def _reach(v):
    seen, stack = {}, [v]
    while stack:
        x = stack.pop()
        if x.id not in seen:
            seen[x.id] = x
            stack.extend(x.args)
    return list(seen.values())


GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"


@pytest.mark.parametrize("expr, moved", [
    ("acc * block_max(abs(acc), 32)", False),                         # already y * s
    ("acc / (block_max(abs(acc), 32) + 1)", False),                  # already y / s
    ("-(acc * 2 + acc) * block_sum(acc, 32)", False),                # already y * s
    ("-(acc * block_sum(acc, 32) * 2 + acc * block_sum(acc, 32))", True),
    ("interleave(odd(acc * block_sum(acc, 32)), even(acc * block_sum(acc, 32)))", True),
    ("(acc / block_sum(acc, 32)) * 3", True),
    ("acc * block_sum(acc, 32) + acc", False),                       # terms scaled differently
    ("exp(acc * block_sum(acc, 32))", False),                        # not linear in the scale
    ("acc * block_sum(acc, 32) * block_max(acc, 32)", True),         # two statistics: moved, then refused
    ("acc * block_sum(acc, 32) * block_sum(acc, 32)", True),          # one statistic twice: s ** 2
    ("(acc * block_sum(acc, 32) * block_sum(acc, 32)) / block_sum(acc, 32)", True),   # s ** (2 - 1)
    ("(acc / block_sum(acc, 32)) / block_sum(acc, 32)", True),        # 1 / s ** 2
    ("(acc * block_sum(acc, 32)) / (abs(acc) + 1)", True),            # divided by a value without it
    ("interleave(even(block_sum(acc, 32) / (abs(acc) + 1)), odd(acc * block_sum(acc, 32)))", True),  # s / t
    ("acc * block_sum(acc, 32) + block_sum(acc, 32)", False),         # a bare block term: no tile left
    ("block_max(abs(acc), 32) * acc", False),                         # already s * y
    ("block_sum(acc, 32) / (abs(acc) + 1)", True),                    # s / y is not y / s: (1 / y) * s
])
def test_which_stores_are_rewritten(expr, moved):
    a = analyze(GEMM + f"  out y: f32 = {expr}\n}}\n", stop_after="split-reductions")
    k = a.program.kernels[0]
    dep = hoist_block_scale.block_dependent(k)
    new = hoist_block_scale.hoisted(k.stores[0].value, dep)
    assert (new is not None) == moved
    if moved:
        assert new.name == k.stores[0].value.name == "y"               # dumps still name it
        assert hoist_block_scale.root_form(new, dep) is not None
        assert all(x.span is not None for x in _reach(new))       # diagnostics can still point at them
        # and it means the same
        full = analyze(GEMM + f"  out y: f32 = {expr}\n}}\n")
        inputs = reference.random_inputs(full.source_program, dict(M=3, K=16, N=64), seed=5)
        want = reference.run(full.source_program, inputs)["y"]
        got = reference.run(full.program, inputs)["y"]
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("body", [
    "out y: f32 = acc * $block_sum(acc, 32) + acc",
    "out y: f32 = exp(acc * $block_sum(acc, 32))",
    "out y: f32 = acc * $block_sum(acc, 32) * block_max(acc, 32)",
    "in eps: f32 = 0.5\n  out y: f32 = acc * ($block_sum(acc, 32) + eps)",     # a runtime scalar in the scale
])
def test_what_cannot_be_built_is_refused_at_the_statistic(body):
    text, line, _ = marked(GEMM + f"  {body}\n}}\n")
    prog = epic.compile(text)
    with pytest.raises(EpicError) as info:
        prog.units()
    assert info.value.codes == ["E702"]
    d = info.value.diagnostics[0]
    assert "is not supported by code generation yet" in d.message
    assert "1xB block reduction" in d.hint          # the hint names what a block statistic can do
    assert d.span.line == line


def test_the_guarantee_finds_a_movable_scale_left_behind():
    """The pass's `ensures` (checked after it under EPIC_VERIFY) on the program before it ran."""
    before = analyze(QK, stop_after="split-reductions").program
    assert hoist_block_scale.unhoisted(before) == ["kernel q_proj: store q still has a movable block scale"]
    assert hoist_block_scale.unhoisted(analyze(QK).program) == []


def test_every_gemm_is_rewritten_and_the_trace_says_so(capsys):
    from cli.main import main
    text = (GEMM + "  out y: f32 = acc\n  out r: f32[M] = row_sum(acc)\n}\n"           # a combine kernel next
            "gemm h(x2: bf16[M, K] @ v: bf16[K, P]) {\n  out q: f32 = -(acc * block_sum(acc, 32))\n}\n")
    a = analyze(text)
    assert [k.kind for k in a.program.kernels][-1] == "gemm" and len(a.program.kernels) == 3
    h = a.program.kernels[-1]
    assert hoist_block_scale.root_form(h.stores[0].value, hoist_block_scale.block_dependent(h)) is not None
    assert h.stores[0].span is not None and h.stores[0].span.line == 6          # diagnostics point at the store
    path = ROOT / "samples" / "qk_norm_rope.epi"
    assert main(["ir", str(path), "--after", "hoist-block-scale", "--rules"]) == 0
    assert "// hoist-block-scale: q_proj: 'q' = (its element-wise math) * its 1x128 block scale" in \
        capsys.readouterr().out
    stage = next(st for st in analyze(GEMM + "  out y: f32 = (acc / block_sum(acc, 32)) * 3\n}\n").stages
                 if st.name == "hoist-block-scale")
    assert stage.trace == ["g: 'y' = (its element-wise math) / its 1x32 block scale"]


def test_stored_block_values_are_the_nodes_statistic():
    prog = epic.compile(str(ROOT / "tests" / "programs" / "block_stats.epi"))
    spec = [s for s, _ in prog.units() if s.name == "normed"][0]
    root = spec.nodes[-1]
    assert root.type.startswith("epic_nodes::Sm90BlockReduceScale<64, ") and root.type.endswith(", false, float>")
    assert [p.role for p in spec.pointers].count("block_scale") == 1
    scaled = [s for s, _ in prog.units() if s.name == "scaled"][0]
    assert scaled.nodes[-1].type.endswith(", true, float>")          # y / s divides


# ------------------------------------------------------------------ f16 accumulation
F16 = "gemm h(x: f16[M, K] @ w: f16[K, N]) with accumulate=f16 {\n  out y: f32 = acc\n}\n"


def test_an_f16_accumulator_is_the_product_rounded_to_f16():
    prog = analyze(F16).source_program
    assert prog.kernels[0].acc is dtypes.F16
    inputs = reference.random_inputs(prog, dict(M=7, K=64, N=16), seed=6)
    inputs["x"] = inputs["x"] * 30            # sums large enough that f16 rounds them visibly
    got = reference.Interpreter(prog, dict(M=7, K=64, N=16), exact=False).run(inputs)["y"]
    exact = inputs["x"].double() @ inputs["w"].double()
    assert torch.equal(got, exact.half().double())
    assert not torch.equal(got, exact)
    # the exact mode (what passes are proven in) keeps the sum unrounded
    assert torch.equal(reference.Interpreter(prog, dict(M=7, K=64, N=16), exact=True).run(inputs)["y"], exact)


def test_f16_accumulate_reaches_the_mainloop():
    spec, unit = epic.compile(F16).units()[0]
    assert spec.element_acc == "cutlass::half_t"
    assert "cutlass::half_t, TileShape, ClusterShape" in unit.source      # the mainloop's ElementAccumulator
    assert "f16 accumulate" in unit.source.splitlines()[1]


@pytest.mark.parametrize("operands, option, code, words", [
    ("x: bf16[M, K] @ w: bf16[K, N]", "accumulate=$f16", "E205", "f16 x f16 or fp8 x fp8"),
    ("x: i8[M, K] @ w: i8[K, N]", "accumulate=$f16", "E205", "f16 x f16 or fp8 x fp8"),
    ("x: i8[M, K] @ w: i8[K, N]", "accumulate=$f32", "E205", "accumulates in i32"),
    ("x: f16[M, K] @ w: f16[K, N]", "accumulate=$f8", "E215", "accumulate must be one of f32, f16"),
])
def test_illegal_accumulators_are_refused_at_the_option(operands, option, code, words):
    text, line, column = marked(f"gemm g({operands}) with {option} {{\n  out y: f32 = acc\n}}\n")
    err = diagnose(text)
    assert err.codes == [code] and words in str(err), str(err)
    d = err.diagnostics[0]
    assert (d.span.line, d.span.column) == (line, column)


def test_fp8_gemms_accumulate_in_f16_too():
    prog = analyze("gemm g(x: e4m3[M, K] @ w: e5m2[K, N]) with accumulate=f16 {\n  out y: bf16 = acc\n}\n").program
    assert prog.kernels[0].acc is dtypes.F16


def test_a_call_cannot_change_the_accumulator():
    with pytest.raises(EpicError) as info:
        epic.compile(F16, config={"h": {"accumulate": "f32"}})
    assert info.value.codes == ["E215"] and "changes what the gemm computes" in str(info.value)
