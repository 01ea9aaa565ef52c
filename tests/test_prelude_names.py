"""The prelude and the built-ins share one namespace of function names, and a call resolves to a def
first: a prelude def named like a primitive would silently replace it. That is epic's bug (E599,
exit 3) at load time; a user's def of a built-in name is refused (E202), of a prelude name wins."""
import contextlib
import io
import re

import pytest
import torch

from epic import dtypes, reference
from epic.diagnostics import EpicError
from epic.frontend import lower
from epic.frontend.lower import load_program
from epic.ir import primitives as P
from epic_cli.main import main

from .conftest import ROOT

PROGRAM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: f32 = {expr}\n}\n"


def program(expr: str, defs: str = "") -> str:
    return defs + PROGRAM.replace("{expr}", expr)


@pytest.fixture
def prelude(monkeypatch):
    """Replace the prelude's text: returns a function that appends lines to the real one."""
    real = lower._prelude_text()

    def with_lines(lines: str) -> None:
        monkeypatch.setattr(lower, "_prelude_text", lambda: real + lines)
        lower._prelude.cache_clear()
    yield with_lines
    monkeypatch.undo()
    lower._prelude.cache_clear()


def test_no_prelude_def_shares_a_name_with_a_primitive_record_or_keyword():
    defs = re.findall(r"^def\s+(\w+)", (ROOT / "epic" / "prelude.epi").read_text(), re.M)
    records = set(P.PRIMITIVES) | {s for p in P.PRIMITIVES.values() for s in p.surface}
    taken = records | set(P.CALLS) | set(P.KEYWORDS) | P.RESERVED | set(dtypes.ALL)
    assert defs and not set(defs) & taken, set(defs) & taken
    assert len(defs) == len(set(defs)), "a prelude def is written twice"


@pytest.mark.parametrize("line, words", [
    ("def exp(x) = x", "defines 'exp', a built-in name"),            # a primitive
    ("def row_sum(x) = x", "defines 'row_sum', a built-in name"),    # a reduction function
    ("def bf16(x) = x", "defines 'bf16', a built-in name"),          # a dtype (the cast)
    ("def relu(x) = x", "defines 'relu' twice"),
    ('use "lib.epi"', "holds something other than a def"),
])
def test_a_prelude_def_named_like_a_built_in_fails_loudly(prelude, tmp_path, line, words):
    prelude("\n" + line + "\n")
    with pytest.raises(EpicError) as info:
        load_program(program("exp(acc)"))
    assert info.value.codes == ["E599"] and info.value.exit_status == 3, str(info.value)
    assert words in str(info.value) and "<prelude>" in str(info.value)
    path = tmp_path / "p.epi"
    path.write_text(program("acc"))
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["check", str(path)]) == 3
    assert "E599" in err.getvalue() and "Traceback" not in err.getvalue()


def test_a_prelude_def_under_a_new_name_still_loads(prelude):
    prelude("\ndef twice(x) = 2 * x\n")
    assert load_program(program("twice(acc)")).kernels


@pytest.mark.parametrize("name", ["exp", "row_sum", "block_max", "bf16", "row", "acc", "gemm"])
def test_a_users_def_of_a_built_in_name_is_E202(name):
    with pytest.raises(EpicError) as info:
        load_program(program("acc", f"def {name}(x) = x\n"))
    assert info.value.codes == ["E202"] and f"'{name}' is a built-in name" in str(info.value)


def test_a_users_def_of_a_prelude_name_wins():
    text = program("relu(acc)", "def relu(x) = 2 * x\n")
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    got = reference.run(load_program(text), {"x": x, "w": w})["y"]
    want = 2 * (x.double() @ w.double())
    assert torch.allclose(got, want, rtol=1e-12, atol=0) and (got < 0).any()
