"""bench/readme_table.py prints a results file as the README's table: medians to three places, rows in
the README's order, the fastest candidate of a row and size in bold, a missing one left blank."""
import json

from .conftest import bench_module


def _r(work, m, **medians):
    return {"work": work, "M": m, "ratios": {c: {"median": v, "q1": v, "q3": v} for c, v in medians.items()}}


def test_one_candidate_gives_one_column_per_size_in_the_readmes_order():
    rt = bench_module("readme_table")
    results = [_r("resid_norm", 8192, default=1.0194, **{"cublas-again": 0.999}),
               _r("xent", 8192, default=0.9666, **{"cublas-again": 1.001}),
               _r("xent", 64, default=0.9755, **{"cublas-again": 0.993})]
    assert rt.table(results) == (
        "| workload | M = 8192 | M = 64 |\n"
        "|---|---|---|\n"
        "| LM head + cross entropy, no logits (V = 128256) | 0.967 | 0.976 |\n"
        "| residual + RMSNorm pieces | 1.019 |  |")
    assert rt.control_range(results) == "the control 0.993-1.001"


def test_peers_the_fastest_in_bold_and_unknown_workloads_by_name():
    rt = bench_module("readme_table")
    results = [_r("bias_gelu", 8192, epic=0.978, quack=0.967, cublaslt=1.069),
               _r("plain_down", 8192, epic=1.004, quack=1.010)]
    assert rt.table(results, ["epic", "quack", "cublaslt"]) == (
        "| workload | M = 8192: epic | M = 8192: quack | M = 8192: cublaslt |\n"
        "|---|---|---|---|\n"
        "| bias + GELU | 0.978 | **0.967** | 1.069 |\n"
        "| plain_down | **1.004** | 1.010 |  |")


def test_a_file_that_is_not_a_results_file_is_an_error_not_a_traceback(tmp_path, capsys):
    rt = bench_module("readme_table")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": []}))
    assert rt.main([str(bad)]) == 2
    assert "not a results file" in capsys.readouterr().err
