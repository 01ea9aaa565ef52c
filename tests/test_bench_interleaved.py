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


def test_a_configuration_is_compared_with_the_default_before_it_is_timed():
    """agreement(): bitwise where every output has the default's bytes (a tile order, a trace build);
    else the largest difference relative to the default output's size, and where; a missing or
    reshaped output is named."""
    import torch
    interleaved = bench_module("interleaved")
    y = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.bfloat16)
    want = {"y": y, "r": torch.tensor([0.25, 4.0])}
    assert interleaved.agreement(want, {k: v.clone() for k, v in want.items()}) == "equal bit for bit"
    off = {"y": y.clone(), "r": torch.tensor([0.25, 4.5])}
    said = interleaved.agreement(want, off)
    rms = (0.25 ** 2 / 2 + 16 / 2) ** 0.5
    assert said == f"differs: max |difference| {0.5 / rms:.2e} x rms in r"
    signed_zero = {"y": y.clone(), "r": torch.tensor([0.25, 4.0])}
    signed_zero["y"][0] = 0.0
    want_zero = {"y": signed_zero["y"].clone(), "r": want["r"]}
    signed_zero["y"][0] = -0.0                   # the same value in other bits: not bit for bit
    assert interleaved.agreement(want_zero, signed_zero) == "differs: max |difference| 0.00e+00 x rms in y"
    assert interleaved.agreement(want, {"y": y}) == "output r missing or of another shape/dtype"
    assert interleaved.agreement(want, {"y": y, "r": want["r"].double()}).startswith("output r missing")
    nan = {"y": y.clone(), "r": torch.tensor([float("nan"), 4.0])}
    assert interleaved.agreement(want, nan).endswith("x rms in r") and "inf" in interleaved.agreement(want, nan)
    assert interleaved.outputs({"y": y})["y"] is not y and interleaved.outputs(None) == {}
