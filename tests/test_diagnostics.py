"""One failing program per diagnostic code, asserting the code and the exact line:column.

The expected location is written into the program itself: `$` marks where the caret must point
(it is removed before compiling), so the expectation does not come from the code under test.
"""
import pytest

from epic import diagnostics, sizes as sizes_mod
from epic.checks import layout
from epic.diagnostics import EpicError

from .conftest import analyze

GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"

CASES = {
    "E101": GEMM + "  out y: bf16 = acc $% 2\n}\n",
    "E102": GEMM + "  out y: bf16 = acc + $)\n}\n",
    "E103": GEMM + "  out y: bf16 = acc$\n",
    "E201": GEMM + "  out y: bf16 = acc + $bias\n}\n",
    "E202": GEMM + "  h = acc\n  $h = acc * 2\n  out y: bf16 = h\n}\n",
    "E203": GEMM + "  out y: bf16 = $exp(acc, acc)\n}\n",
    "E204": GEMM + "  out y: $bf17 = acc\n}\n",
    "E205": "gemm g(x: $f32[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n",
    "E206": GEMM + "  in gamma: bf16[N]\n  out y: f32[M] = $col_sum(gamma)\n}\n",
    "E207": GEMM + "  h = swiglu(acc)\n  out y: bf16 = $h + acc\n}\n",
    "E208": GEMM + "  in z: bf16[M, D]\n  out y: bf16 = acc + $z\n}\n",
    "E209": "gemm g(x: bf16[M, K] @ $w: bf16[J, N]) {\n  out y: bf16 = acc\n}\n",
    "E210": "def f(x) = $f(x) + 1\n" + GEMM + "  out y: bf16 = f(acc)\n}\n",
    "E211": GEMM + "  out y: bf16 = $gelu2(acc)\n}\n",
    "E212": GEMM + "  out y: bf16 = acc ** $1.5\n}\n",
    "E213": "$gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  h = acc\n}\n",
    "E214": "gemm g(x: bf16[M, K] @ w: bf16[K, M]) {\n  in v: f32[M]\n  out y: bf16 = acc + $v\n}\n",
    "E215": "gemm g(x: bf16[M, K] @ w: bf16[K, N]) with schedule=$fast {\n  out y: bf16 = acc\n}\n",
    "E216": "gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=64x128x64, schedule=$cooperative {\n  out y: bf16 = acc\n}\n",
    "E104": '$use "no_such_library.epi"\n' + GEMM + "  out y: bf16 = acc\n}\n",
    "E106": GEMM + "  out y: bf16 = select(0 < acc $< 1, acc, 0)\n}\n",
    "E105": GEMM + "  out y: bf16 = " + "-" * 5000 + "$acc\n}\n",
    "E301": GEMM + "  in gamma: bf16[N]\n  tmp n: bf16 = $rmsnorm(acc, gamma)\n}\n",
    "E302": GEMM + "  out y: bf16 = $acc - col_mean(acc)\n}\n",
    "E303": GEMM + "  out y: bf16 = $acc / all_max(acc)\n}\n",
    "E402": GEMM + "  out s: f32[M] = $row_sum(swiglu(acc))\n}\n",
    "E403": "gemm g($x: bf16[M, 12] @ w: bf16[12, N]) {\n  out y: bf16 = acc\n}\n",
    "E404": GEMM + "  s = $block_max(abs(acc), 48)\n  out q: e4m3 = acc / s\n}\n",
    "E405": "gemm g(x: bf16[M, K] @ w: bf16[K, 14]) {\n  $out q: i4 = even(acc)\n}\n",
    "E501": ("gemm a(x: bf16[M, D] @ w: bf16[D, D]) {\n  in g: bf16[D]\n  tmp n: bf16 = $silu(rmsnorm(acc, g))\n}\n"
             "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n"),
    # LayerNorm's deferred mean multiplies the next gemm's B as stored: a B read transposed cannot take it
    "E502": ("gemm o(x: bf16[M, D] @ wo: bf16[D, D]) {\n  in g: bf16[D]\n  in b: bf16[D]\n"
             "  tmp n: bf16 = layernorm(acc, g, b)\n}\nin wu: bf16[F, D]\n$gemm up(n @ wu.T) { out y: bf16 = acc }\n"),
}

