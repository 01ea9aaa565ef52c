"""`epic tune` without a GPU: the search space, the tuning database, the search (with a timer and
a builder standing in for the GPU and nvcc), and epic.compile consulting the database. The GPU run
of the real thing is in docs/PERFORMANCE.md."""
import json
import warnings
from dataclasses import replace
from unittest import mock

import pytest

import epic
from epic.diagnostics import Diagnostic, EpicError
from epic.plan import config as config_mod, planner, tile_grid
from epic.runtime import compiled as compiled_mod
from epic.runtime import tuning_db as database
from epic.tuning import space, tuner

from .conftest import ROOT

RESID = str(ROOT / "samples" / "residual_rmsnorm.epi")
MLP = str(ROOT / "samples" / "prenorm_mlp.epi")
QUANT = str(ROOT / "samples" / "fp8_block_quant.epi")


def gemm(path):
    prog = epic.compile(path)
    return prog, next(k for k in prog.program.kernels if k.kind == "gemm")


# ---------------------------------------------------------------- the search space
@pytest.mark.parametrize("path,sizes", [(RESID, dict(M=8192, D=4096)), (RESID, dict(M=77, D=392)),
                                        (QUANT, dict(M=8192, D=4096, N=14336)), (MLP, dict(M=300, D=4096, F=14336))])
def test_candidates_are_legal_distinct_and_start_with_the_heuristic(path, sizes):
    prog, k = gemm(path)
    m, n = sizes["M"], planner.sizes_mod.evaluate(k.n, sizes)
    found = space.candidates(k, prog.program.tensors, m, n, limit=6, program=prog.program)
    assert found[0] == planner.make_plan(prog.program, sizes).configs[k.name]      # the plan's heuristic
    assert (found[0].combine == "tail") == (path == RESID and m <= 256)            # plan/tail.py's decode tail
    assert 2 <= len(found) <= 20 and len(set(found)) == len(found)      # + 4 swizzles, 4 rasters, 2 epilogue tiles, 1 depth, 3 split-K
    assert len({c.key() for c in found[:6]}) == min(6, len(found[:6]))       # distinct built kernels first
    for cfg in found:                  # the plan accepts each as an override and picks exactly it
        plan = planner.make_plan(prog.program, sizes, {k.name: space.override(cfg)})
        assert plan.configs[k.name] == cfg


@pytest.mark.parametrize("path,sizes,tail_at", [
    (str(ROOT / "samples" / "fp8_block_quant.epi"), dict(M=128, D=4096, N=4096), 0),    # the heuristic's tail
    (str(ROOT / "samples" / "fp8_block_quant.epi"), dict(M=64, D=4096, N=4096), -1),    # up to 64 rows: timed too
    (str(ROOT / "samples" / "fp8_block_quant.epi"), dict(M=16, D=4096, N=4096), -1),
    (str(ROOT / "samples" / "cross_entropy.epi"), dict(M=64, D=4096, V=128256), -1),     # stores no tile
    (str(ROOT / "samples" / "bias_gelu.epi"), dict(M=64, K=4096, N=4096), None),         # no statistic
])
def test_the_tuner_times_the_decode_tail_wherever_a_gemm_can_take_it(path, sizes, tail_at):
    prog, k = gemm(path)
    m, n = sizes["M"], planner.sizes_mod.evaluate(k.n, sizes)
    found = space.candidates(k, prog.program.tensors, m, n, limit=6, depth=planner.sizes_mod.evaluate(k.k, sizes),
                             program=prog.program)
    tails = [i for i, c in enumerate(found) if c.combine == "tail"]
    assert tails == ([] if tail_at is None else [tail_at % len(found)])
    for cfg in found:
        assert planner.make_plan(prog.program, sizes, {k.name: space.override(cfg)}).configs[k.name] == cfg


def test_an_override_recreates_a_serpentine_configuration():
    """A tuning entry of a kernel with tile_order=serpentine plans that kernel again, not the linear one."""
    prog, k = gemm(str(ROOT / "samples" / "bias_gelu.epi"))
    sizes = dict(M=8192, K=4096, N=14336)
    cfg = config_mod.choose(k, 8192, {"tile_order": "serpentine"}, prog.program.tensors, 14336)
    assert cfg.tile_order == "serpentine" and space.override(cfg)["tile_order"] == "serpentine"
    assert planner.make_plan(prog.program, sizes, {k.name: space.override(cfg)}).configs[k.name] == cfg


@pytest.mark.parametrize("path,sizes,splits", [
    (str(ROOT / "samples" / "bias_gelu.epi"), dict(M=8192, K=4096, N=14336), True),    # 36.4 rounds on 132 CTAs
    (RESID, dict(M=8192, D=4096), True),
    (str(ROOT / "samples" / "bias_gelu.epi"), dict(M=64, K=4096, N=4096), False),      # one round: nothing to split
    (str(ROOT / "samples" / "bias_gelu.epi"), dict(M=8192, K=64, N=14336), False),     # 1 k-block per tile
])
def test_split_last_is_tried_where_the_last_round_of_tiles_splits(path, sizes, splits):
    """tile_order=split_last is timed, not assumed: a candidate of the heuristic's kernel wherever its
    last round would split along K, and nowhere else."""
    prog, k = gemm(path)
    m, n, depth = sizes["M"], planner.sizes_mod.evaluate(k.n, sizes), planner.sizes_mod.evaluate(k.k, sizes)
    found = space.candidates(k, prog.program.tensors, m, n, depth=depth, program=prog.program)
    split = [c for c in found if c.tile_order == "split_last"]
    assert len(split) == int(splits), [str(c) for c in found]
    assert found[0].tile_order == "linear"                     # the plan never picks it
    for cfg in split:
        assert replace(cfg, tile_order="linear") == found[0]   # the heuristic's kernel, its last round split
        assert tile_grid.last_round_split(cfg, m, n, depth)
        assert planner.make_plan(prog.program, sizes, {k.name: space.override(cfg)}).configs[k.name] == cfg
    # without the depth the tuner cannot tell whether it splits, and does not try it
    assert not [c for c in space.candidates(k, prog.program.tensors, m, n, program=prog.program)
                if c.tile_order == "split_last"]


