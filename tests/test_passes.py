"""The rewrite passes: each canonicalization rule with the IR before and after, row-scale deferral
for rmsnorm and hand-written RMSNorm in any operand order, reduction splitting, and equivalence of
every sample's rewritten plan with its source on the oracle."""
import zlib

import pytest
import torch

from epic import pipeline, reference
from epic.ir import dump
from epic.passes import cse, dce, manager, simplify
from epic.plan import verify

from .conftest import ROOT, SAMPLES, analyze

GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: bf16[M, N]\n  in g: bf16[N]\n"


def ops_of(program, kernel=0):
    return [v.op for v in program.kernels[kernel].values]


def kernel_text(program, kernel=0):
    from epic.ir.dump import kernel_lines
    return "\n".join(kernel_lines(program.kernels[kernel], program))


@pytest.mark.parametrize("expr, before, after", [
    ("acc * 1", ["acc", "const", "mul"], ["acc"]),
    ("acc + 0", ["acc", "const", "add"], ["acc"]),
    ("0 + acc", ["const", "acc", "add"], ["acc"]),
    ("acc / 1", ["acc", "const", "div"], ["acc"]),
    ("--acc", ["acc", "neg", "neg"], ["acc"]),
    ("acc ** 1", ["acc", "powi"], ["acc"]),
    ("acc + -z", ["acc", "load", "neg", "add"], ["acc", "load", "sub"]),
    ("acc * (2 * 3 + 1)", ["acc", "const", "const", "mul", "const", "add", "mul"], ["acc", "const", "mul"]),
    ("f32(acc)", ["acc", "cast"], ["acc"]),
    ("bf16(z)", ["load", "cast"], ["load"]),
    ("bf16(bf16(acc))", ["acc", "cast", "cast"], ["acc", "cast"]),
    ("select(acc > 0, z, z)", ["acc", "const", "gt", "load", "select"], ["load"]),
])
def test_simplify_rules(expr, before, after):
    p = analyze(GEMM + f"  out y: bf16 = {expr}\n}}\n", run_passes=False).source_program
    assert ops_of(p) == before
    assert ops_of(dce.run(simplify.run(p))) == after


def test_folding_uses_reference_semantics():
    p = analyze(GEMM + "  out y: bf16 = acc * rsqrt(4.0) + exp(0)\n}\n", run_passes=False).source_program
    q = dce.run(simplify.run(p))
    consts = sorted(v.attrs["value"] for v in q.kernels[0].values if v.op == "const")
    assert consts == [0.5, 1.0]


def test_cse_merges_equal_values_and_dce_drops_dead_ones():
    p = analyze(GEMM + "  a = tanh(acc + z)\n  b = tanh(acc + z)\n  dead = exp(acc)\n  out y: bf16 = a * b\n}\n",
                run_passes=False).source_program
    assert ops_of(p).count("tanh") == 2
    q = cse.run(p)
    assert ops_of(q).count("tanh") == 1 and ops_of(q).count("add") == 1
    assert "exp" not in ops_of(dce.run(q))


HAND_WRITTEN = [
    "rmsnorm(h, g, 1e-6)",
    "h * rsqrt(row_mean(h * h) + 1e-6) * g",
    "g * (rsqrt(row_mean(h * h) + 1e-6) * h)",
    "(h * g) / sqrt(row_mean(h ** 2) + 1e-6)",
    "rsqrt(row_sum(h * h) / D + 1e-6) * (g * h)",
    "h * (g * rsqrt(row_mean(h * h) + 1e-6))",
    # row scales with powers: squared, divided twice, and two statistics (e = 2, -2, +1/-1 mixed)
    "h * g * rsqrt(row_mean(h * h) + 1e-6) * rsqrt(row_mean(h * h) + 1e-6)",
    "h * g / (sqrt(row_mean(h * h) + 1e-6) * sqrt(row_mean(h * h) + 1e-6))",
    "h * g / sqrt(row_mean(h * h) + 1e-6) / sqrt(row_mean(h * h) + 1e-6)",
    "h * g * (row_max(abs(h)) + 1) / (row_mean(h * h) + 1e-6)",
    "h * g * (rsqrt(row_mean(h * h) + 1e-6) ** 3)",
    "g * (h * rsqrt(row_mean(h * h) + 1e-6)) ** 2",                 # (r x)^2 = r^2 x^2
    "g / (h * sqrt(row_mean(h * h) + 1e-6)) ** 2",                  # x^-2 and r^-2
    "g * (h / sqrt(row_mean(h * h) + 1e-6)) ** 3 / (h * h)",
]


