"""tile_order=split_last's work units (templates/nodes/epic_nodes/last_round_plan.hpp) on the host,
compiled with nvcc: for every CTA of the persistent grid CUTLASS's scheduler launches, the whole tiles
and last-round pieces the kernel body (split_last_round.hpp) runs, decoded to tiles as the grouped
scheduler decodes them. Checked against what the split must do: every k-block of every tile of the padded
grid computed exactly once, a cluster's CTAs in step on their own tiles, each split tile ended by one
final piece that waits for exactly the pieces before it, and no piece waiting before its CTA's own
partial piece is stored (else two CTAs could wait on each other)."""
import subprocess
from collections import defaultdict

import pytest
from hypothesis import given, settings, strategies as st

from epic.plan import config as config_mod, tile_grid

from .conftest import nvcc_host_program

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "epic_nodes/grouped_tile_scheduler.hpp"
#include "epic_nodes/last_round_plan.hpp"
using namespace cute;

template <int CM, int CN>
int run(int M, int N, int K, int swizzle, int raster, int sms) {
  using S = epic_scheduler::GroupedTileScheduler;
  using P = epic_scheduler::LastRoundPlan;
  S::Arguments args;
  args.max_swizzle_size = swizzle;
  args.raster_order = static_cast<S::RasterOrderOptions>(raster);
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = sms;
  auto problem = make_shape(M, N, K, 1);
  auto tile = Shape<_128, _128, _64>{};
  auto cluster = Shape<Int<CM>, Int<CN>, _1>{};
  auto p = S::to_underlying_arguments(problem, tile, cluster, hw, args);
  dim3 grid = S::get_grid_shape(p, make_shape(M, N, K), tile, cluster, hw, args);
  uint32_t const G = grid.x * grid.y * grid.z, cs = CM * CN, tiles = uint32_t(p.blocks_per_problem_);
  uint32_t const kb = uint32_t((K + 63) / 64);
  bool const along_n = p.raster_order_ == S::RasterOrder::AlongN;
  P plan = P::make(tiles, G, cs, kb, 4);
  printf("tiles %u grid %u cs %u kb %u split %d rounds %u\n", tiles, G, cs, kb, int(plan.split), plan.rounds);
  for (uint32_t by = 0; by < grid.y; ++by)
    for (uint32_t bx = 0; bx < grid.x; ++bx) {
      uint32_t const first = P::first_index(bx, by, grid.x, grid.y, along_n);
      uint32_t const cl = first / cs, rank = first % cs, cm = bx % CM, cn = by % CN;
      uint32_t const whole = plan.split ? plan.rounds : (first < tiles ? (tiles - first + G - 1) / G : 0);
      for (uint32_t i = 0; i < whole; ++i) {
        auto t = p.decode(first + i * G, cm, cn);
        printf("%u %u %u %u %u whole %d %d 0 %u -1 -1\n", bx, by, cl, rank, i, t.m, t.n, kb);
      }
      P::Piece pieces[2];
      int n = plan.pieces(cl, pieces);
      for (int j = 0; j < n; ++j) {
        auto t = p.decode(plan.piece_index(pieces[j].tile, G, cs, rank), cm, cn);
        printf("%u %u %u %u %u %s %d %d %u %u %u %d\n", bx, by, cl, rank, whole + j,
               pieces[j].final ? "final" : "partial", t.m, t.n, pieces[j].k_begin, pieces[j].k_count,
               pieces[j].tile, pieces[j].final ? int(plan.first_contributor(pieces[j].tile)) : -1);
      }
    }
  return 0;
}