def test_the_best_two_are_also_tried_with_the_other_swizzle_and_raster_orders():
    prog, k = gemm(str(ROOT / "samples" / "bias_gelu.epi"))
    found = space.candidates(k, prog.program.tensors, 8192, 14336, limit=3)
    for best in found[:2]:
        same_kernel = [c for c in found if c.key() == best.key() and c.epi_tile == best.epi_tile]
        assert {(c.swizzle, c.raster) for c in same_kernel} >= {
            (best.swizzle, "heuristic"), (best.swizzle, "m"), (best.swizzle, "n"),
            *((s, best.raster) for s in (1, 8))}, [str(c) for c in found]


def test_the_heuristics_tile_is_also_tried_with_wider_epilogue_subtiles():
    prog, k = gemm(str(ROOT / "samples" / "bias_gelu.epi"))
    for n, widths in ((4096, {(64, 64), (64, 128)}), (14336, {(64, 64)})):   # 128 does not divide a 192-wide tile
        found = space.candidates(k, prog.program.tensors, 8192, n, limit=3)
        first = found[0]
        assert first.tile[1] == (128 if n == 4096 else 192)
        wider = [c for c in found if c.tile == first.tile and c.cluster == first.cluster and c.epi_tile != first.epi_tile]
        assert {c.epi_tile for c in wider} == widths, [str(c) for c in found]   # pingpong: 64 rows
    # three staged tiles (two bf16 stores, one bf16 load): at pingpong 128x128 a 64x128 subtile takes
    # 64 * 128 * (2 stages * 4 B + 2 stages * 2 B) = 96 KiB, which leaves the mainloop 3 stages of 32 KiB
    prog, k = gemm(RESID)
    found = space.candidates(k, prog.program.tensors, 8192, 4096, limit=3)
    assert {c.epi_tile for c in found if c.epi_tile} == {(64, 64), (64, 128)}, [str(c) for c in found]
    assert config_mod.smem_estimate(k, prog.program.tensors, replace(found[0], epi_tile=(64, 128)))[0] == 96 * 1024


@pytest.mark.parametrize("m,n,depths", [(64, 6144, (128, 64)), (64, 4096, (64, 128)), (8192, 14336, (64, 128))])
def test_the_heuristics_tile_is_also_tried_at_the_other_k_depth(m, n, depths):
    # decode gemms of at most 64 rows on 96 tiles or more take K = 128 (config.DEEP_K_TILES), the rest 64: either way
    # the tune times the other depth of the same tile and cluster
    prog, k = gemm(str(ROOT / "samples" / "rope.epi"))
    found = space.candidates(k, prog.program.tensors, m, n, limit=3)
    first = found[0]
    deeper = [c for c in found if c.tile[:2] == first.tile[:2] and c.cluster == first.cluster and c.tile[2] != first.tile[2]]
    assert (first.tile[2], {c.tile[2] for c in deeper}) == (depths[0], {depths[1]}), [str(c) for c in found]
    plan = planner.make_plan(prog.program, dict(M=m, D=4096, N=n), {k.name: space.override(deeper[0])})
    assert plan.configs[k.name] == deeper[0]


@pytest.mark.parametrize("m", [64, 8192])
def test_no_candidate_splits_a_block_over_two_epilogue_subtiles(m):
    # the H200 tune of qk_norm at M = 64 once built pingpong 64x128 with a 64x64 subtile: nvcc's
    # static_assert (E701, "a bug in epic") instead of a candidate the plan refuses
    for path in (QUANT, str(ROOT / "samples" / "qk_norm_rope.epi")):
        prog, k = gemm(path)
        found = space.candidates(k, prog.program.tensors, m, 4096)
        assert found and all(c.epi_tile and (c.epi_tile[1] % 128 == 0 or
                                             (config_mod.split_block(c, 128) and c.epi_tile[1] == c.tile_n))
                             for c in found), [str(c) for c in found]


def test_split_k_is_tried_where_the_tiles_leave_most_sms_idle():
    prog, k = gemm(QUANT)            # blocks of 128: split-K tiles must be 128 or 256 wide
    found = [c for c in space.candidates(k, prog.program.tensors, 64, 4096) if c.splits > 1]
    assert {(c.tile, c.splits) for c in found} == {((128, 128, 64), 4), ((128, 256, 64), 8)}, [str(c) for c in found]
    assert all(c.schedule == "cooperative" and c.cluster == (1, 1) for c in found)
    for cfg in found:                # the plan accepts each as an override and picks exactly it
        plan = planner.make_plan(prog.program, dict(M=64, D=4096, N=4096), {k.name: space.override(cfg)})
        assert plan.configs[k.name] == cfg
    prog, k = gemm(RESID)
    found = [c for c in space.candidates(k, prog.program.tensors, 64, 4096) if c.splits > 1]
    assert {(c.tile, c.splits) for c in found} == {((128, 64, 64), 2), ((128, 128, 64), 4), ((128, 256, 64), 8)}
    assert not [c for c in space.candidates(k, prog.program.tensors, 8192, 4096) if c.splits > 1]
    # 48 tiles of 128x128 at N = 6144: 2 splits (96 units), not 3 (144: a second wave)
    assert [c.splits for c in space.split_k(k, prog.program.tensors, 64, 6144) if c.tile_n == 128] == [2]
    # 66 tiles of 128x64 at N = 4224: exactly one wave with 2 splits; M = 129 is two tile rows
    assert [c.splits for c in space.split_k(k, prog.program.tensors, 64, 4224) if c.tile_n == 64] == [2]
    assert [c.splits for c in space.split_k(k, prog.program.tensors, 129, 4096) if c.tile_n == 128] == [2]
    # 128 tiles of 128x64 at N = 8192 already fill the SMs: no candidate of that width, none unsplit
    found = space.split_k(k, prog.program.tensors, 64, 8192)
    assert [c.tile_n for c in found] == [128, 256] and all(c.splits > 1 for c in found)
    # M = 300 plans clusters of 2x1 by default: split-K candidates are 1x1
    found = space.split_k(k, prog.program.tensors, 300, 1024)
    assert found and all(c.cluster == (1, 1) and c.schedule == "cooperative" for c in found)


