"""Generated kernels on a GPU against the reference interpreter (run on the H200: docs/GPU.md).

Every program of tests/gpu_cases.py, at tile-multiple and ragged sizes, on fresh random inputs
(seeds fixed and printed), every output and buffer poisoned first. Each kernel is compared with the
reference run of the *rewritten* program in dtype-rounding mode (the roundings the kernels make),
fed with the intermediate tensors the GPU's earlier kernels produced: a chain is then checked kernel
by kernel on exactly the inputs each kernel saw. Per-tile partial buffers are compared too (the
reference lays them out as the plan allocates them). The rewrite itself is proven against the
source program in tests/test_passes.py. Then: quantization against the reference quantizer applied
to the kernel's own f32 values (bit-exact), cross entropy against torch with no [M, V] allocation,
the pre-norm MLP block against HuggingFace's Llama modules, overridden scalars, bit-identical
reruns, torch.compile, refused tensors, and compute-sanitizer memcheck without torch's caching
allocator.
"""
import os
import shutil
import subprocess
import sys
import zlib

import pytest
import torch

import epic
from epic import dtypes, reference
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import gpus

from .gpu_cases import (BLOCK_EDGE_CASES, CLUSTER_1X2_CASE, DEPENDENT_FIRST_CASES, DETERMINISM_CASES, DYNAMIC_CASES, H100_TILE,
                        H100_TILE_CASES, HF_BLOCK_CASE, MEMCHECK_CASES, LOAD_HINT_CASES, MANY_ROWS_SIZES, PROGRAMS,
                        QUANT_SIZES, SERPENTINE_CASES, SHORT_A_CASES, SIZES, SPLIT_BLOCK_CASES, SPLIT_BLOCKS, SPLIT_LAST_CASES,
                        SPLIT_CASES, TAIL_SIZES,
                        TORCH_COMPILE_CASE, XENT_D, XENT_SIZES, cluster_1x2_config, fold_config, folds, gemm_options,
                        groups_rows, make_inputs, path, split_k_config, tail_config, to_device)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

_COMPILED = {}


def compiled(name):
    if name not in _COMPILED:
        _COMPILED[name] = epic.compile(path(name))
    return _COMPILED[name]


def seed_of(*parts) -> int:
    """A seed that is the same in every process (hash() of a str is not)."""
    return zlib.crc32(repr(parts).encode()) % 2**16


def as_values(t, dtype: str) -> torch.Tensor:
    """A kernel's buffer as the values the reference holds (int4 bytes unpacked)."""
    t = t.detach().cpu()
    if dtype == "i4":
        t = reference.unpack_int4(t)
    return t.double()


