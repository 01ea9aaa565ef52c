"""trace=tiles on a GPU (run on the H200: docs/GPU.md): the traced gemm computes what the untraced one
does, bit for bit and against torch in float64, and its buffer holds every tile of the launch with its
phases in order, as bench/tile_trace.py reads it. Its two kernels (plain.ping_128x192x64_c2x1 with and
without _tiles) are in `python -m tests.prebuild`'s list (units())."""
import pytest
import torch

import epic
from epic.runtime import loader

from .conftest import ROOT, bench_module

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

CONFIG = {"tile": (128, 192, 64), "cluster": (2, 1), "schedule": "pingpong"}
M, N, K = 4000, 5000, 696          # ragged in all three: 32 x 27 tiles of 128x192, 11 k-blocks (K a multiple of 8: E403)
PROGRAM = ROOT / "bench" / "programs" / "plain.epi"


def units():
    """The kernels this test runs, for python -m tests.prebuild."""
    from epic import pipeline
    from epic.codegen import emit
    prog = pipeline.analyze(str(PROGRAM)).program
    sizes = dict(M=M, N=N, K=K)
    return [u for extra in ({}, {"trace": "tiles"})
            for _, u in emit.units(prog, emit.kernel_configs(prog, M, {"plain": {**CONFIG, **extra}}, sizes))]


def test_a_traced_gemm_computes_the_same_and_records_every_tile_in_phase_order():
    tt = bench_module("tile_trace")
    g = torch.Generator(device="cuda").manual_seed(2025)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(N, K, device="cuda", generator=g).to(torch.bfloat16).t()      # K-major, as plain.epi reads it
    path = str(PROGRAM)
    plain = epic.compile(path, {"plain": dict(CONFIG)})
    traced = epic.compile(path, {"plain": {**CONFIG, "trace": "tiles"}})
    want = plain(x=x, w=w)["y"].clone()
    traced(x=x, w=w)                                  # builds or loads the library
    torch.cuda.synchronize()
    [lib] = [lib for lib in loader.loaded() if lib.function("epic_trace_read")
             and lib.path.stem == "plain.ping_128x192x64_c2x1_tiles"]
    assert lib.function("epic_trace_clear")() == 0
    got = traced(x=x, w=w)["y"]
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    exact = (x.double() @ w.double()).to(torch.bfloat16).double()
    assert ((got.double() - exact).abs() <= 2 ** -7 * exact.abs() + 1e-3 * exact.pow(2).mean().sqrt()).all()

    wg, loads, cta, ctas = tt.read(lib)
    tiles_m, tiles_n = -(-M // 128), -(-N // 192)
    recorded = [(c, w_, t) for c in range(ctas) for w_ in (0, 1) for t in range(cta[c][tt.TILES0 + w_])]
    assert len(recorded) == tiles_m * tiles_n
    for c, w_, t in recorded:
        ev = wg[c][w_][t]
        assert all(ev) and ev == sorted(ev), (c, w_, t, ev)
    for c in range(ctas):
        if cta[c][tt.TILES0] or cta[c][tt.TILES1]:
            assert cta[c][tt.LOADS] == cta[c][tt.TILES0] + cta[c][tt.TILES1]   # the producer loaded each tile
            assert all(b and e >= f >= b for b, f, e in loads[c][:cta[c][tt.LOADS]])
    s = tt.summarize(wg, cta, ctas, *tt.k_blocks_of(lib.path.stem, K), loads=loads)
    assert s["tiles"] == tiles_m * tiles_n and s["handoff"][1] >= 0
    a = s["across CTAs"]
    assert a["span us"] > 0 and 0 <= a["tail share"] < 1 and a["end spread us"] <= a["span us"]
