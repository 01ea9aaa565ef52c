"""A void D still takes shared memory: CUTLASS stages StagesD subtiles of it, of the DAG's ElementAux
(templates/gemm.cu.j2), which code generation sets to the first aux element it registers. The plan's
estimate (plan/config.void_d_bytes) must size it the same way, or it picks a configuration that leaves
the mainloop fewer than 2 stages and nvcc stops at CUTLASS's static_assert (E217): what happened on the
H200 to half_width_quant.epi's 128x256 pingpong tile at M = 8191 (an f32 aux store registered first)."""
import glob

import pytest
from hypothesis import HealthCheck, given, settings

import epic
from epic.diagnostics import EpicError
from epic.codegen import emit
from epic.plan import config as C, epilogue

from .conftest import ROOT
from .progen import program as random_program

BYTES = {"uint8_t": 1, "uint16_t": 2, "float": 4, "cutlass::bfloat16_t": 2, "cutlass::half_t": 2,
         "cutlass::float_e4m3_t": 1, "cutlass::float_e5m2_t": 1, "int8_t": 1, "int32_t": 4}
PROGRAMS = sorted(glob.glob(str(ROOT / "samples" / "*.epi")) + glob.glob(str(ROOT / "tests" / "programs" / "*.epi")))


def _specs(path, m):
    prog = epic.compile(path)
    configs = emit.kernel_configs(prog.program, m)
    return prog.program, [s for s in emit.specs(prog.program, configs) if hasattr(s, "aux_element")]


def _agrees(text_or_path, m) -> bool:
    """Whether code generation took the program (what it refuses, it says so itself); if so, the
    estimate's D (written, or void of which element) is the generated one for every gemm."""
    try:
        program, specs = _specs(text_or_path, m)
    except EpicError:
        return False
    for spec in specs:
        nodes = epilogue.chosen(program.kernel(spec.name), program.tensors)
        want = None if spec.element_d != "void" else BYTES[spec.aux_element]
        assert C.void_d_bytes(nodes) == want, (spec.name, spec.element_d, spec.aux_element)
    return True


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.split("/")[-1])
def test_the_estimate_sizes_a_void_d_as_code_generation_declares_it(path):
    if not _agrees(path, 64):
        pytest.skip("a program code generation refuses (its own tests say why)")


# derandomize: the same examples every run (--hypothesis-seed=random explores further)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(random_program())
def test_random_programs_agree_with_code_generation_on_whether_d_is_written(text):
    for m in (64, 8192):
        _agrees(text, m)


def test_an_f32_aux_store_before_a_byte_root_sizes_d_at_two_bytes_per_element():
    program, specs = _specs(str(ROOT / "tests" / "programs" / "half_width_quant.epi"), 8192)
    k = program.kernel("g")
    cfg = C.KernelConfig("pingpong", (128, 256, 64), (2, 1), epi_tile=(64, 256))
    epi, stage = C.smem_estimate(k, program.tensors, cfg)
    # by hand: 2 subtiles of 64x256 -> StagesD 2, StagesC 2. h (f32 [M, F]) as uint16 pairs 2 B, dy
    # (bf16 [M, F]) loaded as bytes 1 B, the void D of uint16 (h's element, registered first) 2 B
    assert epi == 64 * 256 * (2 * 2 + 2 * 1 + 2 * 2)
    assert epi + 2 * stage > C.SMEM_BYTES - C.SMEM_RESERVE          # what nvcc refused
    chosen = emit.kernel_configs(program, 8191, None, dict(M=8191, K=200, F=200))["g"]
    assert C.fits(k, program.tensors, chosen)
    assert (chosen.schedule, chosen.tile, chosen.epi_tile) != (cfg.schedule, cfg.tile, cfg.epi_tile)


def test_split_k_of_that_program_is_refused_at_plan_time_not_by_nvcc():
    from .gpu_cases import NO_SPLIT, PROGRAMS, split_k_config
    for name in NO_SPLIT:
        prog = epic.compile(str(ROOT / name))
        split = epic.compile(str(ROOT / name), config=split_k_config(prog.program))
        with pytest.raises(EpicError) as info:
            split.plan(PROGRAMS[name](77, 392, 200))
        assert info.value.codes == ["E217"]


@pytest.mark.parametrize("path, kernel, cfg, want", [
    # int4_group_scale's root packs its bytes itself: 2 subtiles of 64x32 staged as the void D of uint8
    ("samples/int4_pack.epi", "proj", C.KernelConfig("pingpong", (64, 64, 64), epi_tile=(64, 32)), 64 * 32 * 2 * 1),
    # SwiGLU + 1x128 e4m3: one 64x256 subtile, the void D of uint8 (the root's, no aux store before it)
    ("samples/swiglu_fp8_quant.epi", "gate_up", C.KernelConfig("pingpong", (64, 256, 64), epi_tile=(64, 256)),
     64 * 256 * 1 * 1),
])
def test_a_byte_writing_root_alone_stages_a_one_byte_void_d(path, kernel, cfg, want):
    program = epic.compile(str(ROOT / path)).program
    assert C.smem_estimate(program.kernel(kernel), program.tensors, cfg)[0] == want


def test_cutlass_s_automatic_subtile_follows_a_void_d_s_element():
    # only a packed i4 store (written by its own node): D is void, of bf16 (no aux element registered),
    # so CUTLASS's automatic subtile is 64x32 as for a bf16 D -- 4 subtiles of a 64x128 tile, 2 staged
    program = epic.compile("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out p: i4 = acc\n}\n").program
    cfg = C.KernelConfig("pingpong", (64, 128, 64))
    assert C.smem_estimate(program.kernel("g"), program.tensors, cfg)[0] == 64 * 32 * 2 * 2
