"""bench/first_result.py's bookkeeping, without a GPU: which call was the first fused one, the medians of
each path (the fused one after its first call, which binds), and the modes it refuses."""
import subprocess
import sys

from .conftest import ROOT, bench_module


def test_a_background_run_reports_its_switch_to_the_fused_kernels():
    fr = bench_module("first_result")
    calls = [(2.0, 0.5, False), (2.1, 0.004, False), (2.2, 0.002, False),     # unfused while nvcc runs
             (31.0, 0.300, True),                                             # binds the built kernels
             (31.1, 0.001, True), (31.2, 0.003, True), (31.3, 0.002, True)]
    got = fr.summarize(calls)
    assert got == {"calls": 7, "first_result_s": 2.0, "first_call_s": 0.5, "first_fused_result_s": 31.0,
                   "calls_before_fused": 3, "unfused_call_ms": 4.0, "fused_call_ms": 2.0}


def test_a_waiting_run_has_no_unfused_calls_and_a_run_that_never_switched_says_so():
    fr = bench_module("first_result")
    waited = fr.summarize([(40.0, 38.0, True), (40.1, 0.001, True), (40.2, 0.001, True)])
    assert (waited["first_fused_result_s"], waited["calls_before_fused"], waited["unfused_call_ms"]) == (40.0, 0, None)
    assert waited["fused_call_ms"] == 1.0
    never = fr.summarize([(3.0, 1.0, False), (3.5, 0.01, False)])
    assert (never["first_fused_result_s"], never["calls_before_fused"], never["fused_call_ms"]) == (None, 2, None)
    assert fr.summarize([]) == {"calls": 0}


def test_the_table_prints_a_failed_mode_by_its_error():
    fr = bench_module("first_result")
    text = fr.table([{"mode": "wait", "first_result_s": 40.0, "first_fused_result_s": 40.0, "calls_before_fused": 0,
                      "unfused_call_ms": None, "fused_call_ms": 1.0},
                     {"mode": "bundle", "error": ["E704 the kernel is not in the bundle"]}])
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["wait", "40.000", "s", "40.000"] and lines[1].split()[-2:] == ["1.000", "ms"]
    assert lines[2].startswith("bundle") and "E704 the kernel is not in the bundle" in lines[2]


def test_modes_that_need_the_wait_modes_cache_are_refused_without_it():
    for modes in ("cached", "bundle,background", "warm"):
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "first_result.py"), "--modes", modes],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "cached and bundle need wait" in r.stderr
