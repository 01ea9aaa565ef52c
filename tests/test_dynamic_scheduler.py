"""tile_order=dynamic's scheduler (templates/nodes/epic_nodes/dynamic_tile_scheduler.hpp) on the host,
compiled with nvcc: its launch parameters (the cluster's size as a shift, the padded grid in clusters)
and its mapping from a cluster's unit of work w to each of its CTAs' tiles, which must give every tile
of the padded grid exactly once over w < clusters, as the static scheduler's linear order does.
(A shift taken from cutlass::FastDivmod, whose shift_right is not a logarithm, ran every tile twice on
2x1 clusters and let the next launch's counter start past the end: caught on an H100, 2026-12-06.)"""
import subprocess

import pytest

from .conftest import nvcc_host_program

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "epic_nodes/dynamic_tile_scheduler.hpp"
using namespace cute;

template <int CM, int CN>
int run(int M, int N, int swizzle, int raster) {
  using S = epic_scheduler::DynamicTileScheduler;
  S::Arguments args;
  args.max_swizzle_size = swizzle;
  args.raster_order = static_cast<S::RasterOrderOptions>(raster);
  uint32_t counter = 0;
  args.counter = &counter;
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = 132;
  auto p = S::to_underlying_arguments(make_shape(M, N, 4096, 1), Shape<_128, _128, _64>{},
                                      Shape<Int<CM>, Int<CN>, _1>{}, hw, args);
  epic_scheduler::TileDecode const& d = p.decode;
  printf("shift %u clusters %u tiles %u counter %d\n", p.shift, p.clusters, unsigned(p.blocks_per_problem_),
         int(p.counter == &counter));
  for (uint32_t w = 0; w < p.clusters; ++w)
    for (uint32_t cm = 0; cm < CM; ++cm)
      for (uint32_t cn = 0; cn < CN; ++cn) {
        uint64_t i = S::linear_index(w, p.shift, d.along_n ? cn : cm, d.minor_shift);
        auto t = d(uint32_t(i), cm, cn);
        printf("%u %u %u %d %d\n", w, cm, cn, t.m, t.n);
      }
  return 0;
}

int main(int argc, char** argv) {
  int cm = atoi(argv[1]), cn = atoi(argv[2]), M = atoi(argv[3]), N = atoi(argv[4]);
  int swizzle = atoi(argv[5]), raster = atoi(argv[6]);
  if (cm == 2 && cn == 1) return run<2, 1>(M, N, swizzle, raster);
  if (cm == 1 && cn == 2) return run<1, 2>(M, N, swizzle, raster);
  if (cm == 2 && cn == 2) return run<2, 2>(M, N, swizzle, raster);
  return run<1, 1>(M, N, swizzle, raster);
}
"""


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    exe = nvcc_host_program(tmp_path_factory, "dynamic", DRIVER)

    def run(cluster, m, n, swizzle, raster):
        out = subprocess.run([str(exe), *map(str, (*cluster, m, n, swizzle, raster))],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        words = out[0].split()
        head = {k: int(v) for k, v in zip(words[::2], words[1::2])}
        rows = [tuple(map(int, line.split())) for line in out[1:] if line]
        return head, rows
    return run


CASES = [  # cluster, M, N, swizzle, raster (0 heuristic, 1 along M, 2 along N)
    ((2, 1), 8192, 4096, 8, 2),      # the plain gemm at N = 4096 (the bug's shape)
    ((2, 1), 8192, 4096, 8, 1),
    ((1, 2), 1000, 1352, 4, 1),      # a 1x2 cluster, ragged
    ((1, 2), 1000, 1352, 2, 2),
    ((2, 2), 700, 1900, 2, 2),
    ((1, 1), 333, 2304, 2, 0),
]


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster,m,n,swizzle,raster", CASES)
def test_each_unit_of_work_gives_each_cta_of_the_cluster_its_own_tile_and_every_tile_once(
        scheduler, cluster, m, n, swizzle, raster):
    head, rows = scheduler(cluster, m, n, swizzle, raster)
    cm, cn = cluster
    size = cm * cn
    assert head["shift"] == size.bit_length() - 1          # log2 of the cluster's size
    assert head["clusters"] * size == head["tiles"] and head["counter"] == 1
    assert len(rows) == head["tiles"]
    tiles = [(tm, tn) for _, _, _, tm, tn in rows]
    assert len(set(tiles)) == len(tiles)                    # each tile once
    bm, bn = -(-m // 128), -(-n // 128)
    assert {(x, y) for x in range(bm) for y in range(bn)} <= set(tiles)   # the padded grid covers the problem
    for w, a, b, tm, tn in rows:                            # a cluster's CTAs sit side by side
        first = next((x, y) for v, p, q, x, y in rows if v == w and (p, q) == (0, 0))
        assert (tm - first[0], tn - first[1]) == (a, b)
