"""bench/interleaved.py's `tuned` candidate on the CPU: it tunes the work's program at the sizes its
inputs give, into a database of its own, and times the winners (the H200 runs the tuner for real)."""

import pytest

import epic
from epic import reference

from .conftest import ROOT, bench_module


def test_the_tuned_candidate_tunes_at_the_inputs_sizes_into_its_own_database(monkeypatch, tmp_path):
    interleaved = bench_module("interleaved")
    from epic.tuning import tuner
    seen = {}

    def fake_tune(path, sizes, database_file=None, report=None, **kw):
        seen.update(path=path, sizes=sizes, db=database_file)
        return tuner.Result("key", {"up": {"tile": (128, 128, 64)}}, 1.0, 1.0)

    monkeypatch.setattr(tuner, "tune", fake_tune)
    monkeypatch.setenv("EPIC_TUNING", str(tmp_path / "mine.json"))
    prog = epic.compile(str(ROOT / "samples" / "bias_gelu.epi"))
    inputs = reference.random_inputs(prog.program, dict(M=64, K=128, N=256), 0)
    config = interleaved.tuned_config(prog, "samples/bias_gelu.epi", inputs)
    assert config == {"up": {"tile": (128, 128, 64)}}
    assert seen["sizes"] == dict(M=64, K=128, N=256)
    assert seen["path"].endswith("samples/bias_gelu.epi")
    assert seen["db"] is not None and str(seen["db"]) != str(tmp_path / "mine.json")
