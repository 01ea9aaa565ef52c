"""combine=tail (epic/plan/tail.py, codegen/tail.py): a gemm that stores only its accumulator and one
kernel after it that runs the gemm's epilogue and its row combine kernel's math, a CTA per row."""
import pytest
import torch

from epic import pipeline, reference
from epic.codegen import emit, tail as tail_codegen
from epic.diagnostics import EpicError
from epic.plan import planner, tail

from .conftest import ROOT

TAIL = {"combine": "tail"}


def analyzed(name: str):
    return pipeline.analyze(str(ROOT / name)).program


def tail_plan(name: str, sizes: dict, gemm: str):
    return planner.make_plan(analyzed(name), sizes, {gemm: dict(TAIL)})


def test_the_gemm_stores_its_accumulator_and_the_tail_does_the_rest():
    plan = tail_plan("samples/residual_rmsnorm.epi", dict(M=64, D=4096), "o_proj")
    gemm, after = plan.program.kernels
    assert [k.kind for k in plan.program.kernels] == ["gemm", "tail"]
    assert [s.tensor for s in gemm.stores] == ["o_proj__acc"] and [v.op for v in gemm.values] == ["acc"]
    assert after.name == "o_proj__tail" and after.source == "o_proj"
    assert sorted(s.tensor for s in after.stores) == ["hg", "r", "resid"]
    assert [v.attrs["fn"] for v in after.values if v.op == "reduce"] == ["mean"]
    acc = plan.buffers["o_proj__acc"]
    assert (acc.torch_dtype, acc.shape, acc.writer, acc.readers) == ("float32", (64, 4096), "o_proj", ["o_proj__tail"])
    assert not [b for b in plan.buffers.values() if b.role == "partial"]        # no per-tile partials
    assert {plan.buffers[t].writer for t in ("resid", "hg", "r")} == {"o_proj__tail"}
    assert plan.buffers["z"].readers == ["o_proj__tail"] and plan.buffers["gamma"].readers == ["o_proj__tail"]


@pytest.mark.parametrize("name, sizes, override, kinds", [
    ("samples/residual_rmsnorm.epi", dict(M=64, D=4096), None, ["gemm", "tail"]),       # the heuristic's
    ("samples/residual_rmsnorm.epi", dict(M=256, D=8192), None, ["gemm", "tail"]),
    ("samples/residual_rmsnorm.epi", dict(M=257, D=4096), None, ["gemm", "combine"]),   # past TAIL_ROWS
    ("samples/residual_rmsnorm.epi", dict(M=64, D=8200), None, ["gemm", "combine"]),    # past TAIL_N
    ("samples/residual_rmsnorm.epi", dict(M=64, D=4096), "kernel", ["gemm", "combine"]),  # the call's choice
    ("samples/cross_entropy.epi", dict(M=64, D=256, V=1024), None, ["gemm", "combine"]),  # stores no tile
    ("samples/prenorm_mlp.epi", dict(M=16, D=512, F=1024), None, ["gemm", "tail", "gemm", "gemm"]),
    # block statistics alone: the heads of QK-norm, fp8's scale blocks
    ("samples/qk_norm_rope.epi", dict(M=65, D=4096, H=32, Dh=128), None, ["gemm", "tail"]),
    ("samples/fp8_block_quant.epi", dict(M=65, D=4096, N=4096), None, ["gemm", "tail"]),
    ("samples/fp8_block_quant.epi", dict(M=512, D=4096, N=4096), None, ["gemm"]),
    ("samples/fp8_block_quant.epi", dict(M=64, D=4096, N=4096), None, ["gemm"]),    # below BLOCK_TAIL_ROWS
    ("samples/qk_norm_rope.epi", dict(M=64, D=4096, H=32, Dh=128), None, ["gemm"]),
    ("samples/qk_norm_rope.epi", dict(M=256, D=4096, H=32, Dh=128), None, ["gemm", "tail"]),
    ("samples/fp8_block_quant.epi", dict(M=64, D=4096, N=4096), "kernel", ["gemm"]),
    ("samples/swiglu_fp8_quant.epi", dict(M=64, D=4096, F=4096), None, ["gemm"]),    # blocks of SwiGLU's output
])
def test_the_heuristic_takes_the_tail_at_decode_where_a_gemm_stores_tiles(name, sizes, override, kinds):
    program = analyzed(name)
    first = next(k.name for k in program.kernels if k.kind == "gemm")
    plan = planner.make_plan(program, sizes, {first: {"combine": override}} if override else None)
    assert [k.kind for k in plan.program.kernels] == kinds
    if "tail" not in kinds:
        assert tail.rewrite(program, plan.configs) is program
    configs = emit.kernel_configs(program, sizes["M"], {first: {"combine": override}} if override else None, sizes)
    assert configs == plan.configs          # what a build (prebuild, bundles) makes is what the call plans


