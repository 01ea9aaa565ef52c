"""tile_order=serpentine: the reflection (templates/nodes/epic_nodes/serpentine_order.hpp, compiled
with g++ for the host) applied to CUTLASS's persistent tile order gives a permutation of the same
padded grid, keeps a cluster's CTAs together, walks odd groups backwards and starts each group where
the one before ended; and the option's plan and generated text (the default kernel's text unchanged)."""
import difflib
import shutil
import subprocess

import pytest

from epic import pipeline
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config as plan_config, kernel_config, tile_grid

from .conftest import ROOT, diagnose, planned_plain

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "epic_nodes/serpentine_order.hpp"
int main(int argc, char** argv) {
  int bm = atoi(argv[1]), bn = atoi(argv[2]), cm = atoi(argv[3]), cn = atoi(argv[4]);
  int log_group = atoi(argv[5]);
  bool along_n = atoi(argv[6]) != 0;
  int walk_clusters = along_n ? bn / cn : bm / cm;
  for (int m = 0; m < bm; ++m)
    for (int n = 0; n < bn; ++n) {
      epic_scheduler::TileCoord t = epic_scheduler::serpentine_tile(m, n, cm, cn, walk_clusters, log_group, along_n);
      printf("%d %d %d %d\n", m, n, t.m, t.n);
    }
  return 0;
}
"""


@pytest.fixture(scope="module")
def reflect(tmp_path_factory):
    gxx = shutil.which("g++")
    if not gxx:
        pytest.skip("g++ not found")
    d = tmp_path_factory.mktemp("serpentine")
    (d / "driver.cpp").write_text(DRIVER)
    exe = d / "driver"
    subprocess.run([gxx, "-std=c++17", "-O1", "-I", str(ROOT / "templates" / "nodes"), str(d / "driver.cpp"),
                    "-o", str(exe)], check=True)

    def run(bm, bn, cm, cn, log_group, along_n):
        out = subprocess.run([str(exe), *map(str, (bm, bn, cm, cn, log_group, int(along_n)))],
                             capture_output=True, text=True, check=True).stdout
        table = {}
        for line in out.split("\n"):
            if line:
                m, n, rm, rn = map(int, line.split())
                table[(m, n)] = (rm, rn)
        return table
    return run


def cutlass_order(bm, bn, cm, cn, log_group, along_n):
    """CUTLASS's sm90 persistent order (get_work_idx_m_and_n) over a grid of bm x bn tiles padded as
    epic's grouped scheduler pads it: each cluster's tiles, cluster by cluster (a model of CUTLASS's
    code, written from its source, not from epic's)."""
    major_c, minor_c = (cn, cm) if along_n else (cm, cn)
    blk_major = (bn if along_n else bm) // major_c
    clusters = bm * bn // (cm * cn)
    order = []
    for cluster_id in range(clusters):
        offset = cluster_id & ((1 << log_group) - 1)
        minor_div, major = divmod(cluster_id >> log_group, blk_major)
        minor = (minor_div << log_group) + offset
        tiles = [(minor * minor_c + i, major * major_c + j) for j in range(major_c) for i in range(minor_c)]
        order.append([(mi, ma) if along_n else (ma, mi) for mi, ma in tiles])
    return order


GRIDS = [  # bm, bn, cluster, log group, along N: the padded grids of the shapes the benches run
    (64, 75, (2, 1), 3, True),      # N = 14336 on 128x192 tiles at M = 8192 (raster n, swizzle 8)
    (64, 150, (2, 1), 3, True),     # gate/up, N = 28672
    (64, 32, (2, 1), 3, False),     # QKV, N = 6144, along M grouping columns
    (32, 27, (2, 1), 1, True),      # ragged 4000 x 5000 (the GPU test), swizzle 2
    (8, 12, (1, 2), 2, False),      # a 1x2 cluster, grouping columns in pairs of clusters
    (6, 10, (2, 2), 1, True),
    (16, 5, (1, 1), 2, True),       # one group short of the rest at the end (16 rows, groups of 4)
]


@pytest.mark.parametrize("bm,bn,cluster,log_group,along_n", GRIDS)
def test_serpentine_is_a_permutation_that_walks_odd_groups_backwards(reflect, bm, bn, cluster, log_group, along_n):
    cm, cn = cluster
    if along_n:
        bm = -(-bm // ((1 << log_group) * cm)) * (1 << log_group) * cm
    else:
        bn = -(-bn // ((1 << log_group) * cn)) * (1 << log_group) * cn
    table = reflect(bm, bn, cm, cn, log_group, along_n)
    base = cutlass_order(bm, bn, cm, cn, log_group, along_n)
    assert sorted(t for c in base for t in c) == sorted(table)       # the model covers the grid once
    serp = [[table[t] for t in c] for c in base]
    tiles = [t for c in serp for t in c]
    assert sorted(tiles) == sorted(table)                            # a permutation of the same grid
    # each CTA keeps its place in its cluster (the kernel's multicast masks assume it)
    assert all((rm % cm, rn % cn) == (m % cm, n % cn) for (m, n), (rm, rn) in table.items())
    for c in serp:                                                    # a cluster's CTAs stay one cluster
        assert len({(m // cm, n // cn) for m, n in c}) == 1
        assert sorted((m % cm, n % cn) for m, n in c) == sorted((i, j) for i in range(cm) for j in range(cn))
    walk = (lambda t: t[1] // cn) if along_n else (lambda t: t[0] // cm)
    group = (lambda t: (t[0] // cm) >> log_group) if along_n else (lambda t: (t[1] // cn) >> log_group)
    groups: dict[int, list[int]] = {}
    for c in serp:
        groups.setdefault(group(c[0]), []).append(walk(c[0]))
    assert sorted(groups) == list(range(len(groups)))
    for g, positions in groups.items():
        # each group in its own consecutive stretch of the order, walked forwards or (odd) backwards
        steps = [b - a for a, b in zip(positions, positions[1:])]
        assert all(s <= 0 for s in steps) if g % 2 else all(s >= 0 for s in steps), (g, positions)
        if g + 1 in groups:
            assert groups[g + 1][0] == positions[-1]                  # the next group starts where it ended
    order_groups = [group(c[0]) for c in serp]
    assert order_groups == sorted(order_groups)


# ---------------------------------------------------------------- the option, planned and printed
PLAIN = ROOT / "bench" / "programs" / "plain.epi"
SIZES = dict(M=8192, K=4096, N=14336)


def test_serpentine_names_its_kernel_and_changes_only_the_scheduler():
    prog = pipeline.analyze(str(PLAIN)).program
    [(_, base)] = emit.units(prog, emit.kernel_configs(prog, 8192, None, SIZES))
    [(spec, serp)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": {"tile_order": "serpentine"}}, SIZES))
    assert serp.name == base.name + "_serp" and str(spec.config).endswith(" tile_order=serpentine")
    assert "Serpentine" not in base.source and "serpentine_tile" not in base.source
    assert serp.source.count("using SerpentineTileScheduler = GroupedTileSchedulerT<SerpentineOrder>;") == 1
    assert serp.source.count("inline TileCoord serpentine_tile(") == 1
    assert serp.source.index("using SerpentineTileScheduler") < serp.source.index("namespace epic_kernel {")
    # of the default kernel's lines, only the scheduler's, the configuration's comment and the library's
    # description of itself change
    removed = [d[2:] for d in difflib.ndiff(base.source.splitlines(), serp.source.splitlines()) if d[:2] == "- "]
    assert len(removed) == 3, removed
    assert removed[0].startswith("// ") and "ping_128x192x64_c2x1" in removed[0]
    assert removed[1].strip() == "epic_scheduler::GroupedPersistentScheduler>;"
    assert removed[2].startswith('  return "{\\"abi\\":1,')
    assert "epic_scheduler::SerpentinePersistentScheduler>;" in [line.strip() for line in serp.source.splitlines()]


def test_serpentine_in_the_file_and_refused_with_split_k():
    _, cfg = planned_plain("tile_order=serpentine", SIZES)
    assert cfg.tile_order == "serpentine" and cfg.key().endswith("_serp")
    with pytest.raises(EpicError) as info:
        planned_plain("tile_order=serpentine", SIZES, {"g": {"splits": 2}})
    assert info.value.codes == ["E216"] and "stream-K scheduler, which keeps its own order" in str(info.value)
    error = diagnose("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile_order=zigzag {\n  out y: bf16 = acc\n}\n")
    assert "linear, serpentine, dynamic, split_last" in str(error) or \
        "linear, serpentine, dynamic or split_last" in str(error)
    assert kernel_config.problems(plan_config.KernelConfig("pingpong", (128, 128, 64), tile_order="zigzag")) == [
        "tile_order must be one of linear, serpentine, dynamic, split_last"]


def test_dynamic_plans_in_the_file_and_per_call():
    """tile_order=dynamic passed its GPU tests (bench/results/2026-12-07-h100-dynamic-scheduler.log): the
    file's option and a call's override plan it with no switch set."""
    assert planned_plain("tile_order=dynamic", SIZES)[1].tile_order == "dynamic"
    assert planned_plain("tile=128x128x64", SIZES, {"g": {"tile_order": "dynamic"}})[1].tile_order == "dynamic"


def test_dynamic_names_its_kernel_and_takes_a_counter_from_the_library():
    """tile_order=dynamic: the scheduler's header and tag, one more launch pointer (null from the caller,
    the library's zeroed per-stream scratch in its place) and the scheduler's argument set from it."""
    prog = pipeline.analyze(str(PLAIN)).program
    [(base_spec, base)] = emit.units(prog, emit.kernel_configs(prog, 8192, None, SIZES))
    [(spec, dyn)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": {"tile_order": "dynamic"}}, SIZES))
    assert dyn.name == base.name + "_dyn" and str(spec.config).endswith(" tile_order=dynamic")
    assert "DynamicPersistentScheduler" not in base.source and "counter" not in base.source
    assert "epic_scheduler::DynamicPersistentScheduler>;" in [line.strip() for line in dyn.source.splitlines()]
    assert dyn.source.count("class DynamicTileScheduler : public GroupedTileScheduler {") == 1
    assert len(spec.pointers) == len(base_spec.pointers) + 1 and spec.pointers[-1].tensor == ""
    index = len(spec.pointers) - 1
    assert f"args.scheduler.counter = static_cast<uint32_t*>(p[{index}]);" in dyn.source
    assert f"with_scratch[{index}] = epic_nodes::stream_scratch(dev, st, {index}, size_t(4));" in dyn.source
    _, cfg = planned_plain("tile_order=dynamic", SIZES)
    assert cfg.tile_order == "dynamic" and cfg.key().endswith("_dyn")
    with pytest.raises(EpicError) as info:
        planned_plain("tile_order=dynamic", SIZES, {"g": {"splits": 2}})
    assert info.value.codes == ["E216"] and "stream-K scheduler, which keeps its own order" in str(info.value)


def test_split_last_names_its_kernel_and_takes_its_partial_slots_and_counters_from_the_library():
    """tile_order=split_last: the kernel body of epic's own over CUTLASS's pingpong kernel, the scheduler's
    tag, and two more launch pointers (null from the caller, the library's per-stream scratch in their
    place: a tile of float accumulators for each of at most 144 CTAs, a counter each) set as the
    scheduler's arguments. The default kernel's text does not change."""
    prog = pipeline.analyze(str(PLAIN)).program
    [(base_spec, base)] = emit.units(prog, emit.kernel_configs(prog, 8192, None, SIZES))
    [(spec, split)] = emit.units(prog, emit.kernel_configs(prog, 8192, {"plain": {"tile_order": "split_last"}}, SIZES))
    assert split.name == base.name + "_splitlast" and str(spec.config).endswith(" tile_order=split_last")
    assert "SplitLastRound" not in base.source and "GemmKernelBase" not in base.source
    lines = [line.strip() for line in split.source.splitlines()]
    assert "epic_scheduler::SplitLastRoundPersistentScheduler>;" in lines
    assert "using GemmKernel = epic_kernel_split::SplitLastRoundKernel<GemmKernelBase>;" in lines
    assert len(spec.pointers) == len(base_spec.pointers) + 2 and [p.tensor for p in spec.pointers[-2:]] == ["", ""]
    slots, counts = len(spec.pointers) - 2, len(spec.pointers) - 1
    tile = spec.config.tile[0] * spec.config.tile[1]
    assert f"args.scheduler.partials = static_cast<float*>(p[{slots}]);   // tile_order=split_last" in lines
    assert f"args.scheduler.counts = static_cast<uint32_t*>(p[{counts}]);" in lines
    assert f"with_scratch[{slots}] = epic_nodes::stream_scratch(dev, st, {slots}, size_t({144 * tile * 4}));" in lines
    assert f"with_scratch[{counts}] = epic_nodes::stream_scratch(dev, st, {counts}, size_t({144 * 4}));" in lines
    # the scratch holds as many CTAs as the kernel splits for (a larger grid runs whole tiles)
    header = (ROOT / "templates" / "nodes" / "epic_nodes" / "split_last_round.hpp").read_text()
    assert f"constexpr uint32_t kSplitMaxCtas = {tile_grid.SPLIT_MAX_CTAS};" in header
    assert f"constexpr uint32_t kSplitMinShare = {tile_grid.SPLIT_MIN_SHARE};" in header


def test_split_last_plans_in_the_file_and_is_refused_where_its_kernel_does_not_run():
    """split_last passed its GPU tests (bench/results/2026-12-08-h100-gpu-suite-split-last.log): an option a
    file or a call sets with no switch (no heuristic picks it, none has timed it yet); its kernel is CUTLASS's
    pingpong kernel with epic's body, so the cooperative schedule, split-K, a short box of A and the
    tile trace are refused with what to change."""
    _, cfg = planned_plain("tile_order=split_last", SIZES)
    assert cfg.tile_order == "split_last" and cfg.key().endswith("_splitlast")
    assert planned_plain("tile=128x128x64", SIZES, {"g": {"tile_order": "split_last"}})[1].tile_order == "split_last"
    assert planned_plain("tile=128x128x64", SIZES)[1].tile_order == "linear"
    # a decode call has one round of tiles: its plan adds no short box of A (a_rows), which the split's
    # kernel body was not checked with
    assert planned_plain("tile_order=split_last", {**SIZES, "M": 16})[1].a_rows == 0
    for extra, words in (({"schedule": "cooperative", "tile": (128, 256, 64)}, "needs the pingpong schedule"),
                         ({"schedule": "cooperative", "tile": (128, 256, 64), "splits": 2},
                          "stream-K scheduler, which keeps its own order"),
                         ({"trace": "tiles"}, "tile_order=split_last has epic's own")):
        with pytest.raises(EpicError) as info:
            planned_plain("tile_order=split_last", SIZES, {"g": extra})
        assert info.value.codes == ["E216"] and words in str(info.value), extra
    assert any("a_rows=16 was not checked with it" in p for p in kernel_config.problems(
        plan_config.KernelConfig("pingpong", (64, 64, 64), tile_order="split_last", a_rows=16)))