def test_block_quantization_only_gets_tiles_its_blocks_divide_or_split_over_a_cluster():
    prog, k = gemm(QUANT)
    found = space.candidates(k, prog.program.tensors, 8192, 14336, limit=20)
    for cfg in found:
        assert all(cfg.tile_n % b == 0 or config_mod.split_block(cfg, b) for b in config_mod.block_sizes(k)), str(cfg)
    assert any(config_mod.split_block(c, 128) for c in found)     # 64-wide tiles: a 1x2 cluster shares a block


def test_the_cost_model_prefers_full_waves_and_big_tiles():
    coop = lambda tm, tn: config_mod.KernelConfig("cooperative", (tm, tn, 64), (1, 1))   # noqa: E731
    ping = lambda tm, tn: config_mod.KernelConfig("pingpong", (tm, tn, 64), (1, 1))      # noqa: E731
    assert space.score(coop(128, 256), 8192, 4096) > space.score(ping(64, 64), 8192, 4096)      # reuse
    # M = 100: a 128-row tile computes 28% padding, a 64-row one 22% (2 tiles of 64)
    assert space.score(ping(64, 128), 100, 4096) > space.score(ping(128, 128), 100, 4096)
    # 133 tiles on 132 SMs leave the second wave almost empty
    assert space.score(coop(128, 128), 128 * 133, 128) < space.score(coop(128, 128), 128 * 132, 128)
    assert space.score(coop(128, 256), 128 * 132, 256) == pytest.approx(1.0)     # one full wave, no padding
    assert space.score(coop(128, 256), 128, 256) == pytest.approx(1 / 132)      # one tile: 131 SMs idle


# ---------------------------------------------------------------- the database
@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setattr(database, "_WARNED", set())
    return tmp_path / "tuning.json"


def test_the_key_names_program_gpu_bucket_and_versions():
    prog, _ = gemm(RESID)
    k = database.key(prog.program, dict(M=100, D=392), "NVIDIA H200")
    fp, gpu, bucket, epic_v, cutlass_v = k.split("|")
    assert gpu == "NVIDIA H200" and bucket == "M<=128,D=392"
    assert epic_v.startswith("epic ") and cutlass_v.startswith("cutlass ")
    assert database.bucket(prog.program, dict(M=128, D=392)) == "M<=128,D=392"
    assert database.bucket(prog.program, dict(M=129, D=392)) == "M<=256,D=392"
    assert database.bucket(prog.program, dict(M=1, D=392)) == "M<=1,D=392"
    other = epic.compile(RESID.replace("residual_rmsnorm", "bias_gelu")).program
    assert database.fingerprint(other) != fp and database.fingerprint(prog.program) == fp


def test_store_and_lookup(db):
    prog, k = gemm(RESID)
    sizes = dict(M=8192, D=4096)
    cfg = {"schedule": "pingpong", "tile": (128, 128, 64), "cluster": (1, 1), "swizzle": 8, "raster": "heuristic"}
    database.store(prog.program, sizes, "GPU-A", {"configs": {k.name: cfg}, "ms": 1.0}, db)
    gemms = {k.name: None}
    assert database.lookup(prog.program, sizes, "GPU-A", gemms, db) == {k.name: cfg}
    assert database.lookup(prog.program, dict(M=5000, D=4096), "GPU-A", gemms, db) == {k.name: cfg}   # same bucket
    assert database.lookup(prog.program, dict(M=64, D=4096), "GPU-A", gemms, db) == {}
    assert database.lookup(prog.program, sizes, "GPU-B", gemms, db) == {}
    assert [p.name for p in db.parent.iterdir()] == ["tuning.json"]            # no temporaries left
    data = json.loads(db.read_text())
    assert data["version"] == database.VERSION and len(data["entries"]) == 1


@pytest.mark.parametrize("text,why", [("{not json", "cannot be read"), ('{"version": 99, "entries": {}}', "version"),
                                      ("[]", "version"), (b"\xff\xfe", "cannot be read")])
def test_an_unreadable_database_warns_and_is_ignored(db, text, why):
    db.write_bytes(text if isinstance(text, bytes) else text.encode())
    prog, k = gemm(RESID)
    with pytest.warns(RuntimeWarning, match=why):
        assert database.lookup(prog.program, dict(M=64, D=4096), "GPU-A", {k.name: None}, db) == {}


@pytest.mark.parametrize("configs", [{"g": {"tile": (128, 128, 64)}}, {"o_proj": {"tile": (100, 128, 64)}},
                                     {"o_proj": {"nonsense": 1}}, {"o_proj": "fast"}, "all of them"])
def test_a_malformed_entry_warns_and_is_ignored(db, configs):
    prog, k = gemm(RESID)
    sizes = dict(M=64, D=4096)
    database.store(prog.program, sizes, "GPU-A", {"configs": configs}, db)
    with pytest.warns(RuntimeWarning, match="not usable"):
        assert database.lookup(prog.program, sizes, "GPU-A", {k.name: None}, db) == {}


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_database_that_cannot_be_written_is_e704(tmp_path, where):
    prog, k = gemm(RESID)
    target = tmp_path if where == "a directory" else tmp_path / "file" / "tuning.json"
    (tmp_path / "file").write_text("")
    with pytest.raises(EpicError) as e:
        database.store(prog.program, dict(M=64, D=4096), "GPU-A", {"configs": {}}, target)
    assert e.value.codes == ["E704"] and "cannot be written" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]         # no temporary left behind


def test_epic_tuning_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("EPIC_TUNING", str(tmp_path / "model.json"))
    assert database.path() == tmp_path / "model.json"
    monkeypatch.delenv("EPIC_TUNING")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path / "cache"))
    assert database.path() == tmp_path / "cache" / "tuning.json"