# Codes whose location is checked elsewhere: E401 needs runtime sizes (below); E6xx are about tensors
# handed to a compiled program and point at the declaration (tests/test_runtime_args.py); E702 points
# at the value or store code generation refuses (tests/test_codegen.py).
ELSEWHERE = {"E401": "below", "E601": "test_runtime_args", "E602": "test_runtime_args",
             "E603": "test_runtime_args", "E604": "test_runtime_args", "E605": "test_runtime_args",
             "E606": "test_runtime_args", "E702": "test_codegen", "E901": "test_grad", "E902": "test_grad",
             "E903": "test_grad"}
# Codes that have no place in a program by nature (the command line, the machine, a bug in epic);
# each is raised in the named test file, which checks the message names what is wrong.
NO_LOCATION = {"E217": "test_cache (nvcc's stage-count failure)", "E599": "test_hardening (the IR verifier)",
               "E607": "test_cli", "E608": "test_fallback", "E609": "test_capture",
               "E610": "test_integrations", "E611": "test_given_outputs", "E701": "test_codegen", "E703": "test_codegen",
               "E704": "test_cache", "E705": "test_cache", "E706": "test_cache", "E707": "test_tuning", "E708": "test_fallback",
               "E801": "test_cli",
               "E802": "test_cli"}


def marked(program: str) -> tuple[str, int, int]:
    """Remove the `$` marker; return the text and the marker's 1-based line and column."""
    before, _, _ = program.partition("$")
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    return program.replace("$", "", 1), line, column


@pytest.mark.parametrize("code", sorted(CASES))
def test_code_and_location(code):
    text, line, column = marked(CASES[code])
    with pytest.raises(EpicError) as info:
        analyze(text)
    hits = [d for d in info.value.diagnostics if d.code == code]
    assert hits, f"expected {code}, got {info.value.codes}: {info.value}"
    d = hits[0]
    assert d.span is not None
    assert (d.span.line, d.span.column) == (line, column), str(info.value)
    rendered = d.render()
    assert rendered.startswith(f"t.epi:{line}:{column}: error[{code}]")
    assert "^" in rendered.splitlines()[2]   # caret line under the source line


def test_every_code_has_a_failing_program():
    assert set(diagnostics.CODES) - set(CASES) - set(ELSEWHERE) - set(NO_LOCATION) == set()
    assert not set(CASES) & set(ELSEWHERE) | set(CASES) & set(NO_LOCATION)


def test_odd_width_for_pairwise_map_at_given_sizes():
    text, line, column = marked(GEMM + "  out y: bf16 = $swiglu(acc)\n}\n")
    program = analyze(text).program
    diags = layout.check_sizes(program, {"M": 4, "K": 64, "N": 18})
    odd = [d for d in diags if d.code == "E401"]
    assert not odd   # 18 is even
    diags = layout.check_sizes(program, {"M": 4, "K": 64, "N": 17})
    odd = [d for d in diags if d.code == "E401"]
    assert odd and (odd[0].span.line, odd[0].span.column) == (line, column)
    assert "17" in odd[0].message


def test_sizes_errors_are_diagnostics():
    with pytest.raises(EpicError) as info:
        sizes_mod.parse_shape_arg("M=8192,D")
    assert info.value.codes == ["E607"]
    program = analyze(GEMM + "  out y: bf16 = acc\n}\n").program
    with pytest.raises(EpicError) as info:
        sizes_mod.check_complete(program, {"M": 1})
    assert "K" in str(info.value) and "N" in str(info.value)


def test_locality_message_names_value_reduction_and_way_out():
    text, _, _ = marked(CASES["E301"])
    with pytest.raises(EpicError) as info:
        analyze(text)
    msg = str(info.value)
    assert "'n' needs row_mean" in msg
    assert "all N columns" in msg
    assert "A operand of a later gemm" in msg


def test_defer_refusal_explains_nonlinearity():
    text, _, _ = marked(CASES["E501"])
    with pytest.raises(EpicError) as info:
        analyze(text)
    msg = str(info.value)
    assert "cannot move the row scale of 'n' into gemm 'b'" in msg
    assert "not a product" in msg and "multiplies the whole row" in msg


NORMALIZED = ("gemm a(x: bf16[M, D] @ w: bf16[D, D]) {\n  in g: bf16[D]\n  tmp n: bf16 = rmsnorm(acc, g)\n}\n"
              "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n")