@pytest.mark.parametrize("form", HAND_WRITTEN)
def test_row_scale_deferral_fires_for_any_form(form):
    text = ("gemm a(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in z: bf16[M, D]\n  in g: bf16[D]\n  h = acc + z\n"
            f"  out resid: bf16 = h\n  tmp n: bf16 = {form}\n}}\n"
            "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n")
    a = analyze(text)
    after = a.after("defer-row-scale")
    first = after.kernel("a")
    n_value = next(s.value for s in first.stores if s.tensor == "n")
    from epic.checks.locality import reductions_feeding
    assert n_value.id not in reductions_feeding(first)            # n is tile-local now
    assert "n__rowscale" in [s.tensor for s in first.stores]       # the scale became a [M] buffer
    second = after.kernel("b")
    acc_users = [v for v in second.values if v.op == "mul" and v.args[0].op == "acc"]
    assert acc_users and acc_users[0].args[1].attrs["tensor"] == "n__rowscale"
    final = a.program
    assert [k.kind for k in final.kernels] == ["gemm", "combine", "gemm"]
    sizes = dict(M=11, D=72, E=40)
    inputs = reference.random_inputs(a.source_program, sizes, 3)
    assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12


def test_split_turns_reductions_into_partials_and_combine():
    a = pipeline.analyze(str(ROOT / "samples" / "cross_entropy.epi"))
    gemm, combine = a.program.kernels
    assert gemm.kind == "gemm" and combine.kind == "combine"
    assert sorted(v.attrs["fn"] for v in gemm.values if v.op == "partial") == ["lse", "sum"]
    assert "reduce" not in [v.op for v in gemm.values]
    assert sorted(s.tensor for s in combine.stores) == ["loss", "lse_out"]
    assert {v.op for v in combine.values} <= {"combine", "sub"}
    lse_buffer = a.program.tensors["lm_head__lse_part0"]
    assert lse_buffer.role == "partial" and lse_buffer.tiles_axis == "n"


PICK_HEAD = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in label: i32[M]\n  in fl: f32[M]\n"


@pytest.mark.parametrize("expr, picked", [
    ("row_pick(acc, label)", "label"),
    ("row_sum(select(label == col, acc * 2, 0))", "label"),        # either side of ==, any tile value
    ("row_sum(select(col == label + 1, acc, 0))", None),           # a computed column: not an input
    ("row_sum(select(col == label, acc, 1))", None),                # other tiles add 1 each
    ("row_max(select(col == label, acc, 0))", None),                # only a sum adds the other tiles' zeros
    ("row_sum(select(col == fl, acc, 0))", None),                   # a float vector: not a column index
    ("row_sum(select(col != label, acc, 0))", None),
])
def test_split_picks_the_one_tile_of_a_row_sum_of_a_selected_column(expr, picked):
    """A row sum of select(col == L, x, 0) for an integer input L is read from the tile of column L
    (the combine kernel's pick); every other reduction merges every tile's partial."""
    a = analyze(PICK_HEAD + f"  out s: f32[M] = {expr} + fl\n}}\n")
    (combine,) = [v for k in a.program.kernels if k.kind == "combine" for v in k.values if v.op == "combine"]
    assert combine.attrs.get("pick") == picked
    sizes = dict(M=77, K=40, N=300)
    inputs = reference.random_inputs(a.source_program, sizes, 5)
    inputs["label"][:6] = torch.tensor([-100, -1, 0, 299, 300, 2**31 - 1], dtype=inputs["label"].dtype)
    assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12