def test_a_block_statistic_gemm_that_takes_the_tail_leaves_its_blocks_to_it():
    """The 1x2 cluster (two CTAs sharing a 1x128 block) and the block-wide epilogue subtile a block
    statistic takes in the gemm's epilogue are not what a gemm storing its accumulator needs: with the
    tail it gets a plain gemm's configuration, and without it the block's."""
    sizes = dict(M=128, D=4096, H=32, Dh=128)
    program = analyzed("samples/qk_norm_rope.epi")
    tail_cfg = planner.make_plan(program, sizes).configs["q_proj"]
    in_gemm = planner.make_plan(program, sizes, {"q_proj": {"combine": "kernel"}}).configs["q_proj"]
    plain = planner.make_plan(analyzed("bench/programs/plain.epi"), dict(M=128, K=4096, N=4096)).configs["plain"]
    assert tail_cfg.combine == "tail" and (tail_cfg.tile, tail_cfg.cluster, tail_cfg.epi_tile) == (
        plain.tile, plain.cluster, plain.epi_tile)
    assert in_gemm.cluster == (1, 2) and in_gemm.epi_tile == (64, 64)


def test_a_rewritten_program_is_not_rewritten_again():
    """The plan's program (already with its tail kernels) through emit.specs: the same kernels, not E216
    for a gemm whose row combine kernel is gone."""
    plan = tail_plan("samples/residual_rmsnorm.epi", dict(M=64, D=4096), "o_proj")
    assert tail.rewrite(plan.program, plan.configs) is plan.program
    assert [type(s).__name__ for s in emit.specs(plan.program, plan.configs)] == ["KernelSpec", "TailSpec"]


@pytest.mark.parametrize("name, sizes, gemm", [
    ("samples/residual_rmsnorm.epi", dict(M=5, D=72), "o_proj"),
    # normalized rows returned: the tail's second pass over the columns, then a gemm reading them
    ("tests/programs/rmsnorm_out.epi", dict(M=7, K=40, D=48, N=24), "o_proj"),
    # dynamic per-token int8: a quantizing store after the row's amax, then an int8 gemm
    ("tests/programs/per_token_i8.epi", dict(M=6, K=40, N=48, P=32), "up"),
    # cross entropy: a row log-sum-exp and a picked label logit
    ("samples/cross_entropy.epi", dict(M=4, D=40, V=88), None),
    # 1xB block statistics, pairs and per-head vectors: QK-norm + RoPE, fp8 and int8 block quantization
    # with their scales stored, a block max and a block mean next to pairs, a per-head gamma
    ("samples/qk_norm_rope.epi", dict(M=5, D=40, H=3, Dh=128), None),
    ("samples/qkv_qk_norm.epi", dict(M=3, D=24, H=1, Dh=128), None),
    ("samples/fp8_block_quant.epi", dict(M=3, D=40, N=384), None),
    ("tests/programs/quant_exposed.epi", dict(M=4, K=40, N=256), "q8"),
    ("tests/programs/quant_exposed.epi", dict(M=4, K=40, N=256), "qi8"),
    ("tests/programs/block_stats.epi", dict(M=5, K=40, N=192, P=128), "scaled"),
    ("tests/programs/block_stats.epi", dict(M=5, K=40, N=192, P=128), "normed"),
    ("bench/programs/resid_norm_periodic.epi", dict(M=3, D=40, H=3, Dh=64), None),
])
def test_the_rewritten_program_computes_what_the_program_does(name, sizes, gemm):
    """The plan's program, run by the reference interpreter, against the program itself: the same
    outputs (within the f32 rounding of the stored accumulator; quantized stores may move one step)."""
    program = analyzed(name)
    gemm = gemm or next(k.name for k in program.kernels if k.kind == "gemm")
    plan = planner.make_plan(program, sizes, {gemm: dict(TAIL)})
    assert any(k.kind == "tail" for k in plan.program.kernels)
    inputs = reference.random_inputs(program, sizes, seed=3)
    want = reference.run(program, inputs)
    got = reference.run(plan.program, inputs)
    assert want.keys() == got.keys()
    for k, w in want.items():
        g = got[k]
        scale = w.abs().max().item() or 1.0
        step = 1.0 if plan.program.tensors[k].dtype.is_int else 1e-5 * scale
        assert (g - w).abs().max().item() <= step, k