# ---------------------------------------------------------------- compile consults it
def test_a_call_plans_with_the_tuned_configuration_under_the_programs_own(db, monkeypatch):
    monkeypatch.setenv("EPIC_TUNING", str(db))
    monkeypatch.setattr(compiled_mod.torch.cuda, "get_device_name", lambda device=None: "GPU-A")
    prog, k = gemm(RESID)
    sizes = dict(M=8192, D=4096)
    tuned = {"schedule": "pingpong", "tile": (128, 128, 64), "cluster": (1, 2), "swizzle": 1, "raster": "m"}
    database.store(prog.program, sizes, "GPU-A", {"configs": {k.name: tuned}}, db)
    cfg = prog.plan(sizes, device="cuda:0").configs[k.name]
    assert (cfg.schedule, cfg.tile, cfg.cluster, cfg.swizzle, cfg.raster) == ("pingpong", (128, 128, 64), (1, 2), 1, "m")
    mine = epic.compile(RESID, {k.name: {"cluster": (2, 1)}})            # the program's own config wins, per option
    cfg = mine.plan(sizes, device="cuda:0").configs[k.name]
    assert cfg.cluster == (2, 1) and cfg.tile == (128, 128, 64)
    heuristic = config_mod.choose(k, 8192, None, prog.program.tensors)
    assert prog.plan(sizes, device="cpu").configs[k.name] == heuristic
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    assert prog.plan(sizes, device="cuda:0").configs[k.name] == heuristic


def test_without_a_gpu_nothing_is_looked_up(db, monkeypatch):
    monkeypatch.setenv("EPIC_TUNING", str(db))
    db.write_text("{broken")                  # would warn if it were read
    prog, k = gemm(RESID)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert prog.plan(dict(M=8192, D=4096), device="cpu").configs[k.name] == \
            config_mod.choose(k, 8192, None, prog.program.tensors)


def test_a_tuned_configuration_the_plan_refuses_warns_and_falls_back(db, monkeypatch):
    monkeypatch.setenv("EPIC_TUNING", str(db))
    monkeypatch.setattr(compiled_mod.torch.cuda, "get_device_name", lambda device=None: "GPU-A")
    prog, k = gemm(QUANT)
    sizes = dict(M=8192, D=4096, N=14336)
    database.store(prog.program, sizes, "GPU-A", {"configs": {k.name: {"tile": (128, 64, 64)}}}, db)   # 1x128 blocks
    with pytest.warns(RuntimeWarning, match="refused"):
        cfg = prog.plan(sizes, device="cuda:0").configs[k.name]
    assert cfg == config_mod.choose(k, 8192, None, prog.program.tensors)


# ---------------------------------------------------------------- the search
def test_a_candidate_slower_than_the_give_up_time_is_timed_once():
    from epic.tuning import measure
    runs, calls = [], []

    def timed(ms):
        return lambda fn: fn() or runs.append(ms) or ms
    assert measure.median_ms(lambda: None, reps=9, warmup=2, give_up_ms=5.0, timed=timed(7.0), settle_s=0) == 7.0
    assert len(runs) == 1                       # the first timed run was over: no more
    runs.clear()
    assert measure.median_ms(lambda: None, reps=9, warmup=2, give_up_ms=5.0, timed=timed(4.0), settle_s=0) == 4.0
    assert len(runs) == 9
    runs.clear()
    assert measure.median_ms(lambda: None, reps=5, warmup=0, timed=timed(70.0), settle_s=0) == 70.0 and len(runs) == 5
    times = iter([3.0, 1.0, 9.0, 2.0, 8.0])     # the median, and a later slow run does not stop it
    assert measure.median_ms(lambda: None, reps=5, warmup=0, give_up_ms=4.0, timed=lambda fn: next(times),
                             settle_s=0) == 3.0
    runs.clear()                                # exactly the give-up time is not over it
    assert measure.median_ms(lambda: None, reps=4, warmup=0, give_up_ms=5.0, timed=timed(5.0), settle_s=0) == 5.0
    assert len(runs) == 4
    runs.clear()                                # defaults: 3 untimed warm-up calls, 20 timed ones, of fn itself
    measure.median_ms(lambda: calls.append(1), timed=timed(1.0), settle_s=0)
    assert len(calls) == 23 and len(runs) == 20
    calls.clear()                               # a settling time runs it (synchronized) before the timed runs
    syncs = []
    measure.median_ms(lambda: calls.append(1), reps=2, warmup=0, timed=timed(1.0), settle_s=1e-12,
                      sync=lambda: syncs.append(len(calls)))
    assert syncs == [1] and len(calls) == 3


def test_settling_runs_every_function_until_its_time_has_passed():
    """The GPU's clocks under sustained load, before anything is timed (measure.SETTLE_S: an idle GPU's
    boost clocks made a child process time a kernel 11% faster than it runs under load)."""
    from epic.tuning import measure
    now = iter(range(100))                      # one "second" per clock reading
    order, syncs = [], []
    n = measure.settle([lambda: order.append("a"), lambda: order.append("b")], 3.0,
                       sync=lambda: syncs.append(len(order)), clock=lambda: float(next(now)))
    assert n == 3 and order == ["a", "b"] * 3 and syncs == [2, 4, 6]
    assert measure.settle([lambda: order.append("x")], 0.0) == 0 and order[-1] == "b"   # none: nothing runs
    assert measure.SETTLE_S >= 0.5


