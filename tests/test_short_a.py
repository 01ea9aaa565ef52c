"""a_rows: the mainloop's loads of A read a box of 8, 16 or 32 rows, not the tile's
(templates/nodes/epic_nodes/short_a_mainloop.hpp). The plan's choice at each row count, its name, the
line of the default kernel it changes, the file option and its refusals; the nvcc build is in
test_codegen.py, the GPU comparison with the tile's rows in test_gpu.py."""
import difflib

import pytest

from epic import pipeline
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config as plan_config, kernel_config
from epic.tuning import space

from .conftest import ROOT, diagnose, planned_plain

PLAIN = ROOT / "bench" / "programs" / "plain.epi"


def _units(m: int, options: dict | None = None):
    prog = pipeline.analyze(str(PLAIN)).program
    sizes = dict(M=m, K=4096, N=4096)
    [(spec, unit)] = emit.units(prog, emit.kernel_configs(prog, m, {"plain": options} if options else None, sizes))
    return spec, unit


@pytest.mark.parametrize("m, rows", [(1, 8), (7, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32), (33, 0),
                                     (64, 0), (8192, 0)])
def test_the_plan_takes_the_fewest_rows_that_hold_the_call(m, rows):
    spec, unit = _units(m)
    assert spec.config.a_rows == rows
    assert unit.name.endswith(f"_a{rows}") == bool(rows)
    assert ("epic_mainloop::ShortA<" in unit.source) == bool(rows)


def test_a_short_box_changes_only_the_mainloop_line():
    _, base = _units(1, {"a_rows": 0})
    spec, short = _units(1)
    assert short.name == base.name + "_a8" and str(spec.config).endswith(" a_rows=8")
    assert "ShortA" not in base.source
    assert short.source.count("struct ShortA : Mainloop") == 1
    assert short.source.index("struct ShortA") < short.source.index("namespace epic_kernel {")
    removed = [d[2:] for d in difflib.ndiff(base.source.splitlines(), short.source.splitlines()) if d[:2] == "- "]
    assert len(removed) == 3, removed
    assert removed[0].startswith("// ") and "ping_64x32x128_c1x2" in removed[0]
    assert removed[1].startswith("using CollectiveMainloop = epic_mainloop::L2PrefetchMainloop<")
    assert removed[2].startswith('  return "{\\"abi\\":1,')
    assert ("using CollectiveMainloop = epic_mainloop::ShortA<epic_mainloop::L2PrefetchMainloop<BuiltMainloop, "
            "32, 128>, 8, true>;") in short.source.splitlines()
    # the stage expects the box's bytes and B's, and a larger M is refused before the launch
    assert "p.tma_transaction_bytes = kBoxBytes + p.tma_transaction_bytes_nk;" in short.source
    assert "int(cute::get<0>(mnkl)) <= Rows" in short.source


def test_a_short_box_without_a_cache_policy_and_inside_the_trace():
    _, unit = _units(8, {"load_hint": "none", "trace": "tiles"})
    assert unit.name.endswith("_tiles_nohint_a8") and "UnhintedLoads" not in unit.source
    assert ("using CollectiveMainloop = epic_trace::TracedMainloop<epic_mainloop::ShortA<"
            "epic_mainloop::L2PrefetchMainloop<BuiltMainloop, 32, 128>, 8, false>>;") in unit.source.splitlines()


def test_a_rows_in_the_file_round_trips_through_tuning():
    _, cfg = planned_plain("a_rows=16", dict(M=3, K=256, N=256))
    assert cfg.a_rows == 16 and cfg.key().endswith("_a16")
    assert space.override(cfg)["a_rows"] == 16
    assert planned_plain("a_rows=16", dict(M=3, K=256, N=256), {"g": space.override(cfg)})[1] == cfg
    # a_rows=0 keeps the tile's rows where the plan would take fewer
    assert planned_plain("a_rows=0", dict(M=3, K=256, N=256))[1].a_rows == 0


def test_a_call_with_more_rows_than_the_box_is_refused_at_plan_time():
    with pytest.raises(EpicError) as info:
        planned_plain("a_rows=16", dict(M=17, K=256, N=256))
    assert info.value.codes == ["E216"]
    assert "a_rows=16 reads 16 rows of A per tile, and this call has 17 rows" in str(info.value)
    assert "give a_rows at least 17" in str(info.value)


def test_split_k_keeps_the_tiles_rows():
    with pytest.raises(EpicError) as info:
        planned_plain("a_rows=8, splits=2", dict(M=1, K=256, N=256))
    assert info.value.codes == ["E216"] and "the split-K kernel (splits=2) keeps CUTLASS's" in str(info.value)
    # split-K chosen by the call: the plan's own a_rows is not taken
    assert planned_plain("tile=128x64x64", dict(M=1, K=256, N=256), {"g": {"splits": 2}})[1].a_rows == 0


@pytest.mark.parametrize("options, message", [
    ("a_rows=8, schedule=cooperative", "a_rows=8 runs on the pingpong schedule's 64-row tiles (the form checked on "
                                       "a GPU), not on cooperative 128-row tiles"),
    ("a_rows=16, tile=128x64x64, schedule=pingpong", "not on pingpong 128-row tiles"),
    ("a_rows=8, cluster=2x1", "a_rows=8 runs with clusters 1x1 and 1x2"),
])
def test_the_short_box_runs_on_the_forms_checked_on_a_gpu(options, message):
    with pytest.raises(EpicError) as info:
        planned_plain(options, dict(M=1, K=256, N=256))
    assert info.value.codes == ["E216"] and message in str(info.value)
    # the plan's own choice leaves those forms the tile's rows
    assert planned_plain(options.split(", ", 1)[1], dict(M=1, K=256, N=256))[1].a_rows == 0


def test_a_rows_needs_a_k_major_a():
    text = ("gemm first(x: bf16[M, K] @ w: bf16[K, N]) {\n  out h: bf16 = acc\n}\n"
            "gemm second(h.T @ v: bf16[M, P]) with a_rows=8 {\n  out y: f32 = acc\n}\n")
    prog = pipeline.analyze(text).program
    with pytest.raises(EpicError) as info:
        emit.kernel_configs(prog, 4, None, dict(M=4, K=64, N=8, P=64))
    assert info.value.codes == ["E216"] and "this gemm's A is M-major" in str(info.value)
    # without the option the plan keeps the tile's rows for that gemm, and takes the box for the first
    configs = emit.kernel_configs(pipeline.analyze(text.replace(" with a_rows=8", "")).program, 4, None,
                                  dict(M=4, K=64, N=8, P=64))
    assert configs["first"].a_rows == 8 and configs["second"].a_rows == 0


def test_an_unknown_row_count_is_refused_in_the_file_and_the_plan():
    error = diagnose("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with a_rows=12 {\n  out y: bf16 = acc\n}\n")
    assert error.codes == ["E215"] and "a_rows must be one of 0, 8, 16, 32, got '12'" in str(error)
    assert kernel_config.problems(plan_config.KernelConfig("pingpong", (64, 64, 64), a_rows=12)) == [
        "a_rows must be 0, 8, 16 or 32"]
