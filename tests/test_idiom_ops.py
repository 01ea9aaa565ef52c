"""Idioms as ops (issue 27): block quantization written in any of its spellings becomes the internal
op block_quant (passes/block_quant.py), which code generation matches; node choice by patterns with a
benefit, indexed by root op; the plan's shared memory summed over the chosen nodes."""
import json
import re

import pytest
import torch

from epic import pipeline, reference
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config as C
from epic.plan import epilogue as nodes
from epic.plan import verify
from epic.runtime import build

from . import hostsim
from .conftest import ROOT, analyze
from .hostsim import harness
from .test_cli import run as run_cli

GEMM = "gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n"
QMAX = {"e4m3": "448.0", "i8": "127.0", "i4": "7.0"}
M_ = "max(block_amax(acc, 64), 1e-12)"
SPELLINGS = {      # one quantization, written as the prelude does and otherwise
    "x / s": "acc / (max(block_max(abs(acc), 64), 1e-12) / QMAX)",
    "x * (qmax / m)": f"acc * (QMAX / {M_})",
    "x * (1 / s)": f"acc * (1.0 / ({M_} / QMAX))",
    "x / m * qmax": f"acc / {M_} * QMAX",
    "qmax * x / m": f"QMAX * acc / max(1e-12, block_amax(acc, 64))",
    "cast(x / s)": "DTYPE(acc / (max(block_amax(acc, 64), 1e-12) / QMAX))",
}


def program(dtype: str, spelling: str, scales: bool = True) -> str:
    body = SPELLINGS[spelling].replace("QMAX", QMAX[dtype]).replace("DTYPE", dtype)
    scale = f"  out q_scale: f32[M, N/64] = max(block_max(abs(acc), 64), 1e-12) / {QMAX[dtype]}\n" if scales else ""
    return GEMM + f"  out q: {dtype} = {body}\n" + scale + "}\n"


def sources(text: str, m: int = 8192) -> list[str]:
    prog = analyze(text).program
    return [u.source for _, u in emit.units(prog, emit.kernel_configs(prog, m))]


# ---------------------------------------------------------------- spellings
@pytest.mark.parametrize("scales", [True, False])
@pytest.mark.parametrize("spelling", list(SPELLINGS)[1:])
@pytest.mark.parametrize("dtype", list(QMAX))
def test_every_spelling_generates_the_block_scale_kernel(dtype, spelling, scales):
    """Each spelling builds the kernel the prelude's spelling builds, byte for byte (the node writes the
    stored scales too)."""
    want = sources(program(dtype, "x / s", scales))
    assert sources(program(dtype, spelling, scales)) == want
    assert "epic_nodes::Sm90BlockScale<64," in want[0]


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_the_rewritten_program_means_the_source(spelling):
    """The interpreter gives the same result before and after the pass, and for every spelling."""
    sizes = dict(M=7, K=32, N=192)
    first = pipeline.analyze(program("i8", "x / s"), name="t.epi")
    a = pipeline.analyze(program("i8", spelling), name="t.epi")
    inputs = reference.random_inputs(a.source_program, sizes, seed=3)
    assert max(verify.equivalence(a, inputs, sizes).values()) < 1e-12
    got = reference.run(a.program, inputs, exact=True, sizes=sizes)
    want = reference.run(first.source_program, inputs, exact=True, sizes=sizes)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-12, atol=0), name


def test_block_quant_means_x_over_its_block_scale():
    """The op's own meaning (its record's reference), against torch: a ragged last block (N = 200: three
    blocks of 64 and one of 8) and an all-zero block, whose scale is the floor and whose values stay 0."""
    a = pipeline.analyze(GEMM + "  out q: i8 = acc * (127.0 / max(block_amax(acc, 64), 0.5))\n}\n", name="t.epi")
    assert "block_quant" in {v.op for v in a.program.kernels[0].values}
    sizes = dict(M=5, K=16, N=200)
    inputs = reference.random_inputs(a.source_program, sizes, seed=4)
    inputs["w"][:, 64:128] = 0                            # the second block of every row is zero
    y = inputs["x"].double() @ inputs["w"].double()
    blocks = [y[:, j:j + 64] for j in range(0, 200, 64)]
    want = torch.cat([b / (b.abs().amax(1, keepdim=True).clamp_min(0.5) / 127.0) for b in blocks], 1)
    got = reference.run(a.program, inputs, exact=True, sizes=sizes)["q"]      # stored as i8: rounded, ties to even
    assert torch.equal(got, torch.round(want)) and (got[:, 64:128] == 0).all()
    assert (got[:, 192:].abs().amax(1) == 127).all()        # the ragged block's amax maps to qmax


def test_ir_after_the_pass_shows_the_op(capsys, tmp_path):
    path = tmp_path / "q.epi"
    path.write_text(program("e4m3", "x * (qmax / m)"))
    code, out, _ = run_cli(capsys, "ir", str(path), "--after", "block-quant")
    assert code == 0, out
    op = next(line for line in out.splitlines() if "block_quant" in line)
    assert re.search(r"block_quant 1x64 floor 1e-12 qmax 448, %\d+, %\d+\s+: tile f32", op), op
    store = next(line for line in out.splitlines() if "store q_scale" in line)
    assert store.split("<- ")[1] == op.split(", ")[-1].split()[0], "the op divides by the stored scale"