def test_the_tuner_gives_up_at_three_times_the_best_so_far(db, monkeypatch):
    """The default timer gets GIVE_UP x the fastest candidate timed before it, per gemm; the first
    candidate is timed alone, the others in rounds against it (scaled by its time)."""
    from epic.tuning import measure
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096)
    given, alone, references, times = [], [], [], iter([2.0, 9.0, 1.5, 7.0] + [4.0] * 16)

    def fake_median(fn, reps=20, warmup=3, give_up_ms=None, timed=None):
        given.append(give_up_ms)
        alone.append(len(given))
        return next(times)

    def fake_paired(fn, ref, reference_ms, reps=20, warmup=3, give_up_ms=None, timed=None):
        given.append(give_up_ms)
        references.append(reference_ms)
        return next(times)
    monkeypatch.setattr(measure, "median_ms", fake_median)
    monkeypatch.setattr(measure, "paired_ms", fake_paired)
    monkeypatch.setattr(tuner, "device_inputs", lambda program, sizes, seed=0: {})
    lines = []
    tuner.tune(RESID, sizes, limit=4, database_file=db, gpu="GPU-A", builder=lambda u: None, report=lines.append,
               unfused_timer=lambda u, i: {}, timeout=0)
    assert given[:4] == [None, 6.0, 6.0, 4.5], given
    assert sum("(over 3x the best so far)" in line for line in lines) == 2, lines     # 9.0 > 6.0, 7.0 > 4.5
    assert alone == [1] and references and set(references) == {2.0}     # every later one against the first
    req = json.loads(tuner.isolated.request("p", {}, {}, 5, give_up_ms=4.5, reference={"g": {"tile": (64, 64, 64)}},
                                            reference_ms=2.0))
    assert (req["give_up_ms"], req["reference"], req["reference_ms"]) == (4.5, {"g": {"tile": [64, 64, 64]}}, 2.0)


@pytest.mark.parametrize("isolated", [False, True])
def test_later_candidates_are_timed_against_the_first_and_the_unfused_forms_against_the_winner(
        db, monkeypatch, isolated):
    from epic.tuning import measure
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096)
    ran, paired, requests = [], [], []
    times = iter([2.0, 1.5, 3.0, 2.5, 2.2, 2.4, 2.6, 2.8, 2.9, 3.1, 3.2, 3.3, 3.4, 3.5])
    monkeypatch.setattr(compiled_mod.CompiledProgram, "__call__", lambda self, **kw: ran.append(self.config))
    monkeypatch.setattr(measure, "median_ms", lambda fn, reps, give_up_ms=None: fn() or next(times))

    def fake_paired(fn, ref, reference_ms, reps, give_up_ms=None):
        fn()
        ref()
        paired.append((ran[-2], ran[-1], reference_ms, reps))
        return next(times)
    monkeypatch.setattr(measure, "paired_ms", fake_paired)

    def fake_child(payload, timeout):
        requests.append((json.loads(payload), timeout))
        return next(times)
    monkeypatch.setattr(tuner.isolated, "run_isolated", fake_child)
    monkeypatch.setattr(tuner, "device_inputs", lambda program, sizes, seed=0: {})
    unfused = []
    monkeypatch.setattr(tuner, "_time_unfused", lambda u, i, reps, fused, fused_ms: fused() or
                        unfused.append((ran[-1], fused_ms, reps)) or {})
    result = tuner.tune(RESID, sizes, limit=3, reps=7, database_file=db, gpu="GPU-A", builder=lambda u: None,
                        report=lambda s: None, timeout=45.0 if isolated else 0)
    first = {"o_proj": result.trials[0].override}
    assert result.ms == 1.5 and result.configs == {"o_proj": result.trials[1].override}
    if isolated:
        assert requests[0][0]["reference"] is None and requests[0][0]["reference_ms"] is None
        later = [r for r, _ in requests[1:]]
        assert later and all(json.loads(json.dumps(first)) == r["reference"] and r["reference_ms"] == 2.0
                             for r in later)
        assert {t for _, t in requests} == {45.0} and all(r["reps"] == 7 for r, _ in requests)
    else:
        assert paired and all(ref == first and cand != first and ms == 2.0 and reps == 7
                              for cand, ref, ms, reps in paired)
    assert unfused == [({"o_proj": result.trials[1].override}, 1.5, 7)]


def test_a_chains_winners_are_timed_once_more_against_the_heuristics_plan(db, monkeypatch):
    from epic.tuning import measure
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096, F=14336)
    ran, paired = [], []
    monkeypatch.setattr(compiled_mod.CompiledProgram, "__call__", lambda self, **kw: ran.append(self.config))
    monkeypatch.setattr(measure, "median_ms", lambda fn, reps, give_up_ms=None: fn() or 2.0)

    def fake_paired(fn, ref, reference_ms, reps, give_up_ms=None):
        fn()
        ref()
        paired.append((ran[-2], ran[-1], reference_ms))
        # the three gemms' winners against the first gemm's heuristic alone: only the last timing
        return 1.25 if len(ran[-2]) == 3 and len(ran[-1]) == 1 else 1.5
    monkeypatch.setattr(measure, "paired_ms", fake_paired)
    monkeypatch.setattr(tuner, "device_inputs", lambda program, sizes, seed=0: {})
    monkeypatch.setattr(tuner, "_time_unfused", lambda *a: {})
    result = tuner.tune(MLP, sizes, limit=2, database_file=db, gpu="GPU-A", builder=lambda u: None,
                        report=lambda s: None, timeout=0)
    first = result.trials[0]
    cand, ref, ref_ms = paired[-1]
    assert cand == result.configs and ref == {first.gemm: first.override} and ref_ms == 2.0
    assert [p for p in paired if len(p[0]) == 3 and len(p[1]) == 1] == [paired[-1]]
    assert result.heuristic_ms == 2.0 and result.ms == 1.25


def test_the_unfused_forms_are_timed_against_the_fused_winner(monkeypatch):
    from epic.tuning import measure
    calls = []
    monkeypatch.setattr(measure, "paired_ms", lambda fn, ref, ref_ms, reps: calls.append(("paired", fn(), ref(), ref_ms,
                                                                                          reps)) or 2.0 * ref_ms)
    monkeypatch.setattr(measure, "median_ms", lambda fn, reps: calls.append(("alone", fn(), reps)) or 7.0)

    def unfused(compiled, **inputs):
        return ("compiled" if compiled else "eager", inputs["x"])
    got = tuner._time_unfused(unfused, {"x": 1}, 5, fused=lambda: "fused", fused_ms=0.5)
    assert got["eager_ms"] == 1.0 and got["compiled_ms"] == 1.0 and "compile_s" in got
    assert calls == [("paired", ("eager", 1), "fused", 0.5, 5), ("paired", ("compiled", 1), "fused", 0.5, 5)]
    calls.clear()
    got = tuner._time_unfused(unfused, {"x": 1}, 5)            # without a fused program: alone
    assert (got["eager_ms"], got["compiled_ms"]) == (7.0, 7.0) and [c[0] for c in calls] == ["alone", "alone"]


