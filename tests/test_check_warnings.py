"""`epic check` warns about kernels that code generation will refuse (and still exits 0), naming the
user's values and pointing at the user's text, never at names the rewrites made up."""
from epic import pipeline
from epic.codegen import refusals as codegen_support
from epic_cli.main import main

from .conftest import ROOT

COL_LSE = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out c: f32[N] = col_lse(acc)\n  out y: bf16 = acc\n}\n"


def test_check_warns_that_col_lse_will_not_build(tmp_path, capsys):
    path = tmp_path / "lse.epi"
    path.write_text(COL_LSE)
    assert main(["check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{path}: ok")
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:2:19: warning[E702]: gemm 'g' will not build: storing 'c' ")
    assert "not supported by code generation yet" in first
    assert "col_lse(acc)" in err and "^~~~" in err        # the user's text, under a caret
    assert "__" not in err                                 # no internal buffer names (g__c_part0)
    assert err.count("warning[") == 1                      # the same refusal at both M is one warning


def test_check_of_samples_that_build_prints_no_warning(capsys):
    samples = sorted((ROOT / "samples").glob("*.epi"))      # every sample generates code (test_codegen)
    assert main(["check", *map(str, samples)]) == 0
    out, err = capsys.readouterr()
    assert out.count(": ok") == len(samples) and err == ""


def test_internal_names_map_to_user_values():
    program = pipeline.analyze(COL_LSE, name="t.epi").source_program
    assert codegen_support.user_name("g__c_part0", program) == "'c'"
    assert codegen_support.user_name("c__pre0", program) == "'c'"
    assert codegen_support.user_name("g__row_combine", program) == "the row combine kernel of gemm 'g'"
    assert codegen_support.user_name("g__col_lse_part1", program) == "the col lse of gemm 'g'"
    assert codegen_support.user_name("y", program) == "'y'"