@pytest.mark.parametrize("text", [
    GEMM + "  out q: i8 = acc / (max(block_amax(acc, 64), 0.0) / 127.0)\n}\n",        # no floor: 0 / 0
    GEMM + "  out q: i8 = acc * (max(block_amax(acc, 64), 1e-12) / 127.0)\n}\n",      # times the scale
    GEMM + "  out q: i8 = acc * acc / max(block_amax(acc, 64), 1e-12)\n}\n",          # x twice
    GEMM + "  out q: i8 = acc / max(block_amax(acc + 1.0, 64), 1e-12)\n}\n",          # another tile's amax
    GEMM + "  out q: bf16 = acc / (max(block_amax(acc, 64), 1e-12) / 127.0)\n}\n",    # not a quantizing store
    GEMM + "  out q: i8 = acc / (max(block_amax(acc, 64), 1e-12) / 127.0)\n"
           "  out b: f32[M, N/64] = block_amax(acc, 64)\n}\n",                         # a block value not a scale
])
def test_what_is_not_block_quantization_is_left_alone(text):
    prog = analyze(text).program
    assert "block_quant" not in {v.op for k in prog.kernels for v in k.values}


# ---------------------------------------------------------------- on the host and with nvcc
@pytest.fixture(scope="module")
def toolchain():
    hostsim.require_toolchain()


@pytest.mark.parametrize("dtype, spelling", [("i8", "x * (qmax / m)"), ("i8", "x / s"), ("i4", "qmax * x / m")])
def test_kernels_on_the_host_match_the_reference(toolchain, tmp_path, dtype, spelling):
    path = tmp_path / "q.epi"
    path.write_text(program(dtype, spelling))
    harness.check(harness.prepare(str(path), dict(M=77, K=136, N=320), 64), seed=5)


@pytest.mark.nvcc
def test_nvcc_builds_a_respelled_block_quantization(tmp_path, monkeypatch):
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    prog = analyze(program("i8", "x * (qmax / m)")).program
    pairs = emit.units(prog, emit.kernel_configs(prog, 64))
    paths = build.build_all([u for _, u in pairs], quiet=True)
    assert len(paths) == 1 and paths[0].stat().st_size > 100_000


# ---------------------------------------------------------------- node patterns
def test_patterns_are_indexed_by_root_op_and_the_larger_benefit_wins():
    roots = nodes.Patterns(nodes.ROOTS)
    assert [i.__name__ for i in roots.by_op["block_quant"]][:3] == ["BlockScaleD", "BlockScaleInt4", "BlockScaleHalfWidth"]
    assert "BlockScaleD" not in [i.__name__ for i in roots.by_op["mul"]]      # only under its own op
    leaves = nodes.Patterns(nodes.LEAVES).by_op["load"]
    assert leaves.index(next(i for i in leaves if i.__name__ == "PeriodicRowBroadcast")) < \
        leaves.index(next(i for i in leaves if i.__name__ == "RowBroadcast"))
    partials = {i.__name__ for i in nodes.Patterns(nodes.STORES).by_op["partial"]}
    assert {"RowPartial", "ColPartial", "RowLsePartial"} <= partials


def test_two_patterns_of_one_benefit_matching_one_item_is_a_bug():
    class Twin(nodes.ROOTS[0]):
        pass
    prog = analyze(program("e4m3", "x / s")).program
    with pytest.raises(EpicError) as info:
        nodes.Patterns([nodes.ROOTS[0], Twin]).best(_Ctx(prog), prog.kernels[0].stores[0], "block_quant")
    assert info.value.codes == ["E599"]


class _Ctx:
    def __init__(self, prog):
        self.tensors, self.k = prog.tensors, prog.kernels[0]


# ---------------------------------------------------------------- shared memory: the sum over nodes
OLD = json.loads((ROOT / "tests" / "idiom_ops_smem.json").read_text())


@pytest.mark.parametrize("name", sorted(OLD))
def test_shared_memory_summed_over_nodes_is_the_old_tables(name):
    """Every configuration the heuristic tried or chose for each gemm of each sample and test program,
    with the epilogue bytes and the mainloop stage bytes the old per-dtype table gave (recorded from it;
    per_token_fp8's `up` since stages one f32 tile fewer: the row combine kernel no longer has the gemm
    store a reduction's operand it never reads back, `a * a` of `row_mean(a * a)`)."""
    prog = pipeline.analyze(str(ROOT / name)).program
    kernels = {k.name: k for k in prog.kernels if k.kind == "gemm"}
    assert set(kernels) == set(OLD[name])
    for kname, rows in OLD[name].items():
        if any(p.role == "root" and not p.writes_d for p, _, _ in nodes.chosen(kernels[kname], prog.tensors)):
            # a block-scale root writing its own bytes: the old table counted its bytes where CUTLASS
            # stages a void D of the first aux element (tests/test_void_d_smem.py checks those by hand)
            continue
        for schedule, tile, cluster, epi_tile, epi, stage in rows:
            cfg = C.KernelConfig(schedule, tuple(tile), tuple(cluster), epi_tile=tuple(epi_tile) if epi_tile else None)
            assert C.smem_estimate(kernels[kname], prog.tensors, cfg) == (epi, stage), (kname, cfg)
