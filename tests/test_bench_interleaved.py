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


def test_nodes_from_generates_with_another_directorys_node_headers(tmp_path):
    """bench.py's nodes_from (the `nodes` candidate's A/B): kernels generated inside it print the node
    headers of the directory given, their own source (so their own library); outside it, the
    package's again; a directory without epic_nodes/ is refused."""
    import shutil
    from epic.codegen import emit
    bench = bench_module("bench")
    prog = epic.compile(str(ROOT / "samples" / "cross_entropy.epi"))

    def sources():
        configs = emit.kernel_configs(prog.program, 8192, None, dict(M=8192, D=4096, V=128256))
        return {u.name: u.source for _, u in emit.units(prog.program, configs)}

    mine = sources()
    shutil.copytree(ROOT / "templates" / "nodes" / "epic_nodes", tmp_path / "epic_nodes")
    with bench.nodes_from(str(tmp_path)):
        assert sources() == mine                     # the same headers: the same sources
    arith = tmp_path / "epic_nodes" / "arith.hpp"
    arith.write_text(arith.read_text().replace("lse_pivot(float max) {", "lse_pivot(float max) {  // other"))
    with bench.nodes_from(str(tmp_path)):
        other = sources()
    gemm = next(name for name in mine if "combine" not in name)
    assert "lse_pivot(float max) {  // other" in other[gemm] and other[gemm] != mine[gemm]
    assert sources() == mine                         # restored
    with pytest.raises(SystemExit, match="no epic_nodes/"):
        with bench.nodes_from(str(tmp_path / "epic_nodes")):
            pass


def test_combine_rows_sets_the_grouped_combines_rows_per_warp():
    """bench.py's combine_rows (the rowsR candidates): inside it the combine kernel groups from the
    first row with R rows per warp, the gemm is untouched; outside it, as generated; R must divide 32."""
    from epic.codegen import emit
    bench = bench_module("bench")
    assert [bench.combine_rows_label(label) for label in ("rows8", "rows1", "rows4x16", "default", "rows", "nodes",
                                                          "rows4x")] == [(8, None), (1, None), (4, 16), None, None, None, None]
    prog = epic.compile(str(ROOT / "samples" / "cross_entropy.epi"))

    def sources():
        configs = emit.kernel_configs(prog.program, 8192, None, dict(M=8192, D=4096, V=128256))
        return {u.name: u.source for _, u in emit.units(prog.program, configs)}

    mine = sources()
    combine = next(name for name in mine if "combine" in name)
    assert "constexpr int kRowsPerWarp = 2;" in mine[combine] and "kGroupFrom = 0;" not in mine[combine]
    with bench.combine_rows(8):
        other = sources()
    assert "constexpr int kRowsPerWarp = 8;" in other[combine] and "constexpr int kGroupFrom = 0;" in other[combine]
    assert {n: s for n, s in other.items() if n != combine} == {n: s for n, s in mine.items() if n != combine}
    assert "constexpr int kInFlight = 16;" in other[combine]
    with bench.combine_rows(4, 8):
        shallower = sources()
    assert "constexpr int kInFlight = 8;" in shallower[combine] and "constexpr int kRowsPerWarp = 4;" in shallower[combine]
    assert sources() == mine                         # restored
    # the row combine of every_primitive.epi merges 4 reductions: one tile loop by default, 4 unfused
    every = epic.compile(str(ROOT / "tests" / "programs" / "every_primitive.epi")).program

    def row_combine():
        configs = emit.kernel_configs(every, 8192, None, None)
        return next(u.source for _, u in emit.units(every, configs) if u.name.endswith("__row_combine"))
    assert row_combine().count("for (int t0 = tile_lane;") == 1
    with bench.combine_variant("unfused"):
        assert row_combine().count("for (int t0 = tile_lane;") == 4
    # cross entropy's label logit: read from the label's tile by default, merged from every tile unpicked
    assert "/ P.tile_n *" in mine[combine] and mine[combine].count("for (int t0 = tile_lane;") == 1
    with bench.combine_variant("unpicked"):
        prog = epic.compile(str(ROOT / "samples" / "cross_entropy.epi"))
        unpicked = sources()
    assert "/ P.tile_n *" not in unpicked[combine] and unpicked[combine].count("for (int t0 = tile_lane;") == 1
    assert unpicked[combine].count("part_") > mine[combine].count("part_")
    with bench.combine_variant("unpicked"), bench.combine_variant("unfused"):
        prog = epic.compile(str(ROOT / "samples" / "cross_entropy.epi"))
        assert sources()[combine].count("for (int t0 = tile_lane;") == 2
    with pytest.raises(SystemExit, match="must divide 32"):
        with bench.combine_rows(3):
            pass


def test_variant_lists_take_known_labels_and_name_unknown_ones():
    """bench.variant_list, the type of prebuild.py's --combine-variants and sustained.py's --variants."""
    import argparse
    bench = bench_module("bench")
    assert bench.variant_list("unfused,,unpicked") == ["unfused", "unpicked"] and bench.variant_list("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="unknown bogus, zzz"):
        bench.variant_list("zzz,unpicked,bogus")


def test_a_candidate_whose_rounds_spread_wide_is_named():
    """The H100's default tile at N = 4096 ran at about 0.99 or about 1.15 of cuBLAS: quartiles
    [0.985-1.142] around a median of 1.065. Such a candidate gets a line saying its median depends on
    the run; one as steady as cuBLAS against itself does not."""
    interleaved = bench_module("interleaved")
    ratios = {"cublas-again": {"median": 0.999, "q1": 0.997, "q3": 1.001},
              "default": {"median": 1.065, "q1": 0.985, "q3": 1.142},
              "coop_128x256x64_c2x1": {"median": 1.014, "q1": 1.012, "q3": 1.017}}
    notes = interleaved.spread_notes(ratios)
    assert len(notes) == 1 and notes[0].startswith("  default: its rounds' middle half spans 15% of its median")
    assert "[0.985-1.142]" in notes[0]
    # just inside and just outside the limit
    edge = {"a": {"median": 1.0, "q1": 0.98, "q3": 1.0199}, "b": {"median": 1.0, "q1": 0.98, "q3": 1.0201}}
    assert [n.split(":")[0].strip() for n in interleaved.spread_notes(edge)] == ["b"]


def test_each_configuration_is_compared_again_after_the_timed_rounds():
    """recheck(): one more call per configuration, compared with the default's first outputs (a kernel
    that is right on its first launch only, or a replay that writes nothing, shows here)."""
    import torch
    interleaved = bench_module("interleaved")
    want = {"y": torch.tensor([1.0, 2.0])}
    checks = [("same", lambda: {"y": torch.tensor([1.0, 2.0])}, want),
              ("unwritten", lambda: {"y": torch.tensor([1.0, float("nan")])}, want)]
    said = interleaved.recheck(checks)
    assert said["same"] == "equal bit for bit"
    assert said["unwritten"].startswith("differs") and "inf" in said["unwritten"]
    assert interleaved.recheck([]) == {}

