"""The plan and its byte ledger, checked by hand from the shapes."""
from dataclasses import replace

import pytest

from epic import pipeline
from epic.diagnostics import EpicError
from epic.ir.options import shares_block
from epic.plan import config, ledger, planner, tile_grid

from .conftest import ROOT, analyze

M, D, F = 8192, 4096, 14336
BF, F32 = 2, 4


def prenorm_plan():
    a = pipeline.analyze(str(ROOT / "samples" / "prenorm_mlp.epi"))
    return a, planner.make_plan(a.program, dict(M=M, D=D, F=F))


def test_prenorm_kernels_and_buffers():
    a, plan = prenorm_plan()
    assert [s.kernel.name for s in plan.steps] == ["o_proj", "o_proj__row_combine", "gate_up", "down"]
    tile_n = plan.configs["o_proj"].tile_n
    part = plan.buffers["o_proj__row_mean_part0"]
    assert part.shape == (D // tile_n, M) and part.nbytes == M * (D // tile_n) * F32   # tile-major, as allocated
    assert part.writer == "o_proj" and part.readers == ["o_proj__row_combine"]
    r = plan.buffers["n__rowscale"]
    assert r.shape == (M,) and r.readers == ["gate_up"]


def test_prenorm_fused_ledger_by_hand():
    a, plan = prenorm_plan()
    rows = {r.kernel: r for r in ledger.fused_rows(plan)}
    tile_n = plan.configs["o_proj"].tile_n
    assert rows["o_proj"].read_bytes == M * D * BF + D * D * BF + M * D * BF + D * BF
    assert rows["o_proj"].write_bytes == 2 * M * D * BF + M * (D // tile_n) * F32
    assert rows["o_proj__row_combine"].read_bytes == M * (D // tile_n) * F32
    assert rows["o_proj__row_combine"].write_bytes == M * F32
    assert rows["gate_up"].read_bytes == M * D * BF + D * 2 * F * BF + M * F32
    assert rows["gate_up"].write_bytes == M * F * BF
    assert rows["down"].read_bytes == M * F * BF + F * D * BF + M * D * BF
    assert rows["down"].write_bytes == M * D * BF


@pytest.mark.parametrize("combine", ["kernel", "fold"])
def test_cross_entropy_combine_reads_one_label_logit_per_row_by_hand(combine):
    """The row combine reads every tile's log-sum-exp but, of the label logit's partials, only the
    entry of the label's tile per row, and the labels (split-reductions' pick); folded into its gemm it
    merges every tile's."""
    a = pipeline.analyze(str(ROOT / "samples" / "cross_entropy.epi"))
    sizes = dict(M=M, D=D, V=128256)
    plan = planner.make_plan(a.program, sizes, {"lm_head": {"combine": combine}} if combine == "fold" else None)
    tiles = -(-sizes["V"] // plan.configs["lm_head"].tile_n)
    row = {r.kernel: r for r in ledger.fused_rows(plan)}["lm_head__row_combine"]
    picked = M * F32 if combine == "kernel" else tiles * M * F32
    assert row.read_bytes == tiles * M * F32 + picked + M * 4      # lse partials, label logits, i32 labels


def test_prenorm_unfused_ledger_by_hand():
    a, plan = prenorm_plan()
    rows = ledger.unfused_rows(a.source_program, plan.sizes)
    total = sum(r.read_bytes + r.write_bytes for r in rows)
    tile = M * D * BF
    want = (
        (M * D * BF + D * D * BF) + tile            # gemm o_proj: read attn, wo; write acc
        + (tile + tile) + tile                      # h = acc + z
        + (tile + D * BF) + tile                    # rmsnorm(h, gamma) -> n
        + (tile + D * 2 * F * BF) + M * 2 * F * BF  # gemm gate_up
        + M * 2 * F * BF + M * F * BF               # swiglu(acc) -> a
        + (M * F * BF + F * D * BF) + tile          # gemm down
        + (tile + tile) + tile                      # y = acc + resid
    )
    assert total == want
    fused, unfused = ledger.totals(plan, a.source_program)
    assert unfused == want and fused < unfused


def test_ledger_render_has_totals():
    a, plan = prenorm_plan()
    text = ledger.render(plan, a.source_program)
    assert "total fused" in text and "total op by op" in text
    assert "o_proj__row_mean_part0" in text


def test_the_ledger_says_which_gemms_are_launched_as_dependents(monkeypatch):
    a = pipeline.analyze(str(ROOT / "samples" / "prenorm_mlp.epi"))
    decode = ledger.render(planner.make_plan(a.program, dict(M=64, D=D, F=F)), a.source_program)
    assert ("launched as o_proj__tail's programmatic dependent; asks L2 for its first tile's wgu "
            "while it waits") in decode          # o_proj's epilogue runs in its tail kernel (plan/tail.py)
    assert "launched as gate_up's programmatic dependent; asks L2 for its first tile's wd" in decode
    assert decode.count("programmatic dependent") == 2            # o_proj opens the chain's call
    r = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi"))
    one = ledger.render(planner.make_plan(r.program, dict(M=64, D=D)), r.source_program)
    assert ("launched as a programmatic dependent of the caller's last kernel on the stream; asks L2 for its "
            "first tile's wo while it waits") in one
    monkeypatch.setenv("EPIC_DEPENDENT_FIRST", "0")
    assert "programmatic" not in ledger.render(planner.make_plan(r.program, dict(M=64, D=D)), r.source_program)
    monkeypatch.delenv("EPIC_DEPENDENT_FIRST")
    wider = ledger.render(planner.make_plan(a.program, dict(M=65, D=D, F=F)), a.source_program)
    assert "programmatic dependent" not in wider
    monkeypatch.setenv("EPIC_DEPENDENT_PREFETCH", "0")
    plain = ledger.render(planner.make_plan(a.program, dict(M=64, D=D, F=F)), a.source_program)
    assert "launched as gate_up's programmatic dependent\n" in plain and "asks L2" not in plain


def test_the_plan_and_the_sources_take_the_wide_tile_at_a_wide_n(tmp_path):
    from cli.main import main
    from epic.codegen import emit
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n").program
    for n, width in ((576, 192), (512, 128), (20000, 192)):
        sizes = dict(M=8192, K=256, N=n)
        assert planner.make_plan(prog, sizes).configs["g"].tile == (128, width, 64), n
        assert emit.kernel_configs(prog, 8192, None, sizes)["g"].tile == (128, width, 64), n
    assert emit.kernel_configs(prog, 8192)["g"].tile == (128, 128, 64)        # N unknown: not a wide one
    path = tmp_path / "g.epi"
    path.write_text("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n")
    assert main(["compile", str(path), "-o", str(tmp_path / "out"), "--shape", "M=8192,K=256,N=576"]) == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["g.g.ping_128x192x64_c2x1.cu"]


def test_large_m_falls_back_down_the_ladder_when_the_epilogue_leaves_too_little_shared_memory():
    # ten bf16 tiles loaded: pingpong 128x128 would need 64x32 x (2 x 2 B + 4 x 20 B) = 168 KiB for the
    # epilogue + 2 x 32 KiB of mainloop; cooperative 128x128 and 128x64 more; pingpong 64x64 fits
    loads = "".join(f"  in z{i}: bf16[M, N]\n" for i in range(10))
    total = " + ".join(f"z{i}" for i in range(10))
    prog = analyze(f"gemm g(x: bf16[M, K] @ w: bf16[K, N]) {{\n{loads}  out y: bf16 = acc + {total}\n}}\n").program
    cfg = planner.make_plan(prog, dict(M=8192, K=256, N=4096)).configs["g"]
    assert (cfg.schedule, cfg.tile) == ("pingpong", (64, 64, 64)), str(cfg)
    assert not config.fits(prog.kernels[0], prog.tensors, config.LARGE_M[0])


def test_the_heuristics_swizzle_never_pads_the_tile_grid():
    """epic's scheduler rounds the dimension its swizzle groups (N when rastering along M, M along N)
    up to swizzle x cluster and runs the padding tiles: the heuristic takes the raster order whose
    grouped dimension the swizzle divides, and lowers its swizzle of 8 where neither does."""
    wide = config.WIDE_N[0]                              # pingpong 128x192, cluster 2x1
    # N = 28672: 149.3 -> 150 columns of tiles, 64 rows. Along M (CUTLASS's heuristic order: more
    # columns than rows) swizzle 8 and 4 round the columns to 152, 2 does not; along N the swizzle groups
    # the 64 rows (in clusters of 2): 8 x 2 divides them, and the 150 columns stay as they are
    assert [tile_grid.padded_tiles(wide, 8192, 28672, s) for s in (1, 2, 4, 8)] == [64 * 150] * 2 + [64 * 152] * 2
    assert [tile_grid.padded_tiles(wide, 8192, 28672, s, "n") for s in (1, 2, 4, 8)] == [64 * 150] * 4
    # M = 1000: 8 rows of tiles; along N swizzle 8 groups them to 16, along M 4 keeps 8
    assert [tile_grid.padded_tiles(wide, 1000, 28672, s, "n") for s in (1, 4, 8)] == [8 * 150, 8 * 150, 16 * 150]
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n").program

    def order(m, n):    # (epic's kernel at N = 128256, where the heuristic would give this gemm cuBLAS)
        c = planner.make_plan(prog, dict(M=m, K=4096, N=n), {"g": {"backend": "cutlass"}}).configs["g"]
        return c.swizzle, c.raster
    assert planner.make_plan(prog, dict(M=8192, K=4096, N=128256)).configs["g"].backend == "cublas"
    # 128x128 tiles at N = 4096: 64 rows, 32 columns; CUTLASS's order (along N there) groups the rows
    assert order(8192, 4096) == (8, "heuristic")
    # 75 (14336 / 192), 150 and 668 columns (a vocabulary): swizzle 8 pads them; along N it groups the 64
    # rows instead (at 668 columns CUTLASS's order would take 4, reading A once per 4 columns)
    assert [order(8192, n) for n in (14336, 28672, 128256)] == [(8, "n"), (8, "n"), (8, "n")]
    # M = 1000 (8 rows of tiles): along N only 4 fits the rows; 668 columns along M take 4 too
    assert [order(1000, n) for n in (14336, 128256)] == [(4, "n"), (4, "heuristic")]
    assert order(64, 28672) == (1, "heuristic")     # decode: one row of tiles, no swizzle
    # a raster order the file gives is kept: the swizzle is lowered instead
    fixed = planner.make_plan(prog, dict(M=8192, K=4096, N=14336), {"g": {"backend": "cutlass", "raster": "m"}})
    assert (fixed.configs["g"].swizzle, fixed.configs["g"].raster) == (1, "m")
    # a swizzle the file or the call gives is kept as given
    assert planner.make_plan(prog, dict(M=8192, K=4096, N=28672), {"g": {"swizzle": 8}}).configs["g"].swizzle == 8
    fixed = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with swizzle=4 {\n  out y: bf16 = acc\n}\n").program
    assert planner.make_plan(fixed, dict(M=8192, K=4096, N=28672)).configs["g"].swizzle == 4


def test_heuristic_and_overrides():
    assert config.heuristic(64).schedule == "pingpong"
    assert config.heuristic(256).tile == (64, 64, 64) and config.heuristic(257).tile == (128, 128, 64)
    large = config.heuristic(8192)
    assert (large.schedule, large.tile, large.cluster, large.swizzle) == ("pingpong", (128, 128, 64), (2, 1), 8)
    # 192 wide where 192-wide tiles leave at most 1% of N empty (the H200 measurements in config.py):
    # 14336 = 74.7 x 192 (0.4% empty), 11008 = 57.3 x 192 (1.2%), 4096 = 21.3 x 192 (3.1%)
    for n, width in ((4096, 128), (6144, 192), (11008, 128), (14336, 192), (16384, 192), (16385, 192),
                     (28672, 192), (128256, 192), (None, 128)):
        assert config.heuristic(8192, n=n).tile == (128, width, 64), n
    assert config.heuristic(8192, {128}, n=28672).tile == (128, 128, 64)   # a block of 128 narrows it
    assert config.heuristic(8192, {64}, n=28672).tile == (128, 192, 64)
    # decode: 64x128 above 8192 columns, about where a row of 64x64 tiles outgrows one wave (H200, M = 64:
    # cross entropy 0.950 against 1.004 with 64x64; bias + GELU, N = 14336, 1.002 against 1.054 read-flushed)
    for n, width in ((4096, 64), (6144, 64), (8192, 64), (8193, 128), (14336, 128), (28672, 128), (None, 64)):
        assert config.heuristic(256, n=n).tile[:2] == (64, width), n
    # ... with K = 128 at M <= 64 where the grid has at least 96 tiles (M = 64: RoPE at N = 6144, 96
    # tiles, 1.046 against 1.079; plain at N = 4096, 64 tiles, 1.025 against 1.017); not measured above
    for m, n, k in ((64, 4096, 64), (64, 6080, 64), (64, 6081, 128), (64, 6144, 128), (64, 14336, 128),
                    (1, 6144, 128), (65, 6144, 64), (256, 6144, 64), (64, None, 64), (257, 6144, 64)):
        assert config.heuristic(m, n=n).tile[2] == k, (m, n)
    assert config.heuristic(64, {128}, n=6144).tile == (64, 64, 128)     # the shared-block cluster too
    # decode with 1x128 blocks: 64-wide tiles, each block shared by a 1x2 cluster's two CTAs
    shared = config.heuristic(64, {128}, n=4096)
    assert (shared.tile, shared.cluster) == ((64, 64, 64), (1, 2)) and config.split_block(shared, 128)
    assert config.heuristic(64, {64}, n=4096).cluster == (1, 1)           # blocks the tile holds: no cluster
    assert config.heuristic(64, {256}, n=4096).tile == (64, 256, 64)      # only a block of twice the tile splits
    assert config.heuristic(64, {64, 128}, n=4096).cluster == (1, 2)      # every block is looked at
    assert config.heuristic(8192, {64, 256}, n=4096).tile == (128, 256, 64)
    # the one rule, for the checker and the planner alike: half a block wide, 1x2, pingpong, no split-K
    assert shares_block(64, (1, 2), "pingpong", 1, 128)
    assert not any([shares_block(64, (2, 1), "pingpong", 1, 128), shares_block(64, (1, 2), "cooperative", 1, 128),
                    shares_block(64, (1, 2), "pingpong", 2, 128), shares_block(64, (1, 2), "pingpong", 1, 256),
                    shares_block(128, (1, 2), "pingpong", 1, 128)])
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=128x128x64, schedule=cooperative {\n"
                   "  out y: bf16 = acc\n}\n").program
    plan = planner.make_plan(prog, dict(M=64, K=64, N=64))
    assert plan.configs["g"].tile == (128, 128, 64) and plan.configs["g"].schedule == "cooperative"
    plan = planner.make_plan(prog, dict(M=64, K=64, N=64), {"g": {"tile": (64, 64, 64), "schedule": "pingpong"}})
    assert plan.configs["g"].tile == (64, 64, 64)


def test_bad_configuration_is_a_diagnostic():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=64x128x64, schedule=cooperative {\n  out y: bf16 = acc\n}\n"
    with pytest.raises(EpicError) as info:      # at check time, where the file says it
        analyze(text)
    assert info.value.codes == ["E216"] and "cooperative schedule needs tile M = 128" in str(info.value)
    assert info.value.diagnostics[0].span.line == 1
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=256x128x64 {\n  out y: bf16 = acc\n}\n").program
    with pytest.raises(EpicError) as info:      # the call's override makes a bad combination with the file
        planner.make_plan(prog, dict(M=64, K=64, N=64), {"g": {"schedule": "pingpong"}})
    assert info.value.codes == ["E216"] and "pingpong schedule needs tile M = 64 or 128" in str(info.value)


def test_block_wider_than_tile_widens_tile():
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  s = block_max(abs(acc), 256)\n"
                   "  out q: e4m3 = acc / s\n  out qs: f32[M, N/256] = s\n}\n").program
    plan = planner.make_plan(prog, dict(M=64, K=64, N=1024), {"g": {"combine": "kernel"}})   # in the gemm's epilogue
    assert plan.configs["g"].tile_n == 256
    assert planner.make_plan(prog, dict(M=512, K=64, N=1024)).configs["g"].tile_n == 256


def test_scheduler_options_are_launch_time_only():
    prog = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) with swizzle=8, raster=n {\n"
                   "  out y: bf16 = acc\n}\n").program
    cfg = planner.make_plan(prog, dict(M=8192, K=64, N=64)).configs["g"]
    assert (cfg.swizzle, cfg.raster, cfg.raster_code) == (8, "n", 2)
    assert cfg.key() == config.heuristic(8192).key()       # same built kernel as the default
    with pytest.raises(EpicError) as info:
        planner.make_plan(prog, dict(M=8192, K=64, N=64), {"g": {"swizzle": 3}})
    assert info.value.codes == ["E216"] and "swizzle must be 1, 2, 4 or 8" in str(info.value)


def test_split_k_is_an_option_of_the_cooperative_schedule():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) with {opts} {{\n  out y: bf16 = acc\n}}\n"
    cfg = planner.make_plan(analyze(text.format(opts="splits=4")).program, dict(M=64, K=4096, N=4096)).configs["g"]
    assert (cfg.schedule, cfg.tile, cfg.splits, cfg.split_k) == ("cooperative", (128, 64, 64), 4, True)
    assert str(cfg).endswith("splits 4") and cfg.key().endswith("_splitk")
    assert config.heuristic(64).splits == 1 and not config.heuristic(64).split_k
    for opts, code, words in [("splits=5", "E215", "splits must be one of 1, 2, 3, 4, 6, 8"),
                              ("splits=4, schedule=pingpong", "E216", "needs the cooperative schedule"),
                              ("splits=2, tile=64x64x64", "E216", "cooperative schedule needs tile M = 128")]:
        with pytest.raises(EpicError) as info:
            analyze(text.format(opts=opts))
        assert info.value.codes == [code] and words in str(info.value), str(info.value)
    prog = analyze(text.format(opts="schedule=pingpong")).program      # a call cannot split a pingpong gemm
    with pytest.raises(EpicError) as info:
        planner.make_plan(prog, dict(M=64, K=64, N=64), {"g": {"splits": 2}})
    assert info.value.codes == ["E216"] and "splits=2 needs the cooperative schedule" in str(info.value)
    prog = analyze(text.format(opts="tile=128x128x64")).program        # a call's split keeps the file's tile
    cfg = planner.make_plan(prog, dict(M=64, K=64, N=64), {"g": {"splits": 2}}).configs["g"]
    assert (cfg.schedule, cfg.tile, cfg.splits) == ("cooperative", (128, 128, 64), 2)


# ------------------------------------------------------------------ a ragged ledger, row by row, by hand
def test_residual_rmsnorm_ledger_by_hand_at_ragged_sizes():
    """M = 77, D = 392 (not tile multiples): pingpong 64x64 tiles, partials [ceil(392/64), round_up(77, 64)]."""
    a = pipeline.analyze(str(ROOT / "samples" / "residual_rmsnorm.epi"))
    plan = planner.make_plan(a.program, dict(M=77, D=392), {"o_proj": {"combine": "kernel"}})   # not the tail
    m, d = 77, 392
    tile, vec, w, gamma = m * d * BF, m * F32, d * d * BF, d * BF
    part = 7 * 128 * F32
    assert plan.buffers["o_proj__row_mean_part0"].shape == (7, 128)
    fused = {r.kernel: (r.read_bytes, r.write_bytes) for r in ledger.fused_rows(plan)}
    assert fused == {"o_proj": (tile + w + tile + gamma, 2 * tile + part), "o_proj__row_combine": (part, vec)}
    unfused = [(r.read_bytes, r.write_bytes) for r in ledger.unfused_rows(a.source_program, plan.sizes)]
    assert unfused == [
        (tile + w, tile),            # the gemm writes its accumulator in bf16
        (2 * tile, tile),            # h = acc + z, stored as resid
        (tile + gamma, tile),        # hg = h * gamma
        (tile, tile),                # h * h (h read once)
        (tile, vec),                 # row_mean -> f32 [M]
        (vec, vec),                  # + eps (a scalar is not counted)
        (vec, vec),                  # rsqrt -> r
    ]
    text = ledger.render(plan, a.source_program)
    total_fused = sum(fused["o_proj"]) + sum(fused["o_proj__row_combine"])
    total_unfused = sum(x + y for x, y in unfused)
    assert f"total fused      {total_fused:>16,} B  (544.0 KiB) in 2 kernels" in text
    assert f"total op by op   {total_unfused:>16,} B  (891.9 KiB) in 7 kernels" in text
    assert f"fused / op by op {total_fused / total_unfused:>16.3f}" in text
    assert "  o_proj__row_mean_part0       partial float32[7, 128]" in text
    assert "written by o_proj__row_combine; read by -" in text
    assert "1. o_proj: gemm x @ wo  [pingpong 64x64x64 cluster 1x1]" in text
    assert "writes resid, hg; per-tile partials (mean)" in text


def test_ledger_names_a_definition_call_as_one_operation():
    a, plan = prenorm_plan()
    labels = [r.kernel.strip() for r in ledger.unfused_rows(a.source_program, plan.sizes)]
    assert "rmsnorm(...)" in labels and "swiglu(...)" in labels
    assert ledger._mib(512) == "512 B" and ledger._mib(2048) == "2.0 KiB" and ledger._mib(3 << 20) == "3.00 MiB"


def test_configuration_text():
    assert str(config.KernelConfig("pingpong", (64, 64, 64))) == "pingpong 64x64x64 cluster 1x1"
    cfg = config.KernelConfig("cooperative", (128, 256, 64), (2, 1), "direct", (128, 64), 8, "n")
    assert str(cfg) == "cooperative 128x256x64 cluster 2x1 aux_load=direct epilogue 128x64 swizzle 8 raster n"
    assert cfg.key() == "coop_128x256x64_c2x1_direct_e128x64" and cfg.raster_code == 2


# ------------------------------------------------------------ every entry and line of a small ledger
SMALL = """def sq(x) = x * x
gemm g(x: e4m3[M, K] @ w: e4m3[K, N]) {
  in bias: bf16[N]
  h = acc + bias
  out y: bf16 = h
  out r: f32[M] = row_sum(sq(h))
  out q: f32[M, N/32] = block_max(abs(h), 32)
}
"""


def test_unfused_rows_entry_by_entry():
    """fp8 A: the op-by-op accumulator is bf16; statistics f32; a call of a definition is one row
    named after it; an unnamed op is named after its primitive; stored values take their dtype."""
    a = analyze(SMALL)
    rows = ledger.unfused_rows(a.source_program, dict(M=4, K=32, N=64))
    tile = "bf16[4, 64]"
    assert [(r.kernel, r.kind, r.reads, r.writes) for r in rows] == [
        ("g (gemm)", "gemm", [("x", "e4m3[4, 32]", 128), ("w", "e4m3[32, 64]", 2048)], [("acc", tile, 512)]),
        ("  h", "op", [("acc", tile, 512), ("bias", "bf16[64]", 128)], [("y", tile, 512)]),
        ("  sq(...)", "op", [("h", tile, 512)], [("mul", tile, 512)]),
        ("  r", "op", [("mul", tile, 512)], [("r", "f32[4]", 16)]),
        ("  abs", "op", [("h", tile, 512)], [("abs", tile, 512)]),
        ("  q", "op", [("abs", tile, 512)], [("q", "f32[4, 2]", 32)]),
    ]


def test_bf16_accumulator_and_vectors_op_by_op():
    a = analyze("gemm g(x: f16[M, K] @ w: f16[K, N]) {\n  in s: f32[M]\n  c = col_sum(acc)\n"
                "  out y: f16 = acc * s\n  out z: f32[N] = c * 2\n}\n")
    rows = ledger.unfused_rows(a.source_program, dict(M=4, K=8, N=16))
    assert rows[0].writes == [("acc", "f16[4, 16]", 128)]             # a 16-bit A keeps its own dtype
    assert ("  c", "op", [("acc", "f16[4, 16]", 128)], [("c", "f32[16]", 64)]) in \
        [(r.kernel, r.kind, r.reads, r.writes) for r in rows]
    assert ("  z", "op", [("c", "f32[16]", 64)], [("z", "f32[16]", 64)]) in \
        [(r.kernel, r.kind, r.reads, r.writes) for r in rows]


def test_sizes_in_words():
    assert [ledger._mib(b) for b in (0, 1023, 1024, 1536, (1 << 20) - 1, 1 << 20, 3 << 19)] == \
        ["0 B", "1023 B", "1.0 KiB", "1.5 KiB", "1024.0 KiB", "1.00 MiB", "1.50 MiB"]


def test_render_line_by_line():
    """bias + acc at M=4, K=8, N=16, every number by hand: fused, the gemm reads x (64 B), w (256 B)
    and bias (32 B) and writes y (128 B); op by op, the gemm writes acc (128 B) and the add reads it
    with bias and writes y."""
    a = analyze("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in bias: bf16[N]\n  out y: bf16 = acc + bias\n}\n")
    plan = planner.make_plan(a.program, dict(M=4, K=8, N=16))
    lines = ledger.render(plan, a.source_program).splitlines()
    assert lines[:8] == ["plan for t.epi at M=4, K=8, N=16, for an H200 or any other GPU", "", "kernels (in launch order):",
                         "  1. g: gemm x @ w  [pingpong 64x64x64 cluster 1x1 a_rows=8]",
                         "       launched as a programmatic dependent of the caller's last kernel on the stream; "
                         "asks L2 for its first tile's w while it waits",
                         "       1 tile: one round on 1 of 132 SMs",
                         "       loads 8 of each tile's 64 rows of x (a_rows=8: calls of at most 8 rows)", "       writes y"]
    buf = lines.index("buffers:")
    assert lines[buf + 1].split() == ["x", "input", "bfloat16[4,", "8]", "64", "B", "written", "by", "caller;",
                                      "read", "by", "g"]
    assert lines[buf + 3].split() == ["K-major", "(column-major", "[K,", "N])"]     # how to pass w
    assert lines[buf + 5].split() == ["y", "out", "bfloat16[4,", "16]", "128", "B", "written", "by", "g;",
                                      "read", "by", "-"]
    fused = lines.index("byte ledger, fused (this plan):")
    assert lines[fused + 1].split() == ["kernel", "read", "written", "detail"]
    assert lines[fused + 2].split() == ["g", "352", "128", "x", "bfloat16[4,", "8];", "w", "bfloat16[8,", "16];",
                                        "bias", "bfloat16[16]", "->", "y", "bfloat16[4,", "16]"]
    assert lines[fused + 3].split() == ["total", "352", "128"]
    unfused = lines.index("byte ledger, op by op without fusion (see epic/plan/ledger.py for the model):")
    assert lines[unfused + 2].split() == ["g", "(gemm)", "320", "128", "x", "bf16[4,", "8];", "w", "bf16[8,",
                                          "16]", "->", "acc", "bf16[4,", "16]"]
    assert lines[unfused + 3].split() == ["y", "160", "128", "acc", "bf16[4,", "16];", "bias", "bf16[16]", "->",
                                          "y", "bf16[4,", "16]"]
    assert lines[-3:] == ["total fused                   480 B  (480 B) in 1 kernels",
                          "total op by op                736 B  (736 B) in 2 kernels",
                          "fused / op by op            0.652"]


def test_trace_is_an_option_that_names_its_own_kernel_and_that_no_heuristic_picks():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]){opts} {{\n  out y: bf16 = acc\n}}\n"
    sizes = dict(M=8192, K=4096, N=14336)
    default = planner.make_plan(analyze(text.format(opts="")).program, sizes).configs["g"]
    traced = planner.make_plan(analyze(text.format(opts=" with trace=tiles")).program, sizes).configs["g"]
    assert default.trace == "off" and "trace" not in str(default) and "tiles" not in default.key()
    assert traced.key() == default.key() + "_tiles" and str(traced).endswith("trace=tiles")
    with pytest.raises(EpicError) as info:
        analyze(text.format(opts=" with trace=all"))
    assert info.value.codes == ["E215"] and "trace must be one of off, tiles" in str(info.value)