def test_column_reductions_get_their_own_combine():
    a = analyze(GEMM + "  out cs: f32[N] = col_sum(acc * z)\n  out rs: f32[M] = row_max(acc)\n}\n")
    kinds = [(k.kind, getattr(k, "axis", None)) for k in a.program.kernels]
    assert kinds == [("gemm", None), ("combine", "row"), ("combine", "col")]
    sizes = dict(M=300, K=16, N=200)
    inputs = reference.random_inputs(a.source_program, sizes)
    assert max(verify.equivalence(a, inputs, sizes).values()) <= 1e-12


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("tiles", [(64, 128), (128, 256), (128, 64)])
def test_every_sample_rewrites_equivalently(path, tiles):
    a = pipeline.analyze(str(path))
    sizes = {d: v for d, v in dict(M=77, K=40, N=384, D=136, F=200, V=300, E=48, H=3, Dh=66).items() if d in a.source_program.dims}
    inputs = reference.random_inputs(a.source_program, sizes, seed=zlib.crc32(path.stem.encode()) % 1000)
    errors = verify.equivalence(a, inputs, sizes, {k.name: tiles for k in a.program.kernels})
    assert errors and max(errors.values()) <= 1e-12, errors


def test_pass_order_is_documented_and_dumpable():
    names = manager.pass_names()
    assert names[:3] == ["simplify", "cse", "dce"]
    assert names.index("defer-row-scale") < names.index("split-reductions")
    for name in names:
        assert name in manager.__doc__
    a = pipeline.analyze(str(ROOT / "samples" / "prenorm_mlp.epi"))
    assert [s.name for s in a.stages] == names
    for s in a.stages:
        dump.to_text(s.program)


def test_prenorm_scale_leaves_gemm1_and_enters_gemm2():
    a = pipeline.analyze(str(ROOT / "samples" / "prenorm_mlp.epi"))
    before = a.after("dce")
    after = a.after("defer-row-scale")
    assert "reduce row mean" in kernel_text(before, 0)
    assert "n__rowscale" not in dump.to_text(before)
    assert "load n__rowscale" in kernel_text(after, 1)
    assert "store n__rowscale" in kernel_text(after, 0)


def test_e501_names_the_nearest_reduction_behind_the_culprit():
    """exp(s * row_max(h)) with s = h * rsqrt(row_mean(h * h) + eps): the first operand reaches
    row_mean two steps down, the second is row_max itself; the message names the nearer one and
    points a note at it (line 4, column 25)."""
    from epic.diagnostics import EpicError
    text = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  h = acc\n  s = h * rsqrt(row_mean(h * h) + 1e-6)\n"
            "  tmp n: bf16 = exp(s * row_max(h))\n}\ngemm g2(n @ w2: bf16[N, P]) {\n  out y: bf16 = acc\n}\n")
    with pytest.raises(EpicError) as info:
        analyze(text)
    d = info.value.diagnostics[0]
    assert d.code == "E501" and "'n' needs row_max (" in d.message and "through `exp`" in d.message
    (span, note), _ = d.notes
    assert note == "the row reduction is here" and (span.line, span.column) == (4, 25)


GEMM_XW = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"


def _consts(text: str) -> list:
    k = analyze(text).program.kernels[0]
    return [v for v in k.values if v.op == "const"]


def test_folding_is_float64_and_keeps_name_and_place():
    (c,) = [v for v in _consts(GEMM_XW + "  c = 0.1 + 0.2\n  out y: f32 = acc * c\n}\n")]
    assert c.attrs["value"] == 0.1 + 0.2                  # 0.30000000000000004: not f32's 0.3000000119
    assert c.name == "c" and (c.span.line, c.span.column) == (2, 7)


@pytest.mark.parametrize("expr, folded", [("2147483646 + 1", 2147483647), ("2147483647 + 1", None),
                                          ("-2147483647 - 1", None), ("0 - 2147483647", -2147483647)])
def test_integer_folding_stops_at_the_i32_range(expr, folded):
    values = [v.attrs["value"] for v in _consts(GEMM_XW + f"  out y: i32 = i32(acc) + ({expr})\n}}\n")]
    if folded is None:
        assert len(values) == 2, values                   # not folded: left to the kernel and the interpreter
    else:
        assert values == [folded]
