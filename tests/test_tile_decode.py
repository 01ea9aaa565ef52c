"""The persistent scheduler's 32-bit tile decode (templates/nodes/epic_nodes/tile_decode.hpp, prepared on
the host by GroupedTileScheduler::to_underlying_arguments in grouped_tile_scheduler.hpp): compiled for the
host with nvcc and compared, index by index and for every CTA position in the cluster, with a model of
CUTLASS's sm90 mapping written from CUTLASS's source (PersistentTileSchedulerSm90's
get_current_work_for_linear_idx and get_work_idx_m_and_n), on the padded grids the benches run."""
import subprocess

import pytest

from .conftest import nvcc_host_program

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "epic_nodes/grouped_tile_scheduler.hpp"
using namespace cute;

template <int CM, int CN>
int run(int M, int N, int L, int swizzle, int raster) {
  using S = epic_scheduler::GroupedTileScheduler;
  S::Arguments args;
  args.max_swizzle_size = swizzle;
  args.raster_order = static_cast<S::RasterOrderOptions>(raster);
  cutlass::KernelHardwareInfo hw;
  hw.sm_count = 132;
  auto p = S::to_underlying_arguments(make_shape(M, N, 4096, L), Shape<_128, _192, _64>{},
                                      Shape<Int<CM>, Int<CN>, _1>{}, hw, args);
  epic_scheduler::TileDecode const& d = p.decode;
  printf("fast %d tiles %u per_problem %d minor %u major %u clusters_major %d log_group %u along_n %d\n",
         int(p.fast), unsigned(p.blocks_per_problem_), d.per_problem.divisor, d.minor_size, d.major_size, d.clusters_major.divisor,
         d.log_group, int(d.along_n));
  for (uint32_t i = 0; i < uint32_t(p.blocks_per_problem_); ++i)
    for (uint32_t cm = 0; cm < CM; ++cm)
      for (uint32_t cn = 0; cn < CN; ++cn) {
        auto t = d(i, cm, cn);
        printf("%u %u %u %d %d %d\n", i, cm, cn, t.m, t.n, t.l);
      }
  return 0;
}

int main(int argc, char** argv) {
  int cm = atoi(argv[1]), cn = atoi(argv[2]), M = atoi(argv[3]), N = atoi(argv[4]), L = atoi(argv[5]);
  int swizzle = atoi(argv[6]), raster = atoi(argv[7]);
  if (cm == 2 && cn == 1) return run<2, 1>(M, N, L, swizzle, raster);
  if (cm == 1 && cn == 2) return run<1, 2>(M, N, L, swizzle, raster);
  if (cm == 2 && cn == 2) return run<2, 2>(M, N, L, swizzle, raster);
  return run<1, 1>(M, N, L, swizzle, raster);
}
"""


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    exe = nvcc_host_program(tmp_path_factory, "decode", DRIVER)

    def run(cluster, m, n, batch, swizzle, raster):
        out = subprocess.run([str(exe), *map(str, (*cluster, m, n, batch, swizzle, raster))],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        words = out[0].split()
        head = {k: int(v) for k, v in zip(words[::2], words[1::2])}
        table = {}
        for line in out[1:]:
            if line:
                i, cm, cn, tm, tn, tl = map(int, line.split())
                table[(i, cm, cn)] = (tm, tn, tl)
        return head, table
    return run


def cutlass_tile(index, cta_m, cta_n, per_problem, minor_c, major_c, clusters_major, log_group, along_n):
    """CUTLASS's mapping (sm90_tile_scheduler.hpp and static_tile_scheduler.hpp), step for step."""
    l, rest = divmod(index, per_problem)
    in_grid = rest // minor_c
    cluster_id, major_offset = divmod(in_grid, major_c)
    minor_offset = cta_m if along_n else cta_n
    offset = cluster_id & ((1 << log_group) - 1)
    minor_div, cluster_major = divmod(cluster_id >> log_group, clusters_major)
    minor = (minor_div * (1 << log_group) + offset) * minor_c + minor_offset
    major = cluster_major * major_c + major_offset
    return (minor, major, l) if along_n else (major, minor, l)


CASES = [  # cluster, M, N, batch, swizzle, raster (0 heuristic, 1 along M, 2 along N)
    ((2, 1), 8192, 14336, 1, 8, 2),     # bias + GELU at M = 8192 (75 columns of 192, 64 rows)
    ((2, 1), 8192, 28672, 1, 8, 2),     # gate/up
    ((2, 1), 8192, 6144, 1, 8, 1),      # QKV, along M
    ((2, 1), 4000, 5000, 1, 2, 0),      # ragged, swizzle 2, CUTLASS's raster heuristic
    ((1, 2), 1000, 2300, 1, 4, 1),      # a 1x2 cluster grouping columns
    ((2, 2), 700, 1900, 1, 2, 2),
    ((1, 1), 2048, 960, 1, 4, 2),
    ((2, 1), 1024, 2048, 3, 2, 2),      # a batch of three problems
    ((1, 1), 64, 4096, 1, 1, 0),        # decode: one row of tiles
]


@pytest.mark.nvcc
@pytest.mark.parametrize("cluster,m,n,batch,swizzle,raster", CASES)
def test_the_32_bit_decode_gives_cutlass_tiles_in_cutlass_order(decode, cluster, m, n, batch, swizzle, raster):
    head, table = decode(cluster, m, n, batch, swizzle, raster)
    cm, cn = cluster
    bm, bn = -(-m // 128), -(-n // 192)
    bm, bn = -(-bm // cm) * cm, -(-bn // cn) * cn                     # rounded to the cluster
    along_n = bool(head["along_n"])
    if raster:
        assert along_n == (raster == 2)
    group = 1 << head["log_group"]
    assert group <= swizzle
    if along_n:                                                       # only the grouped dimension padded
        bm = -(-bm // (group * cm)) * group * cm
    else:
        bn = -(-bn // (group * cn)) * group * cn
    assert head["fast"] == 1
    assert head["tiles"] == bm * bn * batch and head["per_problem"] == bm * bn
    minor_c, major_c = (cm, cn) if along_n else (cn, cm)
    assert (head["minor"], head["major"]) == (minor_c, major_c)
    assert head["clusters_major"] == (bn // cn if along_n else bm // cm)
    for (i, a, b), tile in table.items():
        assert tile == cutlass_tile(i, a, b, bm * bn, minor_c, major_c, head["clusters_major"],
                                    head["log_group"], along_n), (i, a, b)
    # the CTA that takes index i sits at i % minor_c along the cluster's minor side (CUTLASS's linear
    # index runs along the grid's x, then y): over all indices, each tile of the padded grid once
    def cta(i):
        return (i % minor_c, 0) if along_n else (0, i % minor_c)
    tiles = [table[(i, *cta(i))] for i in range(head["tiles"])]
    assert len(tiles) == len(set(tiles))
    assert set(tiles) == {(x, y, z) for x in range(bm) for y in range(bn) for z in range(batch)}
