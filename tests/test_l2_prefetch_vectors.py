"""The address arithmetic of the epilogue-vector L2 prefetch (templates/nodes/epic_nodes/
l2_prefetch_vectors.hpp, vector_runs), compiled for the host with the system's C++ compiler: every
byte run a CTA asks for lies inside its vector, the CTAs together ask for every column block of a row
vector exactly once, and rounding a run down to 16-byte units keeps it inside."""
import shutil
import subprocess

import pytest

from .conftest import ROOT

HEADER = ROOT / "templates" / "nodes" / "epic_nodes" / "l2_prefetch_vectors.hpp"

PROGRAM = r"""
#define CUTLASS_HOST_DEVICE inline
#define CUTLASS_DEVICE inline
#define CUTLASS_PRAGMA_UNROLL
#include <cstdio>
#include <cstdlib>
#include "l2_prefetch_vectors.hpp"

template <int TileM, int TileN>
void runs(long long elements, int bytes, int kind, long long ctas) {
  static char base[1];
  epic_mainloop::VectorPrefetch x{base, elements, bytes, kind};
  for (long long cta = 0; cta < ctas; ++cta) {
    epic_mainloop::vector_runs<TileM, TileN>(x, cta, ctas, [&](long long offset, long long n) {
      std::printf("%lld %lld %lld\n", cta, offset, n);
    });
  }
}

int main(int argc, char** argv) {
  long long elements = std::atoll(argv[2]), ctas = std::atoll(argv[5]);
  int bytes = std::atoi(argv[3]), kind = std::atoi(argv[4]);
  if (argv[1][0] == 'a') runs<64, 64>(elements, bytes, kind, ctas);
  else runs<64, 128>(elements, bytes, kind, ctas);
  return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    d = tmp_path_factory.mktemp("vector_runs")
    (d / "t.cpp").write_text(PROGRAM)
    exe = d / "t"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{HEADER.parent}", str(d / "t.cpp"), "-o", str(exe)], check=True)

    def run(tile, elements, bytes_, kind, ctas):
        out = subprocess.run([str(exe), tile, str(elements), str(bytes_), str(kind), str(ctas)],
                             check=True, capture_output=True, text=True).stdout
        return [tuple(int(v) for v in line.split()) for line in out.splitlines()]
    return run


@pytest.mark.parametrize("tile_n, elements, bytes_, ctas", [
    (64, 4096, 2, 132),       # gamma at D = 4096: 64 blocks, fewer than the CTAs
    (64, 14336, 2, 132),      # a bias at N = 14336: 224 blocks, two rounds
    (128, 14336, 4, 132),     # an f32 vector on 128-wide tiles
    (64, 200, 2, 4),          # a ragged last block (8 columns)
    (64, 1000, 1, 3),         # fp8: a ragged block of 40 bytes
    (64, 64, 2, 1),
])
def test_a_row_vectors_blocks_are_asked_for_once_each_inside_the_vector(program, tile_n, elements, bytes_, ctas):
    runs = program("a" if tile_n == 64 else "b", elements, bytes_, 0, ctas)
    blocks = -(-elements // tile_n)
    assert sorted(offset for _, offset, _ in runs) == [b * tile_n * bytes_ for b in range(blocks)]
    for cta, offset, n in runs:
        assert offset % 16 == 0 and 0 < n and offset + n <= elements * bytes_
        assert n == min(tile_n, elements - offset // bytes_) * bytes_
        assert (offset // (tile_n * bytes_)) % ctas == cta        # CTA i: blocks i, i + CTAs, ...


def test_column_and_per_head_vectors_are_one_run_from_the_start(program):
    assert program("a", 40, 4, 1, 5) == [(c, 0, 160) for c in range(5)]      # pos[M], M = 40 <= 64
    assert program("a", 300, 4, 1, 2) == [(0, 0, 256), (1, 0, 256)]          # never past the tile's rows
    assert program("a", 128, 2, 2, 2) == [(0, 0, 256), (1, 0, 256)]          # gamma[Dh], Dh = 128


def test_nothing_is_asked_for_an_empty_vector(program):
    for kind in (0, 1, 2):
        assert program("a", 0, 2, kind, 4) == []