def test_a_paired_time_is_the_reference_scaled_by_the_median_ratio_of_rounds():
    from epic.tuning import measure
    order = []

    def timed(fn):
        return fn()
    clock = iter([10.0, 5.0, 6.0, 12.0, 8.0, 4.0, 100.0, 110.0, 20.0, 10.0])  # drifting clocks, ratios 0.5 0.5 0.5 ...

    def cand():
        order.append("c")
        return next(clock) if len(order) > 2 else 0.0

    def ref():
        order.append("r")
        return next(clock) if len(order) > 2 else 0.0
    # warm-up: c r; then rounds alternate: r c, c r, r c, c r, r c
    got = measure.paired_ms(cand, ref, 3.0, reps=5, warmup=1, timed=timed, settle_s=0)
    assert order == ["c", "r", "r", "c", "c", "r", "r", "c", "c", "r", "r", "c"]
    # per round (cand / ref): 5/10, 6/12, 4/8, 100/110, 10/20 -> median 0.5
    assert got == pytest.approx(1.5)
    clock = iter([1.0, 4.0] + [1.0] * 20)        # the first round at 4x the reference: over 6 ms, stops there
    calls = []
    assert measure.paired_ms(lambda: calls.append(1) or next(clock), lambda: next(clock), 2.0, reps=9, warmup=0,
                             give_up_ms=6.0, timed=timed, settle_s=0) == 8.0 and len(calls) == 1
    calls.clear()                                # exactly at the give-up time is not over it
    assert measure.paired_ms(lambda: calls.append(1) or 3.0, lambda: 1.0, 2.0, reps=4, warmup=0, give_up_ms=6.0,
                             timed=timed, settle_s=0) == 6.0 and len(calls) == 4
    calls.clear()                                # defaults: 3 untimed warm-up pairs, then 20 rounds
    measure.paired_ms(lambda: calls.append(1) or 1.0, lambda: 1.0, 1.0, timed=timed, settle_s=0)
    assert len(calls) == 23
    calls.clear()                                # a settling time runs both, before the rounds
    measure.paired_ms(lambda: calls.append("c") or 1.0, lambda: calls.append("r") or 1.0, 1.0, reps=1, warmup=0,
                      timed=timed, settle_s=1e-12, sync=lambda: calls.append("sync"))
    assert calls[:3] == ["c", "r", "sync"] and len(calls) == 5


class FakeGPU:
    """Times a program by its configurations: a table of ms per (gemm, tile), 9 ms otherwise."""

    def __init__(self, table):
        self.table, self.seen = table, []

    def __call__(self, prog, inputs):
        plan = prog.plan(prog_sizes[0])
        self.seen.append({g: (c.schedule, c.tile) for g, c in plan.configs.items()})
        return sum(self.table.get((g, c.schedule, c.tile), 9.0) for g, c in plan.configs.items())


prog_sizes = [None]


def test_tune_keeps_the_fastest_and_stores_it(db, monkeypatch):
    monkeypatch.setenv("EPIC_NO_TUNING", "1")          # the fake times the plan the candidate's config gives
    sizes = dict(M=8192, D=4096)
    prog_sizes[0] = sizes
    built = []
    fake = FakeGPU({("o_proj", "cooperative", (128, 256, 64)): 1.5, ("o_proj", "pingpong", (128, 128, 64)): 2.0})
    lines = []
    result = tuner.tune(RESID, sizes, limit=12, database_file=db, gpu="GPU-A", timer=fake,
                        builder=built.append, report=lines.append)
    assert result.configs["o_proj"]["tile"] == (128, 256, 64) and result.configs["o_proj"]["schedule"] == "cooperative"
    assert result.ms == 1.5 and result.heuristic_ms == 2.0               # the heuristic: pingpong 128x128
    assert len(built) == 1 and len(built[0]) >= 3                        # one parallel build of every candidate
    assert any("-> cooperative 128x256x64" in line for line in lines)
    prog, k = gemm(RESID)
    assert database.lookup(prog.program, sizes, "GPU-A", {k.name: None}, db)["o_proj"]["tile"] == (128, 256, 64)


def test_a_chain_is_tuned_gemm_by_gemm_with_earlier_winners_in_place(db, monkeypatch):
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096, F=14336)
    prog_sizes[0] = sizes
    prog = epic.compile(MLP)
    k1, k2 = [k for k in prog.program.kernels if k.kind == "gemm"][:2]
    fast = space.candidates(k1, prog.program.tensors, 8192, planner.sizes_mod.evaluate(k1.n, sizes), 4)[2]
    fake = FakeGPU({(k1.name, fast.schedule, fast.tile): 1.0})
    result = tuner.tune(MLP, sizes, limit=4, database_file=db, gpu="GPU-A", timer=fake, builder=lambda u: None,
                        report=lambda s: None)
    assert result.configs[k1.name]["tile"] == fast.tile and result.configs[k1.name]["schedule"] == fast.schedule
    later = [s for s in fake.seen if s[k2.name] != fake.seen[0][k2.name]]
    assert later and all(s[k1.name] == (fast.schedule, fast.tile) for s in later)


def test_a_configuration_that_does_not_build_is_skipped(db, monkeypatch):
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096)
    prog_sizes[0] = sizes

    def builder(units):
        if any("coop_128x256" in u.name for u in units):
            raise EpicError(Diagnostic("E217", "too little shared memory"))

    lines = []
    result = tuner.tune(RESID, sizes, limit=4, database_file=db, gpu="GPU-A", timer=FakeGPU({}), builder=builder,
                        report=lines.append)
    skipped = [t for t in result.trials if t.why]
    assert skipped and all("coop" in t.config and "128x256" in t.config for t in skipped)
    assert any("skipped: too little shared memory" in line for line in lines)
    assert result.configs["o_proj"]["tile"] != (128, 256, 64)


