"""Generated kernels executed on the CPU (tests/hostsim) against the reference interpreter.

Every sample and tests/programs/*.epi that code generation supports today (E702 skips, with the
reason), under both configurations the heuristic picks (small M: pingpong 64x64x64, with a tail kernel
where a gemm has a row or block statistic (combine=tail), and again with the statistics in the gemm's
epilogue (combine=kernel: a cluster 1x2 where two CTAs share 1x128 blocks); large M: pingpong
128x128x64, cluster 2x1, and 128x192 where N is a multiple of 192), at ragged sizes (M = 1,
77, 300 with N, K not multiples of the tile) and one multiple of the tile, and once more with extra
tiles loaded straight to registers (aux_load=direct, where a program loads any), and under both with
each row combine kernel folded into its gemm (combine=fold, where a program has one), and at small M
with each gemm that has a row statistic storing its accumulator for a tail kernel (combine=tail), on fresh random
inputs (the seed is in every failure message). Per case: the C ABI checked by roles, every buffer
poisoned and checked to be written, every output, intermediate and per-tile partial compared with
the reference, kernel by kernel.
All kernels of the session are compiled up front in as many g++ runs as there are cores.
"""
import math
import zlib

import pytest
import torch

from epic.diagnostics import EpicError
from epic.plan import planner

from . import hostsim
from .conftest import ROOT, SAMPLES, bench_module
from .hostsim import harness

PROGRAMS = [str(p.relative_to(ROOT)) for p in [*SAMPLES, *sorted((ROOT / "tests" / "programs").glob("*.epi"))]]
# configuration: (the M whose heuristic configuration it is, changes to it)
CONFIGS = {"small_m": (64, {}), "large_m": (8192, {}),
           # the statistics in the gemm's epilogue and a combine kernel, where the heuristic takes the tail
           "small_m_kernel": (64, {"combine": "kernel"}),
           "large_m_direct": (8192, {"aux_load": "direct"}),     # extra tiles loaded straight to registers
           # a row statistic's combine kernel folded into its gemm (the last CTA of a row block merges)
           "small_m_fold": (64, {"combine": "fold"}), "large_m_fold": (8192, {"combine": "fold"}),
           # the gemm stores its accumulator, a tail kernel runs its epilogue and row statistics (plan/tail.py)
           "small_m_tail": (64, {"combine": "tail"})}
SHAPES = [(1, 392, 200), (77, 392, 200), (300, 392, 200), (256, 512, 256)]   # (M, N, K); the last: tile multiples
WIDE = (300, 576, 136)      # N a multiple of 192: large M takes 128x192 tiles where the blocks allow
# a row combine kernel that finishes tile stores moves 16 columns per lane and step, several steps in
# flight: 2320 columns (a multiple of 16, over 2048) take every lane through a second round of steps
# that ends part-way (combine.steps_in_flight)
FINISH_WIDE = (77, 2320, 136)
# a combine kernel over 4096 rows (columns) or more gives each warp several (combine.py's grouped form):
# many rows, then many columns (each ragged), the other dimension small to keep the host's work small
MANY_ROWS, MANY_COLS = (4100, 392, 136), (300, 4104, 136)
# a tail kernel's CTA (256 threads, 16 columns each per step) over rows of more than 4096 columns, K as
# wide (residual + RMSNorm's D is both): every warp column by column (4104), then vector steps (4608)
TAIL_WIDE = [(5, 4104, 4104), (3, 4608, 4608)]
CASES = [(config, shape) for config in ("small_m", "small_m_kernel", "large_m", "small_m_fold", "large_m_fold")
         for shape in SHAPES] + \
    [("large_m", WIDE), ("large_m_fold", WIDE), ("large_m_direct", SHAPES[1]), ("small_m", FINISH_WIDE),
     ("large_m", MANY_ROWS), ("large_m", MANY_COLS)] + \
    [("small_m_tail", shape) for shape in [*SHAPES, FINISH_WIDE, *TAIL_WIDE]]