def check_close(name, got, want, dtype, fp8_gemm=False, f16_acc=False, narrowed=False, contraction=0):
    got = got.double()
    assert got.shape == want.shape, (name, got.shape, want.shape)
    nan_ok = torch.isnan(want)
    assert not (torch.isnan(got) & ~nan_ok).any(), f"{name}: {int(torch.isnan(got).sum())} elements unwritten (NaN)"
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got)), f"{name}: infinities/NaN in different places"
    got, want = got[finite], want[finite]
    if dtype in ("i8", "i32", "i4"):
        # integers computed from f32 math: a value at a rounding boundary may land one step apart
        # from float64 on a few elements; anything systematic (truncation, an offset) fails
        diff = (got - want).abs()
        off = int((diff > 0).sum())
        assert diff.max() <= 1 and off <= max(2, diff.numel() // 500), \
            f"{name}: {off} of {diff.numel()} integers off (max {diff.max().item()})"
        return
    scale = want.pow(2).mean().sqrt().item() + 1e-30 if want.numel() else 1.0
    if f16_acc and dtype not in ("e4m3", "e5m2"):
        # an f16 accumulator rounds to 11 bits at every k-step (the reference rounds once): a random walk
        # of ~K/16 half-ulp errors, ~2^-9 of the values' size at K = 256; a wrong tile or operand is O(1)
        rtol, atol = 2 ** -7, 2 ** -6 * scale
    elif dtype in ("bf16", "f16"):
        rtol, atol = 2 ** -7, 1e-3 * scale
    elif dtype in ("e4m3", "e5m2"):
        # one step of the format where f32 and float64 round apart -- a 3-bit (2-bit) mantissa, or the
        # subnormal step: an fp8 x fp8 gemm accumulates in less than f32 on Hopper (about 14 bits),
        # so values near a rounding boundary of the output land one step apart
        rtol = 2 ** -3 if dtype == "e4m3" else 2 ** -2          # one step of a 3-bit (2-bit) mantissa
        atol = max(1e-3 * scale, 2.0 ** (-9 if dtype == "e4m3" else -16))
    elif fp8_gemm:
        # an fp8 x fp8 wgmma accumulates in about 14 bits on Hopper, not f32: f32 values (and their
        # row statistics) sit ~1e-4 relative from float64's exact sum at K = 128; a wrong identity,
        # tile or operand is off by O(1)
        rtol, atol = 2 ** -9, 2 ** -10 * scale
    else:
        # f32 sums of `contraction` products: each addition rounds (the tensor cores' adder truncates),
        # so the error grows with the length, ~2^-24 per term of the values' size (dW of a backward
        # sums over all M rows: 1.2e-5 of it at M = 8191), at most 2^-10; a wrong tile or operand is O(1)
        rtol, atol = 1e-4, min(max(1e-5, 2 ** -24 * contraction), 2 ** -10) * scale
    bad = (got - want).abs() > atol + rtol * want.abs()
    if narrowed and dtype == "f32" and bad.any():
        # the program rounds a computed value to 16 bits inside the epilogue (the fused loss's bf16(acc)):
        # where f32 and float64 land on either side of a rounding boundary, one element moves by one
        # 16-bit step, and a statistic over it by that much; a few such elements, each within 2^-7
        near = (got - want).abs() <= 2 ** -7 * want.abs() + atol
        if bool(near[bad].all()) and int(bad.sum()) <= max(2, bad.numel() // 500):
            return
    if bad.any():
        idx = bad.nonzero()[:8].reshape(-1).tolist()
        detail = "; ".join(f"[{i}]: got {got[i].item():.6g} want {want[i].item():.6g}" for i in idx)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements off "
                             f"(rtol {rtol:.3g}, atol {atol:.3g}); {detail}")


def _narrows_inside(program) -> bool:
    """Whether an epilogue casts a computed value (not a loaded tensor) to a 16-bit float before using it."""
    from epic.ir import primitives as P
    return any(P.family(v.op) is P.Family.CAST and v.dtype.bits == 16 and v.dtype.is_float
               and not P.is_load(v.args[0]) for k in program.kernels for v in getattr(k, "values", ()))


def _contraction(program, name, sizes) -> int:
    """The length of the sum behind tensor `name`: the K of the gemm that stores it (0 for a combine's)."""
    from epic import sizes as S
    return max([S.evaluate(k.k, sizes) for k in program.kernels if k.kind == "gemm"
                and any(st.tensor == name for st in k.stores)], default=0)


def _recompute(prog, inputs, out, sizes, plan, name):
    """The reference value of `name`, computed from the GPU's values of every other tensor the kernels
    store (outputs a later kernel reads included), so only the kernel that stores `name` is under test."""
    others = {t.name: as_values(out[t.name], t.dtype.name) for t in plan.program.tensors.values()
              if t.role in ("out", "tmp", "buffer", "partial") and t.name != name and t.name not in plan.aliases}
    interp = reference.Interpreter(plan.program, sizes, exact=False, tiles=plan.tiles())
    interp.run(inputs, override=others)
    return interp.store[name]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernel_matches_reference(name, size):
    _check_against_reference(compiled(name), name, size)


@pytest.mark.parametrize("size", MANY_ROWS_SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_combine_kernels_over_many_rows_and_columns_match_reference(name, size):
    """From 4096 rows (columns) on, a warp of a row (column) combine kernel merges 2 of them at once."""
    if not groups_rows(compiled(name).program):
        pytest.skip("no combine kernel that merges rows (columns) in groups")
    _check_against_reference(compiled(name), name, size)


@pytest.mark.parametrize("name, size", SPLIT_CASES, ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else c)
def test_split_k_kernels_match_reference_and_are_deterministic(name, size):
    prog = epic.compile(path(name), config=split_k_config(compiled(name).program))
    assert all(c.splits == 3 for c in prog.plan(PROGRAMS[name](*size)).configs.values())
    out = _check_against_reference(prog, name, size)
    again = prog(poison=True, keep=True, **to_device(prog.program, make_inputs(prog.analysis.source_program,
                                                                               PROGRAMS[name](*size), seed_of(name, size))))
    for t, x in out.items():        # the partial sums are added in a fixed order: the same bytes every run
        assert torch.equal(x.reshape(-1).view(torch.uint8), again[t].reshape(-1).view(torch.uint8)), \
            f"{name}: {t} differs between runs"


# Swizzle and raster order are launch arguments of the kernel built for the default configuration
# (`epic tune` tries them on its best two tiles): every order must still visit each tile once.
# 8191 x 392 at pingpong 128x128 is 64 x 4 tiles, two waves, so the orders differ. 1000 x 1352 is
# 8 x 11 tiles: swizzle 8 pads the grouped dimension (11 columns to 16 along M, 8 rows to 16 along N)
# and epic's scheduler leaves the walked one unpadded (grouped_tile_scheduler.hpp).
LAUNCH_ORDERS = [(1, "m"), (1, "n"), (8, "m"), (8, "n")]


@pytest.mark.parametrize("size", [(8191, 392, 200), (1000, 1352, 200)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("swizzle,raster", LAUNCH_ORDERS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "samples/prenorm_mlp.epi",
                                  "samples/fp8_block_quant.epi", "samples/swiglu.epi"])
def test_every_swizzle_and_raster_order_covers_every_tile(name, swizzle, raster, size):
    base = compiled(name).program
    prog = epic.compile(path(name), config={k.name: {"swizzle": swizzle, "raster": raster}
                                            for k in base.kernels if k.kind == "gemm"})
    configs = prog.plan(PROGRAMS[name](*size)).configs.values()
    assert all((c.swizzle, c.raster) == (swizzle, raster) for c in configs)
    default = compiled(name).plan(PROGRAMS[name](*size)).configs.values()
    assert [c.key() for c in configs] == [c.key() for c in default]      # the same built kernels
    _check_against_reference(prog, name, size)


@pytest.mark.parametrize("swizzle,raster", LAUNCH_ORDERS, ids=lambda v: str(v))
def test_a_1x2_clusters_swizzle_covers_every_tile(swizzle, raster):
    """The same with the cluster along N (1x2): the walk and the grouping then step two columns of
    tiles at a time (1000 x 1352: 8 x 11 tiles, 12 columns in clusters of 2)."""
    name, size = CLUSTER_1X2_CASE          # its kernel is in tests.prebuild's list (swizzle, raster: launch sizes)
    prog = epic.compile(path(name), config={g: {"swizzle": swizzle, "raster": raster, **c}
                                            for g, c in cluster_1x2_config(compiled(name).program).items()})
    assert all(c.cluster == (1, 2) for c in prog.plan(PROGRAMS[name](*size)).configs.values())
    _check_against_reference(prog, name, size)


def _ids(cases):
    return [f"{n}-{'x'.join(map(str, s))}" + "".join(f"-{k}={v}" for k, v in e.items()) for n, s, e in cases]


@pytest.mark.parametrize("name, size", SPLIT_BLOCK_CASES, ids=_ids([(n, s, {}) for n, s in SPLIT_BLOCK_CASES]))
def test_blocks_split_over_a_cluster_with_several_tiles_per_cta_match_reference(name, size):
    """1x128 blocks on 64-wide tiles of 1x2 clusters, the two CTAs exchanging their halves' statistics
    through each other's shared memory, with more tiles than CTAs: a CTA's consecutive tiles reuse the
    words (one set per consumer warp group), told apart by their tags. Against the reference, twice."""
    prog = epic.compile(path(name), config=gemm_options(compiled(name).program, SPLIT_BLOCKS))
    sizes = PROGRAMS[name](*size)
    configs = prog.plan(sizes).configs
    assert all(c.tile == (64, 64, 64) and c.cluster == (1, 2) for c in configs.values())
    assert all(spec.pair_words for spec, _ in emit.units(prog.program, configs))
    n = sizes["N"] if "N" in sizes else sizes["H"] * sizes["Dh"]
    assert -(-sizes["M"] // 64) * -(-n // 64) > torch.cuda.get_device_properties(0).multi_processor_count
    for _ in range(2):
        _check_against_reference(prog, name, size)


@pytest.mark.parametrize("name, size", BLOCK_EDGE_CASES, ids=_ids([(n, s, {}) for n, s in BLOCK_EDGE_CASES]))
def test_block_statistics_at_the_tails_first_row_count_match_reference(name, size):
    """The plan's default on either side of BLOCK_TAIL_ROWS: at 64 rows the 1x128 blocks in the gemm's
    epilogue (a 1x2 cluster exchanging halves), at 65 the tail kernel's."""
    prog = compiled(name)
    kinds = [k.kind for k in prog.plan(PROGRAMS[name](*size)).program.kernels]
    assert kinds == (["gemm"] if size[0] == 64 else ["gemm", "tail"])
    _check_against_reference(prog, name, size)


@pytest.mark.parametrize("name, size", H100_TILE_CASES, ids=_ids([(n, s, {}) for n, s in H100_TILE_CASES]))
def test_the_h100_tile_matches_reference(name, size):
    """The tile an H100's heuristic gives element-wise and block-quantizing epilogues at N = 4096
    (cooperative 128x256, cluster 2x1), on whatever GPU runs the suite, at ragged sizes, into poisoned
    outputs."""
    prog = epic.compile(path(name), config=gemm_options(compiled(name).program, H100_TILE))
    assert all(c.tile == (128, 256, 64) for c in prog.plan(PROGRAMS[name](*size)).configs.values())
    _check_against_reference(prog, name, size)


def test_a_call_plans_for_the_gpu_it_runs_on():
    """The heuristic's tiles are this GPU's (plan/gpus.py): bias + GELU at M = 8192, N = K = 4096 takes
    the cooperative 128x256 tile on an H100 SXM and pingpong 128x128 elsewhere."""
    key = gpus.key(torch.cuda.get_device_name())
    plan = compiled("samples/bias_gelu.epi").plan(dict(M=8192, K=4096, N=4096))
    assert plan.gpu == key
    assert plan.configs["up"].tile == ((128, 256, 64) if key == gpus.H100 else (128, 128, 64))


@pytest.mark.parametrize("name, size, extra", SERPENTINE_CASES, ids=_ids(SERPENTINE_CASES))
def test_serpentine_tile_order_matches_reference_and_the_linear_order_bit_for_bit(name, size, extra):
    """tile_order=serpentine hands the CTAs the same tiles in another order: within the reference's
    tolerance, and (each tile computed the same way) the same bytes as the linear order's kernels."""
    _check_same_bytes(name, size, {"tile_order": "serpentine", **extra}, {"tile_order": "linear"})


@pytest.mark.parametrize("name, size, extra", DYNAMIC_CASES, ids=_ids(DYNAMIC_CASES))
def test_dynamic_tile_order_matches_reference_and_the_linear_order_bit_for_bit(name, size, extra):
    """tile_order=dynamic hands the same tiles to whichever cluster asks first: within the reference's
    tolerance, and (each tile computed the same way) the same bytes as the static order's kernels."""
    _check_same_bytes(name, size, {"tile_order": "dynamic", **extra}, {"tile_order": "linear"})


# a 2x1 cluster, a 1x2 cluster and the cooperative schedule
DYNAMIC_COUNTER_CASES = DYNAMIC_CASES[:1] + DYNAMIC_CASES[3:5]


@pytest.mark.parametrize("name, size, extra", DYNAMIC_COUNTER_CASES, ids=_ids(DYNAMIC_COUNTER_CASES))
def test_dynamic_tile_order_leaves_its_counter_ready_for_the_next_call(name, size, extra):
    """Each launch must leave the tile counter at 0 (atom.inc wraps after the launch's last increment):
    six calls back to back on one stream, each into poisoned outputs, give the static order's bytes, and
    a call at other sizes between them (another limit on the same counter) changes nothing."""
    program = compiled(name).program
    prog = epic.compile(path(name), config=gemm_options(program, {"tile_order": "dynamic", **extra}))
    static = epic.compile(path(name), config=gemm_options(program, {"tile_order": "linear", **extra}))
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, PROGRAMS[name](*size),
                                                 seed_of(name, size, "again")))
    _six_calls_write(static(keep=True, **inputs), prog, name, size, inputs, "the static order's kernels")


def _six_calls_write(want: dict, prog, name, size, inputs: dict, what: str):
    """Six calls of prog back to back on one stream, each into poisoned outputs, write want's bytes; a
    call at other sizes after the third changes nothing (a kernel that leaves state for the next launch
    fails here)."""
    other = PROGRAMS[name](size[0] // 2 + 1, size[1], size[2])
    for i in range(6):
        if i == 3:
            prog(poison=True, **to_device(prog.program, make_inputs(prog.analysis.source_program, other, 7)))
        got = prog(poison=True, keep=True, **inputs)
        torch.cuda.synchronize()
        for t, x in want.items():
            assert torch.equal(x.reshape(-1).view(torch.uint8), got[t].reshape(-1).view(torch.uint8)), \
                f"{name}: call {i + 1} wrote other bytes into {t} than {what}"


@pytest.mark.parametrize("name, size, extra", SPLIT_LAST_CASES, ids=_ids(SPLIT_LAST_CASES))
def test_a_last_round_split_along_k_matches_reference(name, size, extra):
    """tile_order=split_last: the CTAs with no tile left in the last round compute partial sums of its
    tiles' k-blocks, which each tile's final piece adds before its epilogue. Against the reference, at
    ragged sizes, into poisoned outputs (a piece whose epilogue ran twice or never shows)."""
    config = gemm_options(compiled(name).program, {"tile_order": "split_last", **extra})
    prog = epic.compile(path(name), config=config)
    assert all(c.tile_order == "split_last" for c in prog.plan(PROGRAMS[name](*size)).configs.values())
    _check_against_reference(prog, name, size)


@pytest.mark.parametrize("name, size, extra", SPLIT_LAST_CASES[:2], ids=_ids(SPLIT_LAST_CASES[:2]))
def test_a_last_round_split_along_k_leaves_its_counters_ready_for_the_next_call(name, size, extra):
    """Each final piece sets its tile's counter back to zero: six calls back to back on one stream, each
    into poisoned outputs, give the bytes of a first call checked against the reference (the partial sums
    are added in one order, so the split is deterministic), and a call at half the rows between them (too
    few tiles to split) changes nothing. A counter left raised would let a final piece read partial sums not
    yet stored."""
    program = compiled(name).program
    prog = epic.compile(path(name), config=gemm_options(program, {"tile_order": "split_last", **extra}))
    first = {t: x.clone() for t, x in _check_against_reference(prog, name, size).items()}   # the first call
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, PROGRAMS[name](*size),
                                                 seed_of(name, size)))                     # its inputs again
    _six_calls_write(first, prog, name, size, inputs, "the first call (checked against the reference)")


@pytest.mark.parametrize("name, size, extra", LOAD_HINT_CASES, ids=_ids(LOAD_HINT_CASES))
def test_loads_without_a_cache_policy_match_reference_and_the_default_bit_for_bit(name, size, extra):
    """load_hint=none changes only the L2 policy the mainloop's TMA loads carry: within the reference's
    tolerance, and the same bytes as the kernels with CUTLASS's policy."""
    _check_same_bytes(name, size, {"load_hint": "none", **extra}, {"load_hint": "evict_normal"})


@pytest.mark.parametrize("name, size, extra", SHORT_A_CASES, ids=_ids(SHORT_A_CASES))
def test_a_short_box_of_a_matches_reference_and_the_tiles_rows_bit_for_bit(name, size, extra):
    """The plan's a_rows below 33 rows (the mainloop reads 8, 16 or 32 rows of A, the tile's other rows
    left as shared memory held them): within the reference's tolerance, and the same bytes as the
    kernels that read the tile's rows (a_rows=0)."""
    prog = epic.compile(path(name), config=gemm_options(compiled(name).program, extra) if extra else None)
    assert any(c.a_rows for c in prog.plan(PROGRAMS[name](*size)).configs.values())
    _check_same_bytes(name, size, extra, {**extra, "a_rows": 0})


def _check_same_bytes(name, size, options: dict, baseline: dict):
    """The program with `options` on every gemm against the reference, then bit for bit against the
    same with `baseline` over them (an option that must not change any tile's arithmetic)."""
    config = gemm_options(compiled(name).program, options)
    prog = epic.compile(path(name), config=config)
    sizes = PROGRAMS[name](*size)
    chosen = prog.plan(sizes).configs.values()
    assert all(getattr(c, k) == v for c in chosen for k, v in options.items())
    out = _check_against_reference(prog, name, size)
    base = epic.compile(path(name), config={k: {**v, **baseline} for k, v in config.items()})
    want = base(poison=True, keep=True, **to_device(prog.program, make_inputs(prog.analysis.source_program, sizes,
                                                                               seed_of(name, size))))
    torch.cuda.synchronize()
    for t, x in out.items():
        assert torch.equal(x.reshape(-1).view(torch.uint8), want[t].reshape(-1).view(torch.uint8)), \
            f"{name}: {t} differs from the kernels with {baseline}"


_FOLDED = {}


def folded(name):
    """The program with combine=fold on every gemm (skips the test where nothing folds)."""
    if not folds(compiled(name).program):
        pytest.skip("no row combine kernel to fold: the same kernels as without combine=fold")
    if name not in _FOLDED:
        _FOLDED[name] = epic.compile(path(name), config=fold_config(compiled(name).program))
    return _FOLDED[name]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_folded_combine_kernels_match_reference_and_are_deterministic(name, size):
    """combine=fold: the last CTA of each row block merges the partials inside the gemm; one launch
    fewer per folded combine, results within the reference's tolerance and the same bytes every run
    (the merge is in tile order whichever CTA finishes last)."""
    prog = folded(name)
    sizes = PROGRAMS[name](*size)
    bound = prog._bind(sizes, torch.device("cuda", torch.cuda.current_device()))
    combines = sum(k.kind == "combine" for k in prog.program.kernels)
    assert len(bound.launches) < len(prog.program.kernels) or not combines
    out = _check_against_reference(prog, name, size)
    for _ in range(2):
        again = prog(poison=True, keep=True, **to_device(prog.program, make_inputs(
            prog.analysis.source_program, sizes, seed_of(name, size))))
        for t, x in out.items():
            assert torch.equal(x.reshape(-1).view(torch.uint8), again[t].reshape(-1).view(torch.uint8)), \
                f"{name}: {t} differs between runs"


@pytest.mark.parametrize("size", TAIL_SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_tail_kernels_match_reference_and_are_deterministic(name, size):
    """combine=tail (epic/plan/tail.py): the gemm stores its accumulator, one kernel per row runs the
    epilogue and the row statistics after it; every buffer within the reference's tolerance (each
    kernel on the GPU's inputs to it) and the same bytes every run."""
    config = tail_config(compiled(name).program)
    if not config:
        pytest.skip("no gemm the tail can run")
    prog = epic.compile(path(name), config=config)
    sizes = PROGRAMS[name](*size)
    assert sum(k.kind == "tail" for k in prog.plan(sizes).program.kernels) == len(config)
    out = _check_against_reference(prog, name, size)
    again = prog(poison=True, keep=True, **to_device(prog.program, make_inputs(
        prog.analysis.source_program, sizes, seed_of(name, size))))
    for t, x in out.items():
        assert torch.equal(x.reshape(-1).view(torch.uint8), again[t].reshape(-1).view(torch.uint8)), \
            f"{name}: {t} differs between runs"


def test_folded_combine_on_two_streams_at_once():
    """Each stream has its own row block counters: calls racing on two streams give the bytes of one
    call alone (shared counters would let one launch's CTAs complete the other's row blocks)."""
    name = "samples/residual_rmsnorm.epi"
    prog = folded(name)
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, dict(M=8191, D=4096), 5))
    want = {k: v.clone() for k, v in prog(**inputs).items()}
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    torch.cuda.synchronize()
    results = []
    for _ in range(10):
        for st in streams:
            with torch.cuda.stream(st):
                results.append(prog(**inputs))
    torch.cuda.synchronize()
    for got in results:
        for k in want:
            assert torch.equal(got[k].reshape(-1).view(torch.uint8), want[k].reshape(-1).view(torch.uint8)), k