@pytest.mark.parametrize("name, why", [
    ("samples/bias_gelu.epi", "it has no row or block statistic"),
    ("tests/programs/per_token_i4.epi", "it stores 'q' as i4"),
    ("tests/programs/col_stats.epi", "it has column statistics too"),
    # a block of the half-width SwiGLU output, an e8m0 scale store, a block narrower than a thread's columns
    ("samples/swiglu_fp8_quant.epi", "blocks of a value narrower than the accumulator"),
    ("samples/mxfp8_block_quant.epi", "as e8m0"),
    ("tests/programs/tiny_blocks.epi", "reduces 1x8 blocks (the tail's threads hold 16 columns each"),
])
def test_a_gemm_the_tail_cannot_run_says_why(name, why):
    program = analyzed(name)
    gemm = next(k.name for k in program.kernels if k.kind == "gemm")
    with pytest.raises(EpicError) as info:
        planner.make_plan(program, {d: 256 for d in program.dims}, {gemm: dict(TAIL)})
    d = info.value.diagnostics[0]
    assert d.code == "E216" and f"gemm '{gemm}' cannot take combine=tail" in d.message and why in d.message
    assert "combine=kernel" in d.hint


def test_the_tail_kernel_lowers_into_its_passes():
    program = analyzed("tests/programs/rmsnorm_out.epi")
    configs = emit.kernel_configs(program, 64, {"o_proj": dict(TAIL)}, dict(M=64, K=40, D=48, N=24))
    specs = emit.specs(program, configs)
    t = next(s for s in specs if isinstance(s, tail_codegen.TailSpec))
    assert t.reductions == 1 and t.first and t.second            # n = h * r * gamma needs the row first
    assert any("red_smem" in line for line in t.reduce)
    source = emit.render_tail(t)
    assert "griddepcontrol.wait" in source and "__launch_bounds__(kThreads)" in source
    roles = [(p.role, p.tensor) for p in t.pointers]
    assert ("tile", "o_proj__acc") in roles and ("out", "n") in roles and ("out", "resid") in roles


@pytest.mark.nvcc
def test_nvcc_builds_tail_kernels(tmp_path, monkeypatch):
    """The tail kernels of six programs (one pass; two passes; a quantizing store; 1xB block statistics
    with pairs and per-head vectors; fp8 block quantization storing its scales; a block max and mean
    with pairs), and the gemm that stores its accumulator, compiled by nvcc and loaded with the C ABI
    the runtime expects."""
    from epic.runtime import build, loader
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    pairs = []
    for name, sizes, gemm in [("samples/residual_rmsnorm.epi", dict(M=64, D=4096), "o_proj"),
                              ("tests/programs/rmsnorm_out.epi", dict(M=64, K=40, D=48, N=24), "o_proj"),
                              ("tests/programs/per_token_i8.epi", dict(M=64, K=40, N=48, P=32), "up"),
                              ("samples/qk_norm_rope.epi", dict(M=64, D=4096, H=32, Dh=128), "q_proj"),
                              ("samples/fp8_block_quant.epi", dict(M=64, D=4096, N=4096), "proj"),
                              ("tests/programs/block_stats.epi", dict(M=64, K=40, N=192, P=128), "normed")]:
        program = analyzed(name)
        units = emit.units(program, emit.kernel_configs(program, 64, {gemm: dict(TAIL)}, sizes))
        pairs += [(s, u) for s, u in units if isinstance(s, tail_codegen.TailSpec)]
    gemm = [(s, u) for s, u in emit.units(analyzed("samples/residual_rmsnorm.epi"), emit.kernel_configs(
        analyzed("samples/residual_rmsnorm.epi"), 64, {"o_proj": dict(TAIL)}, dict(M=64, D=4096)))
        if not isinstance(s, tail_codegen.TailSpec)]
    pairs += gemm
    paths = build.build_all([u for _, u in pairs], quiet=True)
    for (spec, _), p in zip(pairs, paths):
        lib = loader.load(p, [f"{x.role}:{x.tensor}" for x in spec.pointers])
        assert lib.info["kernel"] == spec.name
    assert gemm[0][0].config.key().endswith("_tail")