int main(int argc, char** argv) {
  int cm = atoi(argv[1]), cn = atoi(argv[2]), M = atoi(argv[3]), N = atoi(argv[4]), K = atoi(argv[5]);
  int swizzle = atoi(argv[6]), raster = atoi(argv[7]), sms = atoi(argv[8]);
  if (cm == 2 && cn == 1) return run<2, 1>(M, N, K, swizzle, raster, sms);
  if (cm == 1 && cn == 2) return run<1, 2>(M, N, K, swizzle, raster, sms);
  if (cm == 2 && cn == 2) return run<2, 2>(M, N, K, swizzle, raster, sms);
  return run<1, 1>(M, N, K, swizzle, raster, sms);
}
"""


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    exe = nvcc_host_program(tmp_path_factory, "last_round", DRIVER)

    def run(cluster, m, n, k, swizzle, raster, sms):
        out = subprocess.run([str(exe), *map(str, (*cluster, m, n, k, swizzle, raster, sms))],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        words = out[0].split()
        head = {key: int(v) for key, v in zip(words[::2], words[1::2])}
        units = []
        for line in out[1:]:
            if line:
                f = line.split()
                units.append(dict(cta=(int(f[0]), int(f[1])), cluster=int(f[2]), rank=int(f[3]), u=int(f[4]),
                                  kind=f[5], tile=(int(f[6]), int(f[7])), k0=int(f[8]), kn=int(f[9]),
                                  piece_tile=int(f[10]), first=int(f[11])))
        return head, units
    return run


CASES = [  # cluster, M, N, K, swizzle, raster (0 heuristic, 1 along M, 2 along N), SMs
    ((2, 1), 8192, 14336, 4096, 8, 0, 132),   # bias + GELU's gemm: 4800 tiles on 132 CTAs
    ((2, 1), 8192, 6144, 4096, 8, 0, 132),    # RoPE's QKV gemm
    ((2, 1), 8192, 4096, 4096, 8, 1, 132),    # raster along M
    ((2, 1), 8191, 392, 200, 1, 0, 132),      # ragged, four k-blocks: too few to split
    ((1, 2), 1000, 1352, 1000, 2, 2, 132),    # fewer tiles than CTAs: no last round
    ((1, 2), 3000, 1352, 4000, 2, 2, 132),    # a 1x2 cluster, ragged
    ((2, 2), 2700, 1900, 3000, 2, 2, 132),
    ((1, 1), 3333, 2304, 4096, 2, 0, 132),
    ((2, 1), 4096, 14336, 4096, 8, 0, 78),    # another GPU's SM count
    ((1, 1), 8192, 4096, 192, 8, 0, 132),     # three k-blocks a tile
]


def check_cover(head, units, m, n):
    """Every k-block of every tile of the padded grid exactly once, and a split exactly where the rule
    (a last round, at least 4 k-blocks per cluster) makes one."""
    kb, grid, cs = head["kb"], head["grid"], head["cs"]
    cover = defaultdict(list)
    for x in units:
        cover[x["tile"]].append((x["k0"], x["k0"] + x["kn"]))
    assert len(cover) == head["tiles"]                      # every tile of the padded grid, none twice
    bm, bn = -(-m // 128), -(-n // 128)
    assert {(a, b) for a in range(bm) for b in range(bn)} <= set(cover)
    for tile, ranges in cover.items():                      # its k-blocks exactly once
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == kb, tile
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (tile, ranges)
    leftover = head["tiles"] % grid
    assert head["split"] == int(leftover > 0 and (leftover // cs) * kb >= 4 * grid // cs)


def check_split(head, units):
    """A split's order: whole rounds, then at most a partial and a final piece; balanced work; a
    cluster's CTAs in step; each split tile ended by one final piece waiting for exactly its others."""
    by_cta = defaultdict(list)
    for x in units:
        by_cta[x["cta"]].append(x)
    # every CTA runs the same whole rounds, then at most two pieces, its partial one first
    for cta, us in by_cta.items():
        kinds = [x["kind"] for x in us]
        assert kinds[:head["rounds"]] == ["whole"] * head["rounds"]
        assert kinds[head["rounds"]:] in ([], ["partial"], ["final"], ["partial", "final"]), (cta, kinds)
    # the k-blocks are shared out evenly: no CTA has more than one k-block above another
    work = [sum(x["kn"] for x in us) for us in by_cta.values()]
    assert max(work) - min(work) <= 1
    # a cluster's CTAs take the same k-blocks in the same order, each on its own tile
    by_cluster = defaultdict(list)
    for us in by_cta.values():
        by_cluster[us[0]["cluster"]].append(us)
    for cl, ctas in by_cluster.items():
        assert len(ctas) == head["cs"] and len({x[0]["rank"] for x in ctas}) == head["cs"]
        shapes = {tuple((x["kind"], x["k0"], x["kn"], x["piece_tile"]) for x in us) for us in ctas}
        assert len(shapes) == 1, cl
    # each split tile: one final piece, on the tile's last k-block; it waits for the pieces of clusters
    # first .. its own (exclusive), which are exactly the tile's other pieces, all partial and of the
    # same rank; those clusters store their partial piece before running any final one
    pieces = defaultdict(list)
    for x in units:
        if x["kind"] != "whole":
            pieces[(x["piece_tile"], x["rank"])].append(x)
    for key, ps in pieces.items():
        [final] = [x for x in ps if x["kind"] == "final"]
        assert final["k0"] + final["kn"] == head["kb"]
        others = sorted(x["cluster"] for x in ps if x is not final)
        assert others == list(range(final["first"], final["cluster"])), key
        assert len({x["tile"] for x in ps}) == 1


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster,m,n,k,swizzle,raster,sms", CASES)
def test_every_k_block_of_every_tile_is_computed_once_and_each_split_tile_ends_once(
        plan, cluster, m, n, k, swizzle, raster, sms):
    head, units = plan(cluster, m, n, k, swizzle, raster, sms)
    check_cover(head, units, m, n)


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster,m,n,k,swizzle,raster,sms", [c for c in CASES if c[3] >= 3000])
def test_the_split_keeps_clusters_in_step_and_no_piece_waits_on_a_waiting_one(
        plan, cluster, m, n, k, swizzle, raster, sms):
    head, units = plan(cluster, m, n, k, swizzle, raster, sms)
    assert head["split"] == 1
    check_split(head, units)