def sizes_for(program, m: int, n: int, k: int) -> dict[str, int]:
    """Sizes of the program's dimensions: the first gemm is [m, k] @ [k, n] (dimensions named by
    expressions like 2*F get the size that makes them about that), every other dimension n; other
    than M, sizes are rounded up to 16, then 128, if the plan refuses them (1-byte rows for TMA,
    whole numbers of blocks)."""
    g = next(kern for kern in program.kernels if kern.kind == "gemm")
    a, b = program.tensors[g.a], program.tensors[g.b]
    sizes: dict[str, int] = {}
    for dim, value in ((a.dims[0], m), (a.dims[1], k), (b.dims[1], n)):
        if len(dim.names) == 1 and dim.names[0] not in sizes:
            sizes[dim.names[0]] = max(1, math.ceil(value / dim.coef))
        elif len(dim.names) > 1:      # Dh*H (sorted names): 4 of each later factor, the first makes up the size
            first, *rest = dim.names
            sizes.update({x: 4 for x in rest if x not in sizes})
            sizes.setdefault(first, max(1, math.ceil(value / dim.coef / 4 ** len(rest))))
    rows = a.dims[0].names[0]
    for d in program.dims:
        sizes.setdefault(d, n)
    for multiple in (1, 16, 128):
        tried = {d: v if d == rows else -(-v // multiple) * multiple for d, v in sizes.items()}
        try:
            planner.make_plan(program, tried)        # the layout rules and whole-number dimensions
            return tried
        except EpicError:
            continue
    raise AssertionError(f"no sizes near {sizes} satisfy the layout rules of {program.name}")


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode()) & 0xFFFF


def prepare(name: str, config: str, shape) -> harness.Case:
    prog = harness.compiled(str(ROOT / name))
    return harness.prepare(str(ROOT / name), sizes_for(prog.program, *shape), *CONFIGS[config])


def loads_tiles_directly(case: harness.Case) -> bool:
    return any("Sm90AuxLoad<0," in s for s in case.sources)


def folds(case: harness.Case) -> bool:
    return any("epic_nodes::Sm90RowFold<" in s for s in case.sources)


def finishes_tiles_in_steps(case: harness.Case) -> bool:
    return any("j0 += 32 * " in s for s in case.sources)


def groups_rows(case: harness.Case) -> bool:
    return any("constexpr int kRowsPerWarp" in s for s in case.sources)


def same_as_unchanged(config: str, case: harness.Case, shape=None) -> str | None:
    """Why a variant configuration's case would build the same kernels as the plain one, or None."""
    if shape == FINISH_WIDE and not finishes_tiles_in_steps(case):
        return "no combine kernel finishing tiles: the wide rows test nothing the other sizes do not"
    if shape in (MANY_ROWS, MANY_COLS) and not groups_rows(case):
        return "no combine kernel that merges rows (columns) in groups: the many rows test nothing new"
    if config == "large_m_direct" and not loads_tiles_directly(case):
        return "no extra tiles to load: the same kernels as large_m"
    if config.endswith("_fold") and not folds(case):
        return "no row combine kernel to fold: the same kernels as without combine=fold"
    if config.endswith("_tail") and not any(k.kind == "tail" for k in case.program.kernels):
        return "no gemm the tail can run: the same kernels as without combine=tail"
    if config == "small_m_kernel" and not any(
            k.kind == "tail" for k in harness.prepare(case.path, case.sizes, case.config_m).program.kernels):
        return "the heuristic takes no tail at small M: the same kernels as small_m"
    return None


@pytest.fixture(scope="session")
def host_kernels():
    """Compile every kernel the cases need in one go; returns {(program, config): E702 message}."""
    hostsim.require_toolchain()
    unsupported, sources = {}, []
    for name in PROGRAMS:
        for config in CONFIGS:
            try:
                case = prepare(name, config, SHAPES[0])
            except EpicError as e:
                if "E702" not in e.codes:
                    raise
                unsupported[name, config] = str(e).splitlines()[0]
                continue
            if same_as_unchanged(config, case) is None:
                sources += case.sources
            if config == "large_m" or (config == "large_m_fold" and folds(case)):
                sources += prepare(name, config, WIDE).sources
    hostsim.compiler.prebuild(sources)
    return unsupported


@pytest.mark.parametrize("config, shape", CASES, ids=[f"{c}-{'x'.join(map(str, s))}" for c, s in CASES])
@pytest.mark.parametrize("name", PROGRAMS)
def test_generated_kernels_match_reference_on_host(host_kernels, name, config, shape):
    if (name, config) in host_kernels:
        pytest.skip(f"code generation does not support it yet: {host_kernels[name, config]}")
    case = prepare(name, config, shape)
    if (why := same_as_unchanged(config, case, shape)) is not None:
        pytest.skip(why)
    harness.check(case, seed_of(name, config, shape))


# Decode wider than N = 8192: the heuristic's 64x128 tiles (config.WIDE), with a row vector (bias +
# GELU), with every primitive (row and column statistics among them; N ragged on 128) and with 1x128
# fp8 blocks, each whole in one CTA instead of shared by a 1x2 cluster (N rounded up to 8320).
WIDE_DECODE = (77, 8264, 72)


@pytest.mark.parametrize("name", ["samples/bias_gelu.epi", "tests/programs/every_primitive.epi",
                                  "samples/fp8_block_quant.epi"])
def test_a_wide_decode_gemm_takes_64x128_tiles_and_matches_reference_on_host(name):
    hostsim.require_toolchain()
    case = prepare(name, "small_m", WIDE_DECODE)
    assert {c.tile for c in case.plan.configs.values()} == {(64, 128, 64)}, case.plan.configs
    harness.check(case, seed_of(name, "small_m", WIDE_DECODE))


def test_a_callers_value_for_a_defaulted_scalar_reaches_the_kernels():
    """eps = 0.5, not its default: the host kernels (scalars bound by the runtime's own
    binding.scalar_values) must match the reference run with 0.5, and differ from the default's run."""
    hostsim.require_toolchain()
    case = prepare("samples/residual_rmsnorm.epi", "small_m", SHAPES[1])
    (eps,) = [t for t in case.program.inputs() if t.name == "eps"]
    assert eps.is_scalar and eps.default is not None and eps.default != 0.5
    inputs = harness.make_inputs(case, seed=3)
    harness.check(case, 3, dict(inputs, eps=0.5))
    with harness.one_torch_thread():
        given, default = harness.run(case, dict(inputs, eps=0.5)), harness.run(case, inputs)
    assert not torch.equal(given["r"], default["r"]), "eps does not reach the kernels: the test proves nothing"


# bench.py's combine_rows(R), behind bench/interleaved.py's rowsR candidates: every grouped combine
# merges R rows (columns) per warp from the first one on (R = 1: a warp per row). Timing them on a GPU
# is only worth it if each computes the same statistics: ragged rows and columns, R = 4 and 8 beside
# the default R = 2 with 16 loads in flight per lane (the cases above), the warp per row, and R = 4 with
# 8 loads in flight (rows4x8, the form before).
@pytest.mark.parametrize("label", ["rows1", "rows4", "rows8", "rows4x8"])
@pytest.mark.parametrize("name", ["tests/programs/col_stats.epi", "samples/cross_entropy.epi"])
def test_grouped_combines_at_other_rows_per_warp_match_reference_on_host(name, label):
    hostsim.require_toolchain()
    bench = bench_module("bench")
    rows, in_flight = bench.combine_rows_label(label)
    with bench.combine_rows(rows, in_flight):
        case = prepare(name, "large_m", SHAPES[1])
    combines = [s for s in case.sources if "kRowsPerWarp" in s]
    assert combines and all(f"kRowsPerWarp = {rows};" in s and "kGroupFrom = 0;" in s for s in combines)
    assert all(f"kInFlight = {in_flight or 16};" in s for s in combines)
    harness.check(case, seed_of(name, "rows", rows, in_flight or 16))


# cross entropy's label logit: the combine kernel reads only the partial of the tile that holds column
# label[m] (split-reductions' pick; every other tile's is +0). Labels on both sides of tile edges, the
# last column, and outside the columns (HF's ignore_index -100, past V, the i32 extremes), in the warp
# per row (the default below 4096 rows) and with 2 rows per warp from the first row on.
@pytest.mark.parametrize("rows", [None, 2])
def test_picked_label_logit_matches_reference_for_labels_anywhere_on_host(rows):
    hostsim.require_toolchain()
    bench = bench_module("bench")
    with bench.combine_rows(rows):
        case = prepare("samples/cross_entropy.epi", "large_m", SHAPES[2])
    assert any("/ P.tile_n *" in s for s in case.sources), "the combine does not pick the tile"
    seed = seed_of("pick", rows)
    with harness.one_torch_thread():
        inputs = harness.make_inputs(case, seed)
    v = case.sizes["V"]
    special = [-100, -1, 0, 1, 63, 64, 127, 128, 191, 192, 255, 256, v - 1, v, v + 7, 2**31 - 1, -2**31]
    inputs["label"][:len(special)] = torch.tensor(special, dtype=inputs["label"].dtype)
    harness.check(case, seed, inputs)
