"""The `epic` command line: exit codes, output formats, and no tracebacks."""
import json
import subprocess
import sys

import pytest

from epic_cli.main import COMMANDS, main

from .conftest import ROOT, SAMPLES

PRENORM = str(ROOT / "samples" / "prenorm_mlp.epi")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_explains_each_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name, line in COMMANDS.items():
        assert f"{name:<8} {line}" in out


def test_check_all_samples_clean(capsys):
    code, out, err = run(capsys, "check", *map(str, SAMPLES))
    assert code == 0, err
    assert out.count(": ok") == len(SAMPLES)


def test_check_reports_diagnostics_with_exit_1(tmp_path, capsys):
    bad = tmp_path / "bad.epi"
    bad.write_text("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc + nope\n}\n")
    good = ROOT / "samples" / "swiglu.epi"
    code, out, err = run(capsys, "check", str(bad), str(good))
    assert code == 1
    assert f"{bad}:2:23: error[E201]: unknown name 'nope'" in err
    assert "Traceback" not in err
    assert "swiglu.epi: ok" in out


def test_missing_file(capsys):
    code, out, err = run(capsys, "check", "/nonexistent/x.epi")
    assert code == 2 and "cannot read" in err and "E802" in err


def test_ir_text_json_dot(capsys):
    code, out, _ = run(capsys, "ir", PRENORM)
    assert code == 0 and out.startswith("program ") and "kernel gate_up = gemm n[M, D] @ wgu[D, 2*F]" in out
    code, out, _ = run(capsys, "ir", PRENORM, "--json")
    data = json.loads(out)
    assert [k["name"] for k in data["kernels"]] == ["o_proj", "gate_up", "down"]
    assert {"id", "op", "args", "dtype", "kind", "loc"} <= set(data["kernels"][0]["values"][0])
    code, out, _ = run(capsys, "ir", PRENORM, "--dot")
    assert out.startswith("digraph epic {") and out.rstrip().endswith("}")
    assert "cluster_" in out


def test_ir_after_all_shows_scale_moving(capsys):
    code, out, _ = run(capsys, "ir", PRENORM, "--after-all")
    assert code == 0
    stages = out.split("// ---- after ")
    names = [s.split("\n", 1)[0] for s in stages[1:]]
    assert names == ["front end", "simplify", "cse", "dce", "defer-row-scale", "split-reductions",
                     "hoist-block-scale", "block-quant", "cleanup"]
    before = stages[names.index("dce") + 1]
    after = stages[names.index("defer-row-scale") + 1]
    gemm1_before = before.split("kernel o_proj")[1].split("kernel gate_up")[0]
    gemm2_after = after.split("kernel gate_up")[1].split("kernel down")[0]
    assert "reduce row mean" in gemm1_before and "n__rowscale" not in before
    assert "load n__rowscale" in gemm2_after and "mul %0, %1" in gemm2_after


def test_ir_after_one_pass_and_bad_pass(capsys):
    code, out, _ = run(capsys, "ir", PRENORM, "--after", "split-reductions")
    assert code == 0 and "kernel o_proj__row_combine = combine" in out
    code, _, err = run(capsys, "ir", PRENORM, "--after", "nope")
    assert code == 2 and "E801" in err and "defer-row-scale" in err
    code, out, _ = run(capsys, "ir", PRENORM, "--list-passes")
    assert code == 0 and out.splitlines()[0].startswith("simplify")


def test_ir_list_passes_needs_no_file(capsys):
    code, out, _ = run(capsys, "ir", "--list-passes")
    assert code == 0 and [l.split()[0] for l in out.splitlines()][:2] == ["simplify", "cse"]
    code, _, err = run(capsys, "ir")
    assert code == 2 and "E801" in err and "needs a FILE" in err


def test_rules_say_what_each_pass_changed(capsys):
    """A pass without a rule trace of its own still says what it changed; "(no change)" only where
    the program is the same."""
    code, out, _ = run(capsys, "ir", PRENORM, "--after-all", "--rules")
    assert code == 0 and "(nothing fired)" not in out
    said = {}
    for line in out.splitlines():
        if line.startswith("// ") and not line.startswith("// ---- "):
            name, what = line[3:].split(": ", 1)
            said.setdefault(name, []).append(what)
    assert said["defer-row-scale"] == ["tensors added: n__rowscale", "o_proj: 11 -> 10 values (removed mul)",
                                       "gate_up: 6 -> 8 values (added load, mul)"]
    assert "kernel o_proj__row_combine added (combine, 4 values)" in said["split-reductions"]
    assert said["simplify"] == said["cse"] == said["dce"] == said["cleanup"] == ["(no change)"]
    code, out, _ = run(capsys, "ir", PRENORM, "--after", "defer-row-scale", "--rules")
    assert [l for l in out.splitlines() if l.startswith("// ")] == [f"// defer-row-scale: {w}"
                                                                   for w in said["defer-row-scale"]]


def test_ref_prints_outputs(capsys):
    code, out, _ = run(capsys, "ref", str(ROOT / "samples" / "cross_entropy.epi"), "--shape", "M=8,D=64,V=128")
    assert code == 0
    assert "loss" in out and "lse_out" in out and "[8]" in out


def test_ref_compare_rewrite(capsys):
    code, out, _ = run(capsys, "ref", PRENORM, "--shape", "M=16,D=64,F=32", "--compare-rewrite")
    assert code == 0
    rows = [l.split() for l in out.splitlines() if l.strip().startswith(("resid ", "y "))]
    exact_errors = [float(r[1]) for r in rows if len(r) == 4]
    assert len(exact_errors) == 2 and max(exact_errors) <= 1e-12
    lines = out.splitlines()
    head = lines.index("rewritten plan vs source program (relative error, ||got - want|| / ||want||):")
    assert lines[head + 1].split() == ["output", "exact", "f64", "source,", "dtype-rounded", "rewritten,",
                                       "dtype-rounded"]


def test_ref_bad_shapes(capsys):
    code, _, err = run(capsys, "ref", PRENORM, "--shape", "M=16,D=64")
    assert code == 2 and "E607" in err and "F" in err
    code, _, err = run(capsys, "ref", PRENORM, "--shape", "M=16,D=60,F=32")
    assert code == 1 and "E403" in err


def test_plan_prints_kernels_and_ledger(capsys):
    code, out, _ = run(capsys, "plan", PRENORM, "--shape", "M=8192,D=4096,F=14336")
    assert code == 0
    for needle in ("1. o_proj: gemm attn @ wo", "2. o_proj__row_combine: combine", "3. gate_up: gemm n @ wgu",
                   "epilogue multiplies acc by n__rowscale[row]", "4. down: gemm a @ wd", "fused / op by op"):
        assert needle in out, needle


def test_internal_errors_are_reported_without_traceback(monkeypatch, capsys):
    from epic import pipeline

    def boom(*a, **k):
        raise ZeroDivisionError("simulated")
    monkeypatch.setattr(pipeline, "analyze", boom)
    code, _, err = run(capsys, "check", PRENORM)
    assert code == 3
    assert "internal error: ZeroDivisionError: simulated" in err and "bug in epic" in err
    assert "Traceback" not in err


def test_console_entry_point_runs_as_a_process():
    r = subprocess.run([sys.executable, "-m", "epic_cli.main", "check", PRENORM], capture_output=True, text=True)
    assert r.returncode == 0 and "ok" in r.stdout
