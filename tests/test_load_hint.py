"""load_hint=none: the mainloop's TMA loads without CUTLASS's EVICT_NORMAL cache policy
(templates/nodes/epic_nodes/unhinted_loads_mainloop.hpp). Its plan, its name, the one line of the
default kernel it changes (the default kernel's text unchanged), the file option and its refusals; the
nvcc build is in test_codegen.py, the GPU comparison with the default kernel in test_gpu.py."""
import difflib

import pytest

from epic import pipeline
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config as plan_config, kernel_config
from epic.tuning import space

from .conftest import ROOT, diagnose, planned_plain

PLAIN = ROOT / "bench" / "programs" / "plain.epi"
SIZES = dict(M=8192, K=4096, N=28672)
WRAPPED = ("using CollectiveMainloop = epic_mainloop::UnhintedLoads<epic_mainloop::L2PrefetchMainloop<BuiltMainloop, "
           "192, 64>>;")


def _units(options: dict | None):
    prog = pipeline.analyze(str(PLAIN)).program
    [(spec, unit)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": options} if options else None, SIZES))
    return spec, unit


def test_no_hint_names_its_kernel_and_wraps_only_the_mainloop():
    _, base = _units(None)
    spec, unhinted = _units({"load_hint": "none"})
    assert unhinted.name == base.name + "_nohint" and str(spec.config).endswith(" load_hint=none")
    assert "UnhintedLoads" not in base.source
    assert unhinted.source.count("struct UnhintedLoads : Mainloop") == 1
    assert unhinted.source.index("struct UnhintedLoads") < unhinted.source.index("namespace epic_kernel {")
    # the loads' policy is the constant 0 (ptxas then emits UTMALDG ... desc[URZ]), on A's and B's copies
    assert "static_cast<TMA::CacheHintSm90>(0)" in unhinted.source
    assert unhinted.source.count(".with(*full, mask_a, kNoPolicy)") == 1
    assert unhinted.source.count(".with(*full, mask_b, kNoPolicy)") == 1
    # of the default kernel's lines, only the mainloop's, the configuration's comment and the library's
    # description of itself change
    removed = [d[2:] for d in difflib.ndiff(base.source.splitlines(), unhinted.source.splitlines()) if d[:2] == "- "]
    assert len(removed) == 3, removed
    assert removed[0].startswith("// ") and "ping_128x192x64_c2x1" in removed[0]
    assert removed[1].startswith("using CollectiveMainloop = epic_mainloop::L2PrefetchMainloop<")
    assert removed[2].startswith('  return "{\\"abi\\":1,')
    assert WRAPPED in unhinted.source.splitlines()


def test_no_hint_goes_inside_the_trace_and_beside_serpentine():
    spec, unit = _units({"load_hint": "none", "trace": "tiles", "tile_order": "serpentine"})
    assert unit.name.endswith("_tiles_serp_nohint")
    assert ("using CollectiveMainloop = epic_trace::TracedMainloop<epic_mainloop::UnhintedLoads<"
            "epic_mainloop::L2PrefetchMainloop<BuiltMainloop, 192, 64>>>;") in unit.source.splitlines()
    assert "epic_scheduler::SerpentinePersistentScheduler>;" in [x.strip() for x in unit.source.splitlines()]


def test_no_hint_in_the_file_round_trips_through_tuning_and_is_refused_with_split_k():
    _, cfg = planned_plain("load_hint=none", SIZES)
    assert cfg.load_hint == "none" and cfg.key().endswith("_nohint")
    assert space.override(cfg)["load_hint"] == "none"
    assert planned_plain("load_hint=none", SIZES, {"g": space.override(cfg)})[1] == cfg
    with pytest.raises(EpicError) as info:
        planned_plain("load_hint=none", SIZES, {"g": {"splits": 2}})
    assert info.value.codes == ["E216"] and "the split-K kernel (splits=2) keeps CUTLASS's" in str(info.value)


def test_an_unknown_hint_is_refused_in_the_file_and_the_plan():
    error = diagnose("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with load_hint=evict_first {\n  out y: bf16 = acc\n}\n")
    assert error.codes == ["E215"] and "load_hint must be one of evict_normal, none, got 'evict_first'" in str(error)
    assert kernel_config.problems(plan_config.KernelConfig("pingpong", (128, 128, 64), load_hint="first")) == [
        "load_hint must be one of evict_normal, none"]