def test_a_captured_folded_program_replays_like_calls():
    name = "samples/residual_rmsnorm.epi"
    prog = folded(name)
    sizes = PROGRAMS[name](77, 392, 200)
    first = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed_of(name, "fold", 1)))
    second = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed_of(name, "fold", 2)))
    g = prog.capture(**first)
    for inputs in (first, second, first, second):
        want = {k: v.clone() for k, v in prog(**inputs).items()}
        got = g(**inputs)
        torch.cuda.synchronize()
        for k in want:
            assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), f"{name}: {k}"


def _check_against_reference(prog, name, size) -> dict:
    sizes = PROGRAMS[name](*size)
    seed = seed_of(name, size)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed=seed)
    out = prog(poison=True, keep=True, **to_device(prog.program, inputs))
    torch.cuda.synchronize()
    plan = prog.plan(sizes)
    program = plan.program       # the plan's kernels (a gemm with combine=tail and its tail kernel)
    # a buffer finished in place (plan.aliases) holds the finished tile after the call: that one is checked
    checked = [t for t in program.tensors.values()
               if t.role in ("out", "tmp", "buffer", "partial") and t.name not in plan.aliases]
    fp8 = any(program.tensors[k.a].dtype.name in ("e4m3", "e5m2") for k in program.kernels if hasattr(k, "a"))
    f16_acc = any(getattr(k, "acc", None) is dtypes.F16 for k in program.kernels)
    narrowed = _narrows_inside(program)
    for t in checked:
        want = _recompute(prog, inputs, out, sizes, plan, t.name)
        try:
            check_close(t.name, as_values(out[t.name], t.dtype.name), want, t.dtype.name, fp8_gemm=fp8,
                        f16_acc=f16_acc, narrowed=narrowed, contraction=_contraction(program, t.name, sizes))
        except AssertionError as e:
            raise AssertionError(f"{name} at {sizes} (seed {seed}): {e}") from None
    return out


