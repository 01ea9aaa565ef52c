"""The heuristic's tiles per GPU (plan/gpus.py): an H100 SXM takes cooperative 128x256 for element-wise
epilogues that store one tile (and for 1xB block quantization, its scales a second store), at many rows
and an N that 192-wide tiles do not fit; every other GPU, and every other gemm, keeps the H200-measured
choice. Calls plan for the GPU they run on; `epic plan`
and `epic compile` for --gpu; bundles and builds without a GPU hold both."""
from unittest import mock

import pytest

from epic import pipeline
from epic.plan import gpus, planner
from epic.runtime import bundle_build
from epic.runtime.compiled import CompiledProgram

from .conftest import analyze

H100_NAME = "NVIDIA H100 80GB HBM3"
COOP = ("cooperative", (128, 256, 64), (2, 1))
PING = ("pingpong", (128, 128, 64), (2, 1))
PLAIN = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out y: bf16 = acc\n}\n"
BIAS_GELU = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in bias: bf16[N]\n"
             "  out y: bf16 = gelu(acc + bias)\n}\n")
RESIDUAL_ADD = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: bf16[M, N]\n  out y: bf16 = acc + z\n}\n"
ROW_STATISTIC = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  out r: f32[M] = rsqrt(row_mean(acc * acc) + 1e-6)\n}\n"
FP8_BLOCK_QUANT = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  s = fp8_e4m3_scale(acc, 128)\n"
                   "  out q: e4m3 = acc / s\n  out q_scale: f32[M, N/128] = s\n}\n")
# a block statistic and a pair map (QK-norm + RoPE's kind of epilogue), one store
BLOCK_NORM_PAIRS = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  r = rsqrt(block_mean(acc * acc, 128) + 1e-6)\n"
                    "  n = acc * r\n  out y: bf16 = interleave(even(n) - odd(n), odd(n) + even(n))\n}\n")
# a block statistic that does not quantize (QK-norm's head RMS without RoPE): not measured alone
BLOCK_NORM = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  r = rsqrt(block_mean(acc * acc, 128) + 1e-6)\n"
              "  out y: bf16 = acc * r\n}\n")
TWO_STORES = ("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: bf16[M, N]\n  out h: bf16 = acc + z\n"
              "  out y: bf16 = gelu(acc + z)\n}\n")


def tile(text: str, sizes: dict, gpu) -> tuple:
    """(schedule, tile, cluster) of gemm g's plan at sizes for the GPU of key `gpu`."""
    cfg = planner.make_plan(analyze(text).program, sizes, gpu=gpu).configs["g"]
    return cfg.schedule, cfg.tile, cfg.cluster


def test_gpu_keys_from_cuda_names():
    """Only the H100 measured (SXM, HBM3) has a key of its own; an H200, an H100 PCIe and no GPU get None."""
    assert gpus.key(H100_NAME) == gpus.H100
    for name in ("NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB", None, ""):
        assert gpus.key(name) is None, name


@pytest.mark.parametrize("text", [PLAIN, BIAS_GELU, RESIDUAL_ADD], ids=["plain", "bias_gelu", "residual_add"])
@pytest.mark.parametrize("sizes", [dict(M=8192, K=4096, N=4096), dict(M=4096, K=14336, N=4096),
                                   dict(M=8192, K=4096, N=2048)], ids=["4096", "down", "2048"])
def test_an_h100_takes_the_cooperative_tile_for_element_wise_epilogues(text, sizes):
    assert tile(text, sizes, gpus.H100) == COOP
    assert tile(text, sizes, None) == PING


def test_an_h100_takes_the_cooperative_tile_for_block_quantization():
    """fp8 1x128 block quantization (a block statistic as a quantizing store's scale, the scales stored
    too) measured faster with it on an H100 at M = 4096 and 8192, interleaved and back to back."""
    for sizes in (dict(M=8192, K=4096, N=4096), dict(M=4096, K=4096, N=4096)):
        assert tile(FP8_BLOCK_QUANT, sizes, gpus.H100) == COOP
        assert tile(FP8_BLOCK_QUANT, sizes, None) == PING


@pytest.mark.parametrize("text, sizes", [
    (ROW_STATISTIC, dict(M=8192, K=4096, N=4096)),      # a row statistic: measured level or slower
    (BLOCK_NORM_PAIRS, dict(M=8192, K=4096, N=4096)),   # QK-norm's kind: slower back to back
    (BLOCK_NORM, dict(M=8192, K=4096, N=4096)),         # a block statistic stored as bf16: not measured
    (TWO_STORES, dict(M=8192, K=4096, N=4096)),         # two stores: not measured
    (PLAIN, dict(M=2048, K=4096, N=4096)),              # fewer rows than measured
    (PLAIN, dict(M=8192, K=4096, N=4000)),              # N not a multiple of 256
], ids=["row_statistic", "block_norm_pairs", "block_norm", "two_stores", "2048_rows", "n_4000"])
def test_an_h100_keeps_the_default_elsewhere(text, sizes):
    assert tile(text, sizes, gpus.H100) == tile(text, sizes, None)