def test_the_plan_says_how_the_tiles_fill_the_persistent_grid():
    """By hand: N = 14336 on 128x192 tiles is 64 x 75 = 4800 tiles, 36 rounds of 132 CTAs and a 37th
    with 48; 4800 of 37 x 132 = 4884 slots hold a tile. One more row of tiles (M = 8320: 65 rows) is
    rounded to the 2x1 cluster: with swizzle 1, 66 x 75 = 4950 scheduled, 75 of them padding, 38 rounds
    (4950 - 37 x 132 = 66 in the last), 4875 of 5016 slots used; swizzle 8 groups rows by 16 (80 x 75)."""
    cfg = config.KernelConfig("pingpong", (128, 192, 64), (2, 1), swizzle=8, raster="n")
    r = tile_grid.rounds(cfg, 8192, 14336)
    assert (r.tiles, r.scheduled, r.grid, r.last) == (4800, 4800, 132, 48)
    assert r.rounds == pytest.approx(4800 / 132) and r.idle == pytest.approx(1 - 4800 / 4884)
    assert r.describe() == "4,800 tiles on 132 CTAs: 36.36 rounds, the last with 48 of 132 busy (tile slots idle: 1.7%)"
    assert tile_grid.rounds(cfg, 8320, 14336).scheduled == 80 * 75
    ragged = tile_grid.rounds(replace(cfg, swizzle=1), 8320, 14336)
    assert (ragged.tiles, ragged.scheduled, ragged.last) == (4875, 4950, 66)
    assert ragged.idle == pytest.approx(1 - 4875 / 5016)
    assert ragged.describe().startswith("4,950 tiles (with 75 padding tiles) on 132 CTAs: 37.50 rounds")
    # decode: one round; split-K counts one unit per split
    assert tile_grid.rounds(config.KernelConfig("pingpong", (64, 64, 64)), 64, 4096).describe() == \
        "64 tiles: one round on 64 of 132 SMs"
    split = tile_grid.rounds(config.KernelConfig("cooperative", (128, 128, 64), splits=3), 64, 4096)
    assert (split.tiles, split.grid, split.idle) == (96, 96, 0)


def test_the_rendered_plan_gives_each_gemms_rounds():
    a, plan = prenorm_plan()
    text = ledger.render(plan, a.source_program)
    assert plan.configs["gate_up"].tile[:2] == (128, 192)
    # gate/up at N = 2F = 28672: 64 x 150 = 9600 tiles, 72 full rounds of 132 and 96 in the 73rd;
    # 9600 of 73 x 132 = 9636 slots hold a tile
    assert "9,600 tiles on 132 CTAs: 72.73 rounds, the last with 96 of 132 busy (tile slots idle: 0.4%)" in text
