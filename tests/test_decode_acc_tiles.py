"""Decode gemms that store their accumulator alone (a plain gemm, a derived backward's dX or dW, or the
gemm of combine=tail) take 64x32x128 tiles on 1x2 clusters at most 32 rows where those tiles fit one
round on 132 SMs, N up to 4224 (config.SHORT_ACC); a 32-wide tile runs no other epilogue (E216). What
the heuristic picks and refuses; the GPU comparison is test_gpu.py's short-box cases, the nvcc build
test_codegen.py's."""
import pytest

from epic import pipeline
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.ir import options as vocab
from epic.plan import config as plan_config

from .conftest import ROOT, planned_plain

SHORT_ACC = ("pingpong", (64, 32, 128), (1, 2))


def _config(path: str, m: int, sizes: dict, gemm: str | None = None):
    prog = pipeline.analyze(str(ROOT / path)).program
    configs = emit.kernel_configs(prog, m, None, {**sizes, "M": m})
    return configs[gemm] if gemm else next(iter(configs.values()))


def _form(cfg):
    return cfg.schedule, cfg.tile, cfg.cluster


@pytest.mark.parametrize("m, n, short", [(1, 4096, True), (16, 4096, True), (32, 4224, True), (8, 392, True),
                                         (33, 4096, False), (64, 4096, False), (16, 4256, False),
                                         (16, 6144, False), (16, 14336, False), (8192, 4096, False)])
def test_a_plain_gemm_takes_the_narrow_tile_at_most_32_rows_where_its_tiles_fit_one_round(m, n, short):
    _, cfg = planned_plain("swizzle=1", dict(M=m, K=4096, N=n))
    assert (_form(cfg) == SHORT_ACC) == short
    if short:     # with the short box of A where the call has at most 32 rows
        assert cfg.a_rows == next(r for r in (8, 16, 32) if m <= r)


def test_the_gemm_of_a_decode_tail_takes_it_and_its_epilogue_in_the_gemm_does_not():
    # residual + RMSNorm at 16 rows: the tail (a row statistic), its gemm storing the f32 accumulator
    cfg = _config("samples/residual_rmsnorm.epi", 16, dict(D=4096))
    assert cfg.combine == "tail" and _form(cfg) == SHORT_ACC and cfg.a_rows == 16
    # bias + GELU, fp8 1x128 quantization (its blocks in the gemm's epilogue up to 64 rows): not
    assert _form(_config("samples/bias_gelu.epi", 16, dict(K=4096, N=4096))) != SHORT_ACC
    fp8 = _config("samples/fp8_block_quant.epi", 16, dict(K=4096, N=4096))
    assert fp8.combine == "kernel" and fp8.tile_n >= 64


def test_a_32_wide_tile_is_refused_for_an_epilogue_that_computes_more():
    text = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) with tile=64x32x64 {\n  in bias: bf16[N]\n  out y: bf16 = acc + bias\n}\n"
    prog = pipeline.analyze(text).program
    with pytest.raises(EpicError) as info:
        emit.kernel_configs(prog, 8, None, dict(M=8, K=256, N=256))
    assert info.value.codes == ["E216"]
    assert "a tile 32 wide runs a gemm that stores its accumulator alone" in str(info.value)
    assert "choose a tile 64 or more wide" in str(info.value)
    # the same tile for a plain gemm, in the file, at any size
    assert planned_plain("tile=64x32x64", dict(M=300, K=256, N=256))[1].tile == (64, 32, 64)


def test_stores_acc_only():
    plain = pipeline.analyze(str(ROOT / "bench" / "programs" / "plain.epi")).program.kernels[0]
    bias = pipeline.analyze(str(ROOT / "samples" / "bias_gelu.epi")).program.kernels[0]
    assert plan_config.stores_acc_only(plain, None) and not plan_config.stores_acc_only(bias, None)
    assert plan_config.stores_acc_only(bias, "tail")
    assert vocab.value_problem("tile", (64, 32, 128)) is None
    assert "N must be 32, 64, 128, 192 or 256" in vocab.value_problem("tile", (64, 48, 64))