def test_no_configuration_at_all_is_e707(db, monkeypatch):
    monkeypatch.setenv("EPIC_NO_TUNING", "1")

    def builder(units):
        raise EpicError(Diagnostic("E705", "nvcc not found"))

    with pytest.raises(EpicError) as e:
        tuner.tune(RESID, dict(M=64, D=4096), limit=3, database_file=db, gpu="GPU-A", timer=FakeGPU({}),
                   builder=builder, report=lambda s: None)
    assert e.value.codes == ["E707"] and "o_proj" in str(e.value) and "nvcc not found" in str(e.value)
    assert not db.exists()


@pytest.mark.parametrize("path,sizes", [(RESID, dict(M=8192, D=4096)), (MLP, dict(M=8192, D=4096, F=14336))],
                         ids=["one gemm", "a chain"])
def test_build_only_builds_in_one_run_what_the_tune_builds(db, monkeypatch, path, sizes):
    # every configuration timed alike: each gemm keeps the heuristic's, so a chain's later gemms are tuned
    # with the earlier ones at the heuristic's configuration, as --build-only plans them
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    prog_sizes[0] = sizes
    tuned, only, anywhere = [], [], []
    tuner.tune(path, sizes, limit=4, database_file=db, gpu="GPU-A", timer=FakeGPU({}), builder=tuned.append,
               report=lambda s: None)
    with mock.patch("epic.plan.gpus.local", return_value=(True, None)):    # on GPU-A's machine
        trials = tuner.build_candidates(path, sizes, limit=4, builder=only.append)
    with mock.patch("epic.plan.gpus.local", return_value=(False, None)):   # no GPU: every GPU's candidates
        tuner.build_candidates(path, sizes, limit=4, builder=anywhere.append)
    kernels = lambda batches: {(u.name, u.source) for batch in batches for u in batch}   # noqa: E731
    assert len(only) == 1 and kernels(only) == kernels(tuned)
    assert len(anywhere) == 1 and kernels(anywhere) >= kernels(tuned)
    gemms = [k.name for k in epic.compile(path).program.kernels if k.kind == "gemm"]
    assert sorted({t.gemm for t in trials}) == sorted(gemms) and all(t.why is None for t in trials)


def test_build_only_reports_a_configuration_nvcc_refuses_and_builds_the_rest():
    def builder(units):
        if any("coop_128x256" in u.name for u in units):
            raise EpicError(Diagnostic("E217", "too little shared memory"))

    trials = tuner.build_candidates(RESID, dict(M=8192, D=4096), limit=4, builder=builder)
    refused = [t for t in trials if t.why]
    assert refused and all("128x256" in t.config and t.why == "too little shared memory" for t in refused)
    assert any(t.why is None for t in trials)


def test_build_only_with_no_kernel_built_is_e707_and_says_why():
    def builder(units):
        raise EpicError(Diagnostic("E705", "nvcc not found"))

    with pytest.raises(EpicError) as e:
        tuner.build_candidates(RESID, dict(M=64, D=4096), limit=2, builder=builder)
    assert e.value.codes == ["E707"] and "could be built (" in str(e.value) and "nvcc not found" in str(e.value)


def test_epic_tune_build_only_needs_no_gpu(monkeypatch, capsys):
    from epic.runtime import build
    from epic_cli.main import main
    seen = []
    monkeypatch.setattr(build, "build_all", lambda units, jobs=None: seen.append((units, jobs)) or [])
    assert main(["tune", RESID, "--shape", "M=64,D=4096", "-k", "2", "-j", "3", "--build-only"]) == 0
    out = capsys.readouterr().out
    assert len(seen) == 1 and seen[0][1] == 3 and seen[0][0]
    assert "o_proj: pingpong 64x64x64" in out and "built " in out and "configuration(s)" in out


def test_epic_tune_without_a_gpu_is_e703_and_bad_counts_e801(tmp_path, capsys):
    from epic_cli.main import main
    assert main(["tune", RESID, "--shape", "M=64,D=4096"]) == 2
    assert "E703" in capsys.readouterr().err
    assert main(["tune", RESID, "--shape", "M=64,D=4096", "-k", "0"]) == 2
    assert "E801" in capsys.readouterr().err


# ---------------------------------------------------------------- candidates timed in a child process
def test_a_candidate_that_hangs_is_killed_and_reported(tmp_path):
    import sys
    from epic.tuning import trial
    with pytest.raises(EpicError) as info:
        trial.run_isolated("{}", timeout=1, argv=[sys.executable, "-c", "import time; time.sleep(60)"])
    assert info.value.codes == ["E707"] and "timed out after 1 s" in str(info.value)


@pytest.mark.parametrize("script, words", [
    ("print('{\"ms\": 0.25}')", None),
    ("print('{\"why\": \"E217: too little shared memory\"}')", "E217: too little shared memory"),
    ("import sys; sys.stderr.write('Segmentation fault\\n'); sys.exit(139)", "status 139 (Segmentation fault)"),
    ("print('{\"ms\": -1}')", "status 0"),
    ("print('not json')", "status 0"),
])
def test_the_childs_answer_is_read_defensively(script, words):
    import sys
    from epic.tuning import trial
    argv = [sys.executable, "-c", script]
    if words is None:
        assert trial.run_isolated("{}", timeout=30, argv=argv) == 0.25
        return
    with pytest.raises(EpicError) as info:
        trial.run_isolated("{}", timeout=30, argv=argv)
    assert words in str(info.value)


def test_the_request_carries_the_candidate():
    from epic.tuning import trial
    req = json.loads(trial.request("samples/x.epi", {"M": 64}, {"g": {"tile": (64, 64, 64), "schedule": "pingpong"}}, 7))
    assert req == {"source": "samples/x.epi", "sizes": {"M": 64}, "reps": 7, "seed": 0, "give_up_ms": None,
                   "reference": None, "reference_ms": None, "timing": "paired",
                   "configs": {"g": {"tile": [64, 64, 64], "schedule": "pingpong"}}}
    from epic.frontend import options
    assert options.check_config(req["configs"], {"g": None}) == {"g": {"tile": (64, 64, 64), "schedule": "pingpong"}}