def test_a_normalized_value_also_read_as_a_tile_is_finished_not_deferred():
    """A later epilogue loads 'n' as a tile, where a deferred row scale cannot follow: the row combine
    kernel finishes n (once), and both gemms read it as it is."""
    program = analyze(NORMALIZED + "gemm c(x @ w3: bf16[D, D]) {\n  out y2: bf16 = acc + n\n}\n").program
    combine = next(k for k in program.kernels if k.kind == "combine")
    assert [s.tensor for s in combine.stores] == ["n"]
    assert "n__rowscale" not in program.tensors


def test_a_returned_normalized_value_is_finished_by_the_combine_kernel():
    """`out n` (returned, so no scale may be deferred) is finished after the row is known, and the next
    gemm reads it as it is."""
    text = NORMALIZED.replace("tmp n", "out n")
    program = analyze(text).program
    combine = next(k for k in program.kernels if k.kind == "combine")
    assert [s.tensor for s in combine.stores] == ["n"]
    assert "n__rowscale" not in program.tensors


def test_per_column_statistic_cannot_be_deferred():
    prog = ("gemm a(x: bf16[M, D] @ w: bf16[D, D]) {\n  tmp n: bf16 = acc * col_max(acc)\n}\n"
            "gemm b(n @ w2: bf16[D, E]) {\n  out y: bf16 = acc\n}\n")
    with pytest.raises(EpicError) as info:
        analyze(prog)
    assert info.value.codes == ["E501"]
    assert "per-column statistic" in str(info.value)


def test_a_labels_vector_of_the_wrong_kind_is_refused_where_it_is_passed():
    """row_pick's label holds one column index per row: a row vector [V] is a mistake (issue 10)."""
    text, line, column = marked("gemm g(x: bf16[M, K] @ w: bf16[K, V]) {\n  in label: i32[V]\n"
                                "  out l: f32[M] = row_lse(acc) - row_pick(acc, $label)\n}\n")
    with pytest.raises(EpicError) as info:
        analyze(text)
    d = info.value.diagnostics[0]
    assert d.code == "E206" and (d.span.line, d.span.column) == (line, column)
    assert "must be a column vector" in d.message and "label: col" in str(info.value)


def test_a_gemm_that_uses_the_column_index_refuses_columns_past_float_exactness():
    """The epilogue's row / column index is a float (epic_nodes/coordinate.hpp), exact up to 2^24: past
    it, row_pick's col == label would match two columns. Only programs that use the index are bound."""
    pick = analyze(GEMM + "  in label: i32[M]\n  out y: f32[M] = row_pick(acc, label)\n}\n").program
    rows = analyze(GEMM + "  out y: f32 = acc * row\n}\n").program
    plain = analyze(GEMM + "  out y: bf16 = acc\n}\n").program
    limit = sizes_mod.INDEX_MAX
    sizes_mod.check_indexable(pick, {"M": 8, "K": 64, "N": limit})
    with pytest.raises(EpicError) as info:
        sizes_mod.check_indexable(pick, {"M": 8, "K": 64, "N": limit + 1})
    assert info.value.codes == ["E607"] and "column index as a float" in str(info.value)
    sizes_mod.check_indexable(pick, {"M": limit + 1, "K": 64, "N": 64})       # no row index: M is free
    with pytest.raises(EpicError, match="row index as a float"):
        sizes_mod.check_indexable(rows, {"M": limit + 1, "K": 64, "N": 64})
    sizes_mod.check_indexable(plain, {"M": limit + 1, "K": 64, "N": limit + 1})


@pytest.mark.parametrize("option, bad, listed", [
    ("tile", "96x128x64", "M in 64/128/256, N in 32/64/128/192/256"),
    ("tile", "128x48x64", "N in 32/64/128/192/256 (32 only for a gemm that stores its accumulator alone"),
    ("cluster", "4x1", "1x1, 2x1, 1x2 or 2x2"),
    ("swizzle", "16", "1, 2, 4, 8"),
    ("splits", "5", "1, 2, 3, 4, 6 or 8 (split-K, cooperative schedule only)"),
    ("b_major", "m", "b_major=n: the inline B operand [K, N] is row-major"),
])
def test_a_bad_kernel_option_value_is_refused_with_the_values_accepted(option, bad, listed):
    with pytest.raises(EpicError) as e:
        analyze(f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) with {option}={bad} {{\n  out y: bf16 = acc\n}}\n")
    (d,) = e.value.diagnostics
    assert d.code == "E215" and listed in d.message + " | " + (d.hint or ""), (d.message, d.hint)