@pytest.mark.nvcc
@settings(max_examples=60, deadline=None)
@given(cluster=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), m=st.integers(1, 9000),
       n=st.integers(1, 9000), k=st.integers(1, 6000), swizzle=st.sampled_from([1, 2, 4, 8]),
       raster=st.integers(0, 2), sms=st.sampled_from([78, 114, 132, 144]))
def test_any_shape_splits_by_the_rule_and_every_split_is_sound(plan, cluster, m, n, k, swizzle, raster, sms):
    """Random shapes, clusters, tile orders and SM counts: the cover, the split's order and waits, and
    `epic plan`'s account of it hold wherever the split happens (or does not)."""
    head, units = plan(cluster, m, n, k, swizzle, raster, sms)
    check_cover(head, units, m, n)
    if head["split"]:
        check_split(head, units)
    check_plan_line(head, cluster, m, n, k, swizzle, raster, sms)


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster,m,n,k,swizzle,raster,sms", CASES)
def test_the_plan_says_what_the_kernel_splits(plan, cluster, m, n, k, swizzle, raster, sms):
    """`epic plan`'s line for a split_last gemm (tile_grid.last_round_split) names the split where the
    kernel's rule makes one, with the kernel's tile count, and says nothing where it makes none."""
    head, _ = plan(cluster, m, n, k, swizzle, raster, sms)
    check_plan_line(head, cluster, m, n, k, swizzle, raster, sms)


def check_plan_line(head, cluster, m, n, k, swizzle, raster, sms):
    cfg = config_mod.KernelConfig("pingpong", (128, 128, 64), cluster=cluster, swizzle=swizzle,
                                  raster=("heuristic", "m", "n")[raster], tile_order="split_last")
    said = tile_grid.last_round_split(cfg, m, n, k, sms)
    assert tile_grid.rounds(cfg, m, n, sms).scheduled == head["tiles"]
    assert (said is not None) == bool(head["split"])
    if said:
        assert f"the last round's {head['tiles'] % head['grid']} tiles split along K over all {head['grid']} CTAs" in said