def test_sustained_timing_replays_batches_until_its_time_has_passed():
    """measure.sustained_ms: one timed run (over the give-up time: that, no more), the settling runs,
    then batches between events until the time has passed; the time per call over every batch."""
    from epic.tuning import measure
    runs, batches = [], []
    now = iter(range(100))

    def batch_ms(fn, n):
        for _ in range(n):
            fn()
        if n == 1:                                            # the one timed run
            return 9.0
        batches.append(n)
        return 4.0 * n if len(batches) % 2 else 6.0 * n      # 4 ms a call, then 6: their mean, 5
    got = measure.sustained_ms(lambda: runs.append(1), seconds=4.0, batch_ms=batch_ms, settle_s=0,
                               clock=lambda: float(next(now)), batch=10)
    assert got == 5.0 and batches == [10] * 4 and len(runs) == 3 + 1 + 40    # 3 warm-up runs, the timed one
    batches.clear()                             # a first timed run over the give-up time: that time, no batches
    assert measure.sustained_ms(lambda: None, batch_ms=batch_ms, give_up_ms=5.0, settle_s=0) == 9.0
    assert batches == []
    # the first call of a process binds and loads its kernels (on the H200 360-540 ms against 12.5 for a
    # call): it is a warm-up run, never the timed one that the give-up time judges
    first_call = iter([500.0] + [12.0] * 99)
    runs.clear()

    def call_times(fn, n):
        for _ in range(n):
            fn()
        return sum(runs[-n:])
    assert measure.sustained_ms(lambda: runs.append(next(first_call)), batch_ms=call_times, give_up_ms=36.0,
                                settle_s=0, seconds=0) == 12.0
    assert measure.SUSTAIN_S >= 1.0


@pytest.mark.parametrize("isolated", [False, True])
def test_the_sustained_tune_times_every_candidate_alone_and_records_it(db, monkeypatch, isolated):
    """`epic tune --timing sustained`: no candidate is paired with another (each back to back at its own
    power limit), the child processes are asked for it, the unfused forms are timed the same way, and the
    database entry says how it was timed (`epic plan --tuned` prints it)."""
    from epic.tuning import measure, report
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096)
    times = iter([2.0, 1.5, 3.0, 2.5, 2.2, 2.4, 2.6, 2.8, 2.9, 3.1, 3.2, 3.3, 3.4, 3.5])
    sustained, requests = [], []
    monkeypatch.setattr(compiled_mod.CompiledProgram, "__call__", lambda self, **kw: None)
    monkeypatch.setattr(measure, "paired_ms", lambda *a, **k: pytest.fail("paired timing in a sustained tune"))
    monkeypatch.setattr(measure, "median_ms", lambda *a, **k: pytest.fail("a median in a sustained tune"))
    monkeypatch.setattr(measure, "sustained_ms", lambda fn, give_up_ms=None: sustained.append(give_up_ms) or next(times))

    def fake_child(payload, timeout):
        requests.append(json.loads(payload))
        return next(times)
    monkeypatch.setattr(tuner.isolated, "run_isolated", fake_child)
    monkeypatch.setattr(tuner, "device_inputs", lambda program, sizes, seed=0: {})
    unfused = []
    monkeypatch.setattr(tuner, "_time_unfused", lambda u, i, reps, fused=None, fused_ms=None, sustained=False:
                        unfused.append((fused, fused_ms, sustained)) or {"eager_ms": 9.0})
    result = tuner.tune(RESID, sizes, limit=3, database_file=db, gpu="GPU-A", builder=lambda u: None,
                        report=lambda line: None, timeout=60 if isolated else 0, timing="sustained")
    if isolated:
        assert requests and all(r["timing"] == "sustained" and r["reference"] is None for r in requests)
        assert not sustained
    else:
        assert len(sustained) >= 2 and not requests and sustained[0] is None
    assert result.ms == 1.5 and result.heuristic_ms == 2.0
    assert unfused == [(None, None, True)]
    entry = next(iter(database.entries(epic.compile(RESID).program, sizes, db).values()))
    assert entry["timing"] == "sustained"
    assert "(sustained timing)" in report.render(epic.compile(RESID).program, sizes, db)
    with pytest.raises(ValueError, match="timing 'fast'"):
        tuner.tune(RESID, sizes, timing="fast", database_file=db, gpu="GPU-A", builder=lambda u: None)


@pytest.mark.parametrize("second, kept", [(1.99, True), (1.981, True), (1.979, False), (1.5, False)])
def test_the_heuristics_configuration_stays_unless_a_candidate_is_a_margin_faster(db, monkeypatch, second, kept):
    """tuner.MARGIN: a lead under 1% is within what a timing mode can rank (a tile order 0.3% faster in
    paired rounds was 8.9% slower back to back), so the heuristic's configuration stays; a larger one wins."""
    from epic.tuning import measure
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    sizes = dict(M=8192, D=4096)
    times = iter([2.0, second] + [3.0] * 12)
    monkeypatch.setattr(measure, "median_ms", lambda fn, reps=20, give_up_ms=None: next(times))
    monkeypatch.setattr(measure, "paired_ms", lambda fn, ref, reference_ms, reps=20, give_up_ms=None: next(times))
    monkeypatch.setattr(tuner, "device_inputs", lambda program, sizes, seed=0: {})
    lines = []
    result = tuner.tune(RESID, sizes, limit=3, database_file=db, gpu="GPU-A", builder=lambda u: None,
                        report=lines.append, unfused_timer=lambda u, i: {}, timeout=0)
    timed = [t for t in result.trials if t.ms is not None]
    assert timed[0].ms == 2.0 and timed[1].ms == second
    assert result.configs[timed[0].gemm] == (timed[0].override if kept else timed[1].override)
    assert result.ms == (2.0 if kept else second)
    assert any("less than 1% faster than the heuristic's: kept" in line for line in lines) == kept
