"""prefetch_next=N: the producer asks L2 for the first N k-blocks of the CTA's next tile while it loads
the current one (templates/nodes/epic_nodes/producer_loads_mainloop.hpp). Its plan, its name, the lines of
the default kernel it changes, the file option and its refusals; the nvcc build is in test_codegen.py,
the GPU comparison with the kernel that does not ask in test_gpu.py."""
import difflib

import pytest

from epic import pipeline
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config as plan_config
from epic.tuning import space

from .conftest import ROOT, diagnose, planned_plain

PLAIN = ROOT / "bench" / "programs" / "plain.epi"
SIZES = dict(M=8192, K=4096, N=28672)
HOST_LINE = "  params.mainloop.schedule = params.scheduler;   // the producer asks L2 for its next tile (prefetch_next)"


def _units(options: dict | None):
    prog = pipeline.analyze(str(PLAIN)).program
    [(spec, unit)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": options} if options else None, SIZES))
    return spec, unit


def test_prefetch_next_names_its_kernel_and_hands_the_producer_the_scheduler():
    _, base = _units(None)
    spec, unit = _units({"prefetch_next": 2})
    assert unit.name == base.name + "_pn2" and str(spec.config).endswith(" prefetch_next=2")
    assert "ProducerLoads" not in base.source and "work_ahead(" in base.source    # the scheduler's, unused
    lines = unit.source.splitlines()
    assert ("using CollectiveMainloop = epic_mainloop::ProducerLoads<epic_mainloop::L2PrefetchMainloop<BuiltMainloop, "
            "192, 64>, epic_scheduler::GroupedTileScheduler, true, 2>;") in lines
    assert lines.count(HOST_LINE) == 1 and HOST_LINE not in base.source.splitlines()
    # the host line after the kernel's parameters are made, before the launch
    assert unit.source.index("auto params = GemmKernel::to_underlying_arguments") < unit.source.index(HOST_LINE)
    # the producer asks for the next tile's first N k-blocks of both operands, through the scheduler
    assert "Scheduler(params.schedule).work_ahead(uint32_t(tile) + 1)" in unit.source
    assert unit.source.count("prefetch(params.tma_load_a, gA_next(_, _, _, j));") == 1
    assert unit.source.count("prefetch(params.tma_load_b, gB_next(_, _, _, j));") == 1
    # of the default kernel's lines, only the configuration's comment, the mainloop's and the library's
    # description of itself change
    removed = [d[2:] for d in difflib.ndiff(base.source.splitlines(), lines) if d[:2] == "- "]
    assert len(removed) == 3, removed
    assert removed[0].startswith("// ") and "ping_128x192x64_c2x1" in removed[0]
    assert removed[1].startswith("using CollectiveMainloop = epic_mainloop::L2PrefetchMainloop<")
    assert removed[2].startswith('  return "{\\"abi\\":1,')


def test_prefetch_next_asks_the_serpentine_scheduler_and_keeps_the_load_hint():
    _, unit = _units({"prefetch_next": 4, "tile_order": "serpentine", "load_hint": "none", "trace": "tiles"})
    assert unit.name.endswith("_tiles_serp_nohint_pn4")
    assert ("using CollectiveMainloop = epic_trace::TracedMainloop<epic_mainloop::ProducerLoads<"
            "epic_mainloop::L2PrefetchMainloop<BuiltMainloop, 192, 64>, epic_scheduler::SerpentineTileScheduler, "
            "false, 4>>;") in unit.source.splitlines()


def test_prefetch_next_in_the_file_round_trips_through_tuning_and_is_refused_with_split_k():
    _, cfg = planned_plain("prefetch_next=1", SIZES)
    assert cfg.prefetch_next == 1 and cfg.key().endswith("_pn1")
    assert space.override(cfg)["prefetch_next"] == 1
    assert planned_plain("prefetch_next=1", SIZES, {"g": space.override(cfg)})[1] == cfg
    with pytest.raises(EpicError) as info:
        planned_plain("prefetch_next=2", SIZES, {"g": {"splits": 2}})
    assert info.value.codes == ["E216"] and "the split-K kernel (splits=2) has CUTLASS's stream-K" in str(info.value)


def test_an_unknown_prefetch_depth_is_refused_in_the_file_and_the_plan():
    error = diagnose("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with prefetch_next=3 {\n  out y: bf16 = acc\n}\n")
    assert error.codes == ["E215"] and "prefetch_next must be one of 0, 1, 2, 4, got '3'" in str(error)
    assert plan_config.problems(plan_config.KernelConfig("pingpong", (128, 128, 64), prefetch_next=8)) == [
        "prefetch_next must be 0, 1, 2 or 4"]