def test_the_plan_says_what_the_tail_does():
    from epic.plan import ledger
    analysis = pipeline.analyze(str(ROOT / "samples/residual_rmsnorm.epi"))
    plan = planner.make_plan(analysis.program, dict(M=64, D=4096), {"o_proj": dict(TAIL)})
    text = ledger.render(plan, analysis.source_program)
    assert "o_proj__tail: tail of o_proj (combine=tail)" in text and "writes o_proj__acc" in text
    fused = {r.kernel: r for r in ledger.fused_rows(plan)}
    assert fused["o_proj__tail"].read_bytes == 64 * 4096 * 4 + 64 * 4096 * 2 + 4096 * 2
    heads = pipeline.analyze(str(ROOT / "samples/qk_norm_rope.epi"))
    text = ledger.render(planner.make_plan(heads.program, dict(M=128, D=4096, H=32, Dh=128)), heads.source_program)
    assert "q_proj__tail: tail of q_proj (combine=tail): q_proj's epilogue on its stored accumulator, the 1xB " \
        "block statistics, a CTA per row" in text


def test_reference_of_the_plan_on_torch_inputs():
    """The plan's program runs in the reference interpreter on the inputs a caller would pass."""
    program = analyzed("samples/residual_rmsnorm.epi")
    plan = tail_plan("samples/residual_rmsnorm.epi", dict(M=3, D=16), "o_proj")
    x, wo = torch.randn(3, 16).bfloat16(), torch.randn(16, 16).bfloat16()
    z, g = torch.randn(3, 16).bfloat16(), torch.randn(16).bfloat16()
    args = dict(x=x, wo=wo, z=z, gamma=g)
    h = x.double() @ wo.double() + z.double()
    got = reference.run(plan.program, args)
    assert torch.allclose(got["r"].double().reshape(-1), torch.rsqrt(h.pow(2).mean(-1) + 1e-6), rtol=1e-5)
    assert torch.allclose(reference.run(program, args)["hg"].double(), got["hg"].double(), rtol=1e-2)


def test_a_sharded_call_refuses_a_tail(tmp_path):
    """run_sharded merges the ranks' per-tile partials; a tail computes none (each rank would normalize
    over its own columns): E216 instead of a wrong loss."""
    import types
    import torch.distributed as dist
    from epic.distributed import run_sharded
    program = analyzed("samples/cross_entropy.epi")
    plan = planner.make_plan(program, dict(M=8, D=16, V=64), {"lm_head": dict(TAIL)})

    class Sharded:          # a compiled program's face, bound at the rank's sizes
        def __init__(self):
            self.program, self._bound = program, {0: types.SimpleNamespace(plan=plan)}

        def __call__(self, **_):
            return {}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(EpicError) as info:
            run_sharded(Sharded(), x=torch.zeros(8, 16).bfloat16(), w=torch.zeros(16, 64).bfloat16(),
                        label=torch.zeros(8, dtype=torch.int32), column_inputs=("label",))
    finally:
        dist.destroy_process_group()
    d = info.value.diagnostics[0]
    assert d.code == "E216" and "combine=tail" in d.message and "combine=kernel" in d.hint


def test_epic_check_warns_where_a_file_asks_for_a_tail_a_gemm_cannot_take(tmp_path):
    """`epic check` lowers the plan's kernels as a build would: a tail the gemm cannot take is a warning
    that names it; a tail it can take lowers cleanly."""
    from epic.codegen import refusals
    text = (ROOT / "samples/bias_gelu.epi").read_text().replace("@ w: bf16[K, N]) {", "@ w: bf16[K, N]) with combine=tail {")
    bad = tmp_path / "bias_gelu_tail.epi"
    bad.write_text(text)
    analysis = pipeline.analyze(str(bad))
    (d,) = refusals.refusals(analysis.program, analysis.source_program)
    assert d.code == "E216" and "gemm 'up' cannot take combine=tail: it has no row or block statistic" in d.message
    good = tmp_path / "residual_rmsnorm_tail.epi"
    good.write_text((ROOT / "samples/residual_rmsnorm.epi").read_text().replace(
        "@ wo: bf16[D, D]) {", "@ wo: bf16[D, D]) with combine=tail {"))
    analysis = pipeline.analyze(str(good))
    assert refusals.refusals(analysis.program, analysis.source_program) == []
    heads = tmp_path / "qk_norm_rope_tail.epi"        # block statistics, pairs and per-head vectors
    heads.write_text((ROOT / "samples/qk_norm_rope.epi").read_text().replace(
        "@ wq: bf16[D, H*Dh]) {", "@ wq: bf16[D, H*Dh]) with combine=tail {"))
    assert "with combine=tail" in heads.read_text()
    analysis = pipeline.analyze(str(heads))
    assert refusals.refusals(analysis.program, analysis.source_program) == []
