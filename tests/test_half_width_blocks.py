"""1xB block statistics of a half-width value: SwiGLU's output quantized to fp8 with one scale per 1x128
block (samples/swiglu_fp8_quant.epi, DeepSeek-V3's MoE activations). A block of the [M, F] output is
2B columns of the [M, 2F] accumulator, each column pair holding one value. Meaning checked against
torch written here; the kernels run on the host against the reference (and in tests/test_hostsim.py,
tests/test_gpu.py through tests/gpu_cases.py)."""
import pytest
import torch
import torch.nn.functional as F

import epic
from epic import pipeline, reference
from epic.diagnostics import EpicError
from epic.plan import config as config_mod, planner

from . import hostsim
from .conftest import ROOT, analyze, diagnose
from .hostsim import harness
from .test_diagnostics import marked

SAMPLE = ROOT / "samples" / "swiglu_fp8_quant.epi"
D64 = torch.float64
GATE_UP = "gemm gate_up(x: bf16[M, D] @ wgu: bf16[D, 2*F]) {\n  h = swiglu(acc)\n"


@pytest.mark.parametrize("exact", [True, False])
def test_the_sample_means_swiglu_then_1x128_fp8_blocks(exact):
    program = pipeline.analyze(str(SAMPLE)).source_program
    sizes = dict(M=5, D=32, F=256)
    inputs = reference.random_inputs(program, sizes, seed=7)
    out = reference.run(program, inputs, exact=exact, sizes=sizes)
    y = inputs["x"].to(D64) @ inputs["wgu"].to(D64)
    h = (F.silu(y[:, 0::2]) * y[:, 1::2]).unflatten(-1, (-1, 128))
    s = h.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    q = h / s
    if not exact:
        q = q.clamp(-448, 448).to(torch.float8_e4m3fn).to(D64)
        s = s.float().to(D64)
    assert torch.allclose(out["q"].to(D64), q.flatten(1), rtol=1e-12, atol=0)
    assert torch.allclose(out["q_scale"].to(D64), s.squeeze(-1), rtol=1e-12, atol=0)


def test_a_block_of_the_half_width_value_is_twice_as_wide_in_the_tile():
    program = analyze(SAMPLE.read_text()).program
    assert config_mod.block_sizes(program.kernels[0]) == {256}
    for m, tile_n, cluster in ((8192, 256, (2, 1)), (64, 256, (1, 1))):
        cfg = planner.make_plan(program, dict(M=m, D=512, F=384)).configs["gate_up"]
        assert cfg.tile[1] == tile_n and cfg.cluster == cluster and cfg.epi_tile[1] == 256, cfg


def test_the_node_stores_one_byte_per_column_pair():
    spec, _ = epic.compile(str(SAMPLE)).units()[0]
    root = spec.nodes[-1]
    assert root.type == "epic_nodes::Sm90BlockScale<256, float, false, 0, 2, cutlass::float_e4m3_t>", root.type
    assert spec.element_d == "void"
    assert [(p.role, p.tensor) for p in spec.pointers[3:]] == [("block_scale", "q_scale"), ("byte_store", "q")]


@pytest.mark.parametrize("body, code, words", [
    # the block of a half-width value must fit a tile: 2 x 256 accumulator columns do not
    ("out q: e4m3 = h / fp8_e4m3_scale(h, $256)", "E404", "spans 512 columns of the accumulator"),
    # a twice-as-wide value is still refused: its pairs are not one thread's
    ("g = interleave(acc, acc)\n  out q: e4m3 = g / $fp8_e4m3_scale(g, 64)", "E402", "width 2 x N"),
])
def test_blocks_that_do_not_fit_are_refused(body, code, words):
    text, line, _ = marked(GATE_UP + f"  {body}\n}}\n")
    err = diagnose(text)
    assert err.codes == [code] and words in str(err), str(err)
    assert err.diagnostics[0].span.line == line


@pytest.mark.parametrize("options, words", [
    ("tile=128x128x64", "a 1x128 block of a half-width value (256 accumulator columns) does not divide the tile "
                        "width 128"),
    ("tile=128x256x64, epi_tile=128x128", "a 1x128 block of a half-width value (256 accumulator columns) does not "
                                         "divide the epilogue tile width 128"),
])
def test_a_fixed_tile_too_narrow_for_the_block_says_so_in_the_users_block(options, words):
    text = SAMPLE.read_text().replace("@ wgu: bf16[D, 2*F])", f"@ wgu: bf16[D, 2*F]) with {options}")
    err = diagnose(text)
    assert err.codes == ["E404"] and words in str(err), str(err)


def test_a_half_width_block_statistic_on_a_tile_is_refused_by_code_generation():
    prog = epic.compile(GATE_UP + "  out y: bf16 = h * block_max(abs(h), 64)\n}\n")
    with pytest.raises(EpicError) as info:
        prog.units()
    assert info.value.codes == ["E702"]


@pytest.fixture(scope="module")
def toolchain():
    hostsim.require_toolchain()


# (program, sizes, config M, configuration changes): the shared-block decode configuration (two 64x128
# CTAs of a 1x2 cluster share each 1x256 block), and a ragged last block (F = 208: 3 blocks of 64 and
# one of 16) with integer outputs, which must match the reference exactly
I8 = GATE_UP + "  out q8: i8 = h / int8_block_scale(h, 64)\n}\n"
CASES = [(str(SAMPLE), dict(M=77, D=200, F=384), 64, dict(tile=(64, 128, 64), cluster=(1, 2), epi_tile=(64, 128))),
         (I8, dict(M=77, D=200, F=208), 64, {}),
         (I8, dict(M=300, D=136, F=208), 8192, {})]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernels_on_the_host_match_the_reference(toolchain, tmp_path, case):
    text, sizes, config_m, options = CASES[case]
    path = text
    if not text.endswith(".epi"):
        path = str(tmp_path / "half_width.epi")
        (tmp_path / "half_width.epi").write_text(text)
    c = harness.prepare(path, sizes, config_m, options)
    harness.check(c, seed=case + 11)