def _quantize(a: torch.Tensor, block: int, qmax: float, lo: float, hi: float, integer: bool, scale_dtype):
    """The reference quantizer (docs: q = x / s, s = max(block amax, 1e-12) / qmax, saturating) applied
    in float64 to the kernel's own f32 values a; s is the f32 the kernel divides by."""
    a = a.double().cpu()
    m, n = a.shape
    amax = a.abs().reshape(m, n // block, block).amax(-1)
    s = (torch.clamp(amax, min=1e-12) / qmax).float().double()       # f32 division of f32 values
    q = (a.reshape(m, n // block, block) / s.unsqueeze(-1)).float().double().reshape(m, n)
    q = q.clamp(lo, hi)
    if integer:
        q = torch.round(q)
    return q, s.to(scale_dtype).double()


@pytest.mark.parametrize("size", QUANT_SIZES, ids=lambda s: "x".join(map(str, s)))
def test_quantization_is_the_reference_quantizer_of_the_kernels_values(size):
    prog = compiled("tests/programs/quant_exposed.epi")
    m, n, k = size
    sizes = dict(M=m, K=k, N=n)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed=seed_of("quant", size))
    out = prog(poison=True, **to_device(prog.program, inputs))
    torch.cuda.synchronize()
    for q_name, s_name, a_name, block, qmax, lo, hi, integer, sdt in [
            ("q", "q_scale", "a8", 128, 448.0, -448.0, 448.0, False, torch.float32),
            ("qi", "qi_scale", "ai", 64, 127.0, -128.0, 127.0, True, torch.float32),
            ("q4", "q4_scale", "a4", 32, 7.0, -8.0, 7.0, True, torch.bfloat16)]:
        q, s = _quantize(out[a_name], block, qmax, lo, hi, integer, sdt)
        dt = prog.program.tensors[q_name].dtype
        if dt.name == "e4m3":
            q = q.to(torch.float8_e4m3fn).double()
        got_q = as_values(out[q_name], dt.name)
        got_s = out[s_name].double().cpu()
        assert torch.equal(got_s, s), f"{s_name}: {int((got_s != s).sum())} scales differ"
        ties = (q - got_q).abs() > 0
        assert int(ties.sum()) <= max(1, q.numel() // 10000), \
            f"{q_name}: {int(ties.sum())} of {q.numel()} quantized values differ (first at {ties.nonzero()[:3].tolist()})"


@pytest.mark.parametrize("m, v", XENT_SIZES)
def test_cross_entropy_without_logits(m, v):
    """loss = lse - target logit, from per-tile log-sum-exps: no [M, V] tensor ever exists."""
    import torch.nn.functional as F
    prog = compiled("samples/cross_entropy.epi")
    d = XENT_D
    g = torch.Generator(device="cuda").manual_seed(seed_of("xent", m, v))
    x = torch.randn(m, d, device="cuda", generator=g).bfloat16()
    w = (torch.randn(v, d, device="cuda", generator=g) / d ** 0.5).bfloat16()
    label = torch.randint(0, v, (m,), device="cuda", generator=g, dtype=torch.int32)
    prog(x=x, w=w.t(), label=label)                   # build and bind first
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = prog(x=x, w=w.t(), label=label)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    if m * v >= 1 << 22:     # (tiny vocabularies: the per-tile partials are as large as logits would be)
        assert peak < m * v * 2 // 8, f"the call allocated {peak:,} bytes; [M, V] bf16 logits would be {m * v * 2:,}"
    logits = x.double() @ w.double().t()
    want = F.cross_entropy(logits, label.long(), reduction="none")
    lse = torch.logsumexp(logits, -1)
    rel = ((out["loss"].double() - want).norm() / want.norm()).item()
    assert rel <= 1e-5, rel
    assert ((out["lse_out"].double() - lse).abs() / lse.abs()).max().item() <= 1e-5
    f32 = F.cross_entropy(logits.float(), label.long(), reduction="none")       # torch on fp32 logits
    assert torch.allclose(out["loss"], f32, rtol=1e-4, atol=1e-4)


def test_prenorm_mlp_matches_huggingface_llama_block():
    """o_proj + residual -> LlamaRMSNorm -> LlamaMLP (+ residual) at Llama-3-8B sizes: epic's three-gemm
    chain is as close to float64 as HuggingFace's own bf16 block is."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    from epic.weights import interleave_gate_up
    torch.manual_seed(0)
    name, sizes = HF_BLOCK_CASE
    d, f, m = sizes["D"], sizes["F"], sizes["M"]
    cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=f, rms_norm_eps=1e-6, hidden_act="silu")
    mlp = LlamaMLP(cfg).cuda().bfloat16()
    norm = LlamaRMSNorm(d, eps=1e-6).cuda().bfloat16()
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    wo = (torch.randn(d, d, device="cuda") / d ** 0.5).bfloat16()
    attn = torch.randn(m, d, device="cuda").bfloat16()
    z = torch.randn(m, d, device="cuda").bfloat16()
    with torch.no_grad():
        h = attn @ wo.t() + z
        hf = mlp(norm(h)) + h
        # float64 of the same block
        h64 = attn.double() @ wo.double().t() + z.double()
        n64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
        g64, u64 = n64 @ mlp.gate_proj.weight.double().t(), n64 @ mlp.up_proj.weight.double().t()
        want = (torch.nn.functional.silu(g64) * u64) @ mlp.down_proj.weight.double().t() + h64
    prog = compiled(name)
    out = prog(attn=attn, wo=wo.t(), z=z, gamma=norm.weight.detach(),
               wgu=interleave_gate_up(mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()),
               wd=mlp.down_proj.weight.detach().t())
    err = lambda y: ((y.double() - want).norm() / want.norm()).item()   # noqa: E731
    assert err(out["y"]) <= max(2 * err(hf), 1e-2), (err(out["y"]), err(hf))


def test_overridden_scalars_reach_the_kernel():
    prog = compiled("samples/residual_rmsnorm.epi")
    sizes = dict(M=77, D=392)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed=7)
    dev = to_device(prog.program, inputs)
    default = prog(**dev)["r"].double().cpu()
    for eps in (0.25, 3.0):
        got = prog(**dev, eps=eps)["r"].double().cpu()
        want = reference.run(prog.analysis.source_program, dict(inputs, eps=eps), exact=False, sizes=sizes)["r"]
        check_close("r", got, want, "f32")
        assert not torch.allclose(got, default)


def test_results_do_not_depend_on_the_run():
    """Deterministic partials: the same inputs give bit-identical outputs, run after run."""
    for name, sizes in DETERMINISM_CASES:
        prog = compiled(name)
        inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 1))
        first = prog(**inputs)
        for _ in range(3):
            again = prog(**inputs)
            for k in first:
                assert torch.equal(first[k].reshape(-1).view(torch.uint8), again[k].reshape(-1).view(torch.uint8)), \
                    (name, k)


@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "samples/prenorm_mlp.epi", "samples/bias_gelu.epi"])
def test_a_captured_program_replays_like_calls(name):
    """A CUDA graph of one call (combine kernels launched as programmatic dependents inside it) gives
    the bytes direct calls give, for the recorded inputs and for new ones copied in."""
    prog = compiled(name)
    sizes = PROGRAMS[name](77, 392, 200)
    first = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed_of(name, "capture", 1)))
    second = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed_of(name, "capture", 2)))
    g = prog.capture(**first)
    for inputs in (first, second, first):
        want = {k: v.clone() for k, v in prog(**inputs).items()}
        got = g(**inputs)
        torch.cuda.synchronize()
        for k in want:
            assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), f"{name}: {k}"
    some = next(k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim() == 2)
    with pytest.raises(EpicError) as info:
        g(**{some: first[some][:-1]})
    assert info.value.codes == ["E609"]


def _same_bytes(want: dict, how: str, got: dict) -> None:
    """After the stream's work: every output in `want` has the same bytes in `got` (how: the case)."""
    torch.cuda.synchronize()
    for k in want:
        assert torch.equal(got[k].view(-1).view(torch.uint8), want[k].view(-1).view(torch.uint8)), f"{how}: {k}"


def _poison(x: torch.Tensor) -> None:
    x.fill_(float("nan"))
    torch.cuda.synchronize()


def _same_bytes_in_a_graph(want: dict, how: str, before, call, x: torch.Tensor) -> None:
    """before() and call() captured in one CUDA graph, replayed after x is poisoned: call's outputs
    have the bytes in `want` (how: what before() does)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        before()
        out = call()
    _poison(x)
    graph.replay()
    _same_bytes(want, f"after {how} in a CUDA graph", out)


@pytest.mark.parametrize("name,sizes", DEPENDENT_FIRST_CASES, ids=[n for n, _ in DEPENDENT_FIRST_CASES])
def test_a_decode_call_waits_for_what_the_caller_ran_before_it(name, sizes, monkeypatch):
    """By default (EPIC_DEPENDENT_FIRST unset) a one-gemm program's gemm of at most 64 rows is launched
    as a programmatic dependent of the caller's last kernel on the stream (epic/plan/launch.py). Its A
    operand written just before the call -- by a long reduction kernel, by a copy (not a kernel), by
    another stream's kernel waited for, and by a kernel in the same CUDA graph -- gives the bytes of a
    call made after a synchronize; the operand is poisoned before each write, so a gemm that read it
    early would differ."""
    monkeypatch.delenv("EPIC_DEPENDENT_FIRST", raising=False)
    prog = epic.compile(path(name))                  # a fresh program: it binds with the default rule
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed=seed_of(name, "pdl")))
    a = prog.program.kernels[0].a
    x = inputs[a]
    parts = torch.randn(4096, x.numel(), device=x.device).to(x.dtype) / 64      # about 40 us to reduce

    def write(into):
        torch.sum(parts, 0, out=into.view(-1))

    write(x)
    torch.cuda.synchronize()
    want = {k: v.clone() for k, v in prog(**inputs).items()}
    assert prog._choose(inputs).launches[0].dims[6] == 3        # a dependent, prefetching its B
    source = x.clone()
    torch.cuda.synchronize()

    _poison(x)
    write(x)
    _same_bytes(want, "after a kernel", prog(**inputs))
    _poison(x)
    x.copy_(source)
    _same_bytes(want, "after a copy", prog(**inputs))
    _poison(x)
    other = torch.cuda.Stream()
    other.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(other):
        write(x)
    torch.cuda.current_stream().wait_stream(other)
    _same_bytes(want, "after another stream's kernel", prog(**inputs))
    for how, before in (("a kernel", lambda: write(x)), ("a copy", lambda: x.copy_(source))):
        _same_bytes_in_a_graph(want, how, before, lambda: prog(**inputs), x)


@pytest.mark.parametrize("tensor", ["z", "gamma"])
def test_a_tail_reads_inputs_written_just_before_the_call(tensor, monkeypatch):
    """combine=tail loads the call's inputs (residual + RMSNorm's z and gamma) before it waits for the gemm
    (codegen/tail.py): the gemm, a dependent of the caller's last kernel, lets it start only after its
    own wait. Written just before the call by a long kernel, in the same CUDA graph too, each gives the
    bytes of a call made after a synchronize; the input is poisoned before each write."""
    monkeypatch.delenv("EPIC_DEPENDENT_FIRST", raising=False)
    name, sizes = "samples/residual_rmsnorm.epi", dict(M=64, D=4096)
    prog = epic.compile(path(name), config={"o_proj": {"combine": "tail"}})
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed=seed_of(name, "tail-pdl")))
    x = inputs[tensor]
    parts = torch.randn(256, x.numel(), device=x.device).to(x.dtype) / 16

    def write():
        torch.sum(parts, 0, out=x.view(-1))

    write()
    torch.cuda.synchronize()
    want = {k: v.clone() for k, v in prog(**inputs).items()}
    assert [k.kind for k in prog.plan(sizes).program.kernels] == ["gemm", "tail"]

    for _ in range(3):
        _poison(x)
        write()
        _same_bytes(want, "after a kernel", prog(**inputs))
    _same_bytes_in_a_graph(want, "a kernel", write, lambda: prog(**inputs), x)


def test_inside_torch_compile():
    name, sizes = TORCH_COMPILE_CASE
    prog = compiled(name)
    op = prog.torch_op()

    def model(x, w, bias):
        return op(x=x, w=w, bias=bias)["y"].float() * 2

    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 2))
    eager = model(**inputs)
    fn = torch.compile(model, fullgraph=True)
    assert torch.equal(fn(**inputs), eager)


@pytest.mark.parametrize("size", [(1, 392, 200), (300, 264, 136)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_compiled_call_path_gives_the_python_paths_bytes(name, size):
    """The compiled launcher (runtime/fastcall.py) runs a bound signature: every buffer (keep=True)
    bit-identical to the Python path's poisoned run, so every element was written by the kernels."""
    from epic.runtime import binding, derived, fastcall
    if fastcall.mode() == "ctypes":                  # the caller turned the launcher off: nothing to compare
        pytest.skip("EPIC_LAUNCHER=ctypes: the compiled call path is off")
    assert fastcall.library() is not None, fastcall.why_not()   # built now: a call would not wait for it
    prog = epic.compile(path(name))                  # a fresh program: its first call binds
    has_derived = bool(derived.specs(prog.program))
    sizes = PROGRAMS[name](*size)
    inputs = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed=seed_of("fast", name, size)))
    slow = prog(poison=True, keep=True, **inputs)
    fast = prog(keep=True, **inputs)
    torch.cuda.synchronize()
    assert fastcall.why_not() is None and prog._fast is not None and len(prog._fast) == 1
    if has_derived:          # call() reads the caller's keywords only: the derived tensors come from the host step
        exe = prog._choose(inputs)
        scalars = binding.scalar_values([t for t in prog.inputs if t.is_scalar], inputs)
        got, failed, _, out = prog._fast.run(exe.inputs(inputs, prog._derived), [scalars[n] for n in exe.scalar_names],
                                             torch.cuda.current_stream().cuda_stream, True)
        assert got >= 0 and failed == -1
        direct = dict(zip(exe.keep, out))
    else:
        direct = prog._fast.call(inputs, True)       # the launcher took the call itself (not Python's path)
    assert type(direct) is dict and set(direct) == set(slow)
    assert set(fast) == set(slow)
    for k in slow:
        assert torch.equal(fast[k].reshape(-1).view(torch.uint8), slow[k].reshape(-1).view(torch.uint8)), k
        assert fast[k].data_ptr() != slow[k].data_ptr()
        assert torch.equal(direct[k].reshape(-1).view(torch.uint8), slow[k].reshape(-1).view(torch.uint8)), k
    outputs = prog(**inputs)
    assert set(outputs) == {t.name for t in prog.outputs}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_unfused_form_on_the_gpu_matches_the_kernels(name):
    """fallback="eager" (runtime/unfused.py: cuBLAS with an f32 output, then torch ops) against the
    fused kernels' outputs on the same inputs: the same meaning, to the outputs' tolerance."""
    sizes = PROGRAMS[name](300, 264, 136)
    fused = compiled(name)
    inputs = to_device(fused.program, make_inputs(fused.analysis.source_program, sizes, seed=seed_of("unfused", name)))
    want = fused(**inputs)
    got = epic.compile(path(name), fallback="eager")(**inputs)
    torch.cuda.synchronize()
    assert set(got) == set(want)
    fp8 = any(fused.program.tensors[k.a].dtype.name in ("e4m3", "e5m2") for k in fused.program.kernels if hasattr(k, "a"))
    f16_acc = any(getattr(k, "acc", None) is dtypes.F16 for k in fused.program.kernels)
    chain = any(t.role == "tmp" for t in fused.program.tensors.values())
    for t in fused.outputs:
        assert got[t.name].dtype == want[t.name].dtype and got[t.name].shape == want[t.name].shape, t.name
        if chain and t.dtype.name in ("bf16", "f16"):       # a bf16 intermediate one step apart, carried on
            g, w = got[t.name].double().cpu(), want[t.name].double().cpu()
            # random saved statistics (a negative mean square) make NaN rows: in the same places in both
            assert torch.equal(torch.isnan(g), torch.isnan(w)), f"{t.name}: NaN in different places"
            g, w = g[~torch.isnan(w)], w[~torch.isnan(w)]
            assert w.numel() == 0 or ((g - w).abs() <= 2 ** -6 * w.abs() + 2 ** -6 * w.abs().max()).all(), t.name
            continue
        check_close(t.name, as_values(got[t.name], t.dtype.name), as_values(want[t.name], t.dtype.name),
                    t.dtype.name, fp8_gemm=fp8, f16_acc=f16_acc)