def test_an_h100_keeps_wide_tiles_and_what_the_file_fixes():
    """N = 14336 and 8192 take 192-wide tiles on either GPU; a tile and schedule the file fixes are kept
    (a tile alone keeps the heuristic's schedule where it accepts the tile: cooperative on an H100)."""
    for n in (14336, 8192):
        sizes = dict(M=8192, K=4096, N=n)
        assert tile(PLAIN, sizes, gpus.H100) == tile(PLAIN, sizes, None) == ("pingpong", (128, 192, 64), (2, 1))
    fixed = PLAIN.replace(") {", ") with tile=128x128x64, schedule=pingpong {", 1)
    assert tile(fixed, dict(M=8192, K=4096, N=4096), gpus.H100) == PING
    tile_only = PLAIN.replace(") {", ") with tile=128x128x64 {", 1)
    assert tile(tile_only, dict(M=8192, K=4096, N=4096), gpus.H100) == ("cooperative", (128, 128, 64), (2, 1))


def test_a_call_plans_for_the_gpu_it_runs_on():
    """CompiledProgram.plan takes the key of the device's CUDA name, with or without EPIC_NO_TUNING."""
    prog = CompiledProgram(pipeline.analyze(BIAS_GELU, name="t.epi"))
    sizes = dict(M=8192, K=4096, N=4096)
    for name, want in ((H100_NAME, COOP), ("NVIDIA H200", PING), (None, PING)):
        with mock.patch("epic.runtime.compiled._device_name", return_value=name):
            for no_tuning in ("0", "1"):
                with mock.patch.dict("os.environ", {"EPIC_NO_TUNING": no_tuning}):
                    plan = prog.plan(sizes)
                    cfg = plan.configs["g"]
                    assert (cfg.schedule, cfg.tile, cfg.cluster) == want and plan.gpu == gpus.key(name)


def test_builds_without_a_gpu_hold_both_gpus_kernels():
    """epic build without a GPU, and a bundle anywhere, build both heuristics' kernels; with a GPU, a
    plain build builds that GPU's only."""
    program = pipeline.analyze(PLAIN, name="t.epi").program
    sizes = dict(M=8192, K=4096, N=4096)
    both = {"g.coop_128x256x64_c2x1", "g.ping_128x128x64_c2x1"}
    assert {u.name for u in bundle_build.units(program, sizes, None)} == both
    prog = CompiledProgram(pipeline.analyze(PLAIN, name="t.epi"))
    with mock.patch("epic.plan.gpus.local", return_value=(False, None)):
        assert {u.name for _, u in prog.units(sizes)} == both
    with mock.patch("epic.plan.gpus.local", return_value=(True, gpus.H100)):
        assert [u.name for _, u in prog.units(sizes)] == [n for n in both if "coop" in n]


def test_epic_plan_and_compile_take_gpu(tmp_path, capsys):
    """--gpu h100 / h200 choose the heuristic; the plan's first line names it."""
    from cli.main import main
    src = tmp_path / "plain.epi"
    src.write_text(PLAIN)
    assert main(["plan", str(src), "--shape", "M=8192,K=4096,N=4096", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("for an H100 SXM") and "cooperative 128x256x64 cluster 2x1" in out
    assert main(["plan", str(src), "--shape", "M=8192,K=4096,N=4096", "--gpu", "h200"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("for an H200 or any other GPU") and "pingpong 128x128x64" in out
    assert main(["compile", str(src), "-o", str(tmp_path / "h100"), "--shape", "M=8192,K=4096,N=4096",
                 "--gpu", "h100"]) == 0
    assert [p.name for p in (tmp_path / "h100").iterdir()] == ["plain.g.coop_128x256x64_c2x1.cu"]


def test_the_gpu_tests_prebuild_holds_both_gpus_kernels():
    """The device may be an H100 or an H200: tests.prebuild builds the H100 heuristic's plain kernel too."""
    from tests import prebuild
    names = {u.name for u in prebuild.all_units(["bench/programs/plain.epi"], False)}
    assert {"plain.coop_128x256x64_c2x1", "plain.ping_128x128x64_c2x1"} <= names


def _fake_nvidia_smi(tmp_path, monkeypatch, body: str) -> None:
    """An nvidia-smi on PATH that runs `body` (a shell script's text)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}")


@pytest.mark.parametrize("body, want", [
    ('echo "NVIDIA H100 80GB HBM3"\necho "NVIDIA H200"\n', (True, gpus.H100)),    # the first GPU's
    ('echo "NVIDIA H200"\n', (True, None)),
    ('echo "NVIDIA-SMI has failed" >&2\nexit 9\n', (False, None)),
    ('exit 0\n', (False, None)),
], ids=["h100_first", "h200", "fails", "silent"])
def test_the_front_end_names_this_machines_gpu_from_the_driver(tmp_path, monkeypatch, body, want):
    _fake_nvidia_smi(tmp_path, monkeypatch, body)
    assert gpus.local_without_torch() == want


def test_without_nvidia_smi_the_front_end_plans_for_an_h200(tmp_path, monkeypatch, capsys):
    from cli.main import main
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.local_without_torch() == (False, None)
    src = tmp_path / "plain.epi"
    src.write_text(PLAIN)
    assert main(["plan", str(src), "--shape", "M=8192,K=4096,N=4096"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("for an H200 or any other GPU")


def test_epic_plan_defaults_to_this_machines_gpu(tmp_path, monkeypatch, capsys):
    from cli.main import main
    _fake_nvidia_smi(tmp_path, monkeypatch, 'echo "NVIDIA H100 80GB HBM3"\n')
    src = tmp_path / "plain.epi"
    src.write_text(PLAIN)
    assert main(["plan", str(src), "--shape", "M=8192,K=4096,N=4096"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("for an H100 SXM") and "cooperative 128x256x64" in out
