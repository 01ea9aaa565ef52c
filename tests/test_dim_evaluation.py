"""A symbolic dimension gets a value in one place, epic/sizes.py: exact (a Fraction) for the layout
checks, a whole number or E607 for everything else, and the same in integer-only arithmetic for
torch SymInts."""
import ast
from fractions import Fraction

import pytest

from epic import pipeline, sizes as sizes_mod
from epic.diagnostics import EpicError
from epic.plan import planner
from epic.shapes import Dim

from .conftest import ROOT

N, D, F, H = Dim.of("N"), Dim.of("D"), Dim.of("F"), Dim.of("H")
EVALUATORS = {"exact", "evaluate", "evaluate_integer"}


def test_dims_have_no_evaluator_of_their_own():
    """A second evaluator with its own rule for fractions is how the two drifted apart."""
    assert not hasattr(Dim, "evaluate")
    calls = []
    for path in sorted([*(ROOT / "epic").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        if path == ROOT / "epic" / "sizes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            f = node.func if isinstance(node, ast.Call) else None
            if isinstance(f, ast.Attribute) and f.attr in EVALUATORS and not (
                    isinstance(f.value, ast.Name) and f.value.id == "sizes_mod"):
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not calls, f"dimensions evaluated outside epic/sizes.py: {calls}"


def test_a_fractional_value_is_exact_or_E607():
    sizes = {"N": 200}
    assert sizes_mod.exact(N / 128, sizes) == Fraction(25, 16)
    with pytest.raises(EpicError) as info:
        sizes_mod.evaluate(N / 128, sizes)
    assert info.value.codes == ["E607"] and "dimension N/128 = 25/16 is not a whole number" in str(info.value)


@pytest.mark.parametrize("dim", [D, F * 2, N / 2, D * H, Dim.const(7), N * N / 4, D * H / 64])
def test_the_integer_evaluator_agrees(dim):
    sizes = {"N": 256, "D": 128, "F": 48, "H": 8}
    whole = sizes_mod.evaluate(dim, sizes)
    assert type(whole) is int and whole == sizes_mod.exact(dim, sizes)
    assert sizes_mod.evaluate_integer(dim, sizes) == whole


def test_the_users_sizes_that_split_a_block_are_E404_at_the_declaration():
    """N/128 blocks with N = 208 (16-byte rows, so only the block rule breaks): the layout check's
    own code and span, with the exact value, before any whole-number evaluation."""
    program = pipeline.analyze(str(ROOT / "samples" / "fp8_block_quant.epi"), path=True).program
    with pytest.raises(EpicError) as info:
        planner.make_plan(program, {"M": 64, "D": 64, "N": 208})
    (d,) = info.value.diagnostics
    assert d.code == "E404" and d.span.line == 6 and "= N/128 (it is 13/8) must be a whole number" in d.message