def test_wrong_tensors_are_refused_before_launch():
    prog = epic.compile(path("samples/bias_gelu.epi"))
    sizes = dict(M=64, K=128, N=256)
    good = to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, 3))
    prog(**good)                                   # bound: later calls go through the compiled path first
    with pytest.raises(EpicError) as info:
        prog(**dict(good, w=good["w"].contiguous()))          # row-major B
    assert info.value.codes == ["E605"]
    with pytest.raises(EpicError) as info:
        prog(**dict(good, x=good["x"].cpu()))
    assert info.value.codes == ["E604"]
    unaligned = torch.empty(64 * 128 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(64, 128)
    with pytest.raises(EpicError) as info:
        prog(**dict(good, x=unaligned))
    assert info.value.codes == ["E606"]


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not installed")
def test_ragged_cases_are_memcheck_clean():
    """With torch's caching allocator off, every buffer is its own allocation: an out-of-bounds
    access cannot hide inside pooled memory."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    code = ("import torch, epic\n"
            "from tests.gpu_cases import make_inputs, to_device, path\n"
            f"for name, s in {MEMCHECK_CASES!r}:\n"
            "    p = epic.compile(path(name))\n"
            "    out = p(poison=True, **to_device(p.program, make_inputs(p.analysis.source_program, s, 5)))\n"
            "    torch.cuda.synchronize(); print('ran', name, {k: tuple(v.shape) for k, v in out.items()})\n")
    r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", sys.executable, "-c", code],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(path(".")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "ERROR SUMMARY: 0 errors" in r.stdout + r.stderr
