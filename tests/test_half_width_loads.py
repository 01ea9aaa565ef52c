"""Tiles half as wide as the accumulator ([M, F] in a gemm with N = 2F) read in the epilogue: column
pair (2k, 2k+1) reads column k. Code generation loads such a tile as an [M, N] tile of bytes (f32:
half-words) and reassembles each element from its pair's two containers (codegen/nodes/leaves.py).
The host simulator runs both programs under the heuristic's configurations (tests/test_hostsim.py);
here: what is generated, what the plan counts, other epilogue subtiles, and nvcc."""
from dataclasses import replace

import pytest

import epic
from epic.codegen import emit
from epic.diagnostics import EpicError
from epic.plan import config, epilogue, planner

from . import hostsim
from .conftest import ROOT
from .hostsim import harness
from .test_hostsim import seed_of, sizes_for

LOAD = "tests/programs/half_width_load.epi"
SWIGLU_BWD = "tests/programs/half_width_swiglu_bwd.epi"
SIZES = dict(M=64, K=64, F=64)


def _gemm_spec(path: str, name: str, m: int = 64, sizes=SIZES, **changes):
    prog = epic.compile(str(ROOT / path) if path.endswith(".epi") else path)
    configs = {k: replace(c, **changes) for k, c in emit.kernel_configs(prog.program, m, None, sizes).items()}
    return next(s for s in emit.specs(prog.program, configs) if getattr(s, "name", None) == name)


def test_each_half_width_tile_is_read_as_an_accumulator_wide_tile_of_half_width_containers():
    spec = _gemm_spec(LOAD, "g")
    loads = {p.tensor: (p.dtype.name, p.note) for p in spec.pointers if p.role == "aux_load"}
    assert loads == {"dy": ("bf16", "[M, N/2] bf16 seen as [M, N] uint8_t"),
                     "g16": ("f16", "[M, N/2] f16 seen as [M, N] uint8_t"),
                     "g32": ("f32", "[M, N/2] f32 seen as [M, N] uint16_t")}
    nodes = {n.comment: n for n in spec.nodes}
    for tensor, element in (("dy", "uint8_t"), ("g16", "uint8_t"), ("g32", "uint16_t")):
        node = nodes[f"load tile {tensor}"]
        assert node.impl == "HalfWidthLoad" and node.type.startswith("Sm90AuxLoad<")
        assert f", {element}, StrideAux," in node.type and f"static_cast<{element} const*>" in node.args
    # each element's bits from its pair's two containers (low container = the even column)
    code = "\n".join(spec.functors)
    assert "epic_from_bits((uint32_t(in0[2 * k]) | (uint32_t(in0[2 * k + 1]) << 8)) << 16)" in code         # bf16
    assert "cutlass::half_t::bitcast(uint16_t(uint32_t(in2[2 * k]) | (uint32_t(in2[2 * k + 1]) << 8)))" in code
    assert "epic_from_bits(uint32_t(in0[2 * k]) | (uint32_t(in0[2 * k + 1]) << 16))" in code                 # f32


def test_the_shared_memory_estimate_counts_the_half_width_loads():
    """Each half-width load stages StagesC subtiles of its containers: 1 byte per accumulator element
    for bf16/f16, 2 for f32 -- the same stores without the loads need 4 bytes per element less."""
    without = epic.compile("""
gemm g(x: bf16[M, K] @ w: bf16[K, 2*F]) {
  out d: bf16[M, 2*F] = interleave(even(acc), odd(acc)) + acc
  out e: f32[M, 2*F] = acc
  out h: bf16[M, F] = silu(even(acc)) + odd(acc)
}""").program
    with_loads = epic.compile(str(ROOT / LOAD)).program
    cfg = replace(config.LARGE_M[0], epi_tile=(64, 32))      # 2 x 4 subtiles: StagesC = 4
    est = [config.smem_estimate(p.kernels[0], p.tensors, cfg)[0] for p in (with_loads, without)]
    assert est[0] - est[1] == 64 * 32 * 4 * (1 + 1 + 2)
    ctx_nodes = epilogue.chosen(with_loads.kernels[0], with_loads.tensors)
    assert sorted(p.__name__ for p, _, v in ctx_nodes if getattr(v, "op", None) == "load") == ["HalfWidthLoad"] * 3


def test_a_half_width_tile_needs_16_byte_rows():
    """The byte view's rows are 16-byte aligned exactly when the tile's are: F a multiple of 8 (bf16)."""
    prog = epic.compile(str(ROOT / LOAD))
    with pytest.raises(EpicError) as e:
        planner.make_plan(prog.program, dict(M=64, K=64, F=12))
    assert "E403" in e.value.codes and "'dy' (bf16) = F (it is 12) must be a multiple of 8" in str(e.value)
    planner.make_plan(prog.program, dict(M=64, K=64, F=8))


def test_half_width_tiles_of_one_byte_types_are_refused_with_the_reason():
    prog = epic.compile("""
gemm g(x: bf16[M, K] @ w: bf16[K, 2*F]) {
  in q: e4m3[M, F]
  out d: bf16[M, 2*F] = interleave(q * even(acc), odd(acc))
}""")
    with pytest.raises(EpicError) as e:
        emit.specs(prog.program, emit.kernel_configs(prog.program, 64, None, dict(M=64, K=64, F=64)))
    assert "E702" in e.value.codes and "'q' (a e4m3 tile, half as wide as the accumulator)" in str(e.value)
    assert "tiles half as wide as the accumulator ([M, N/2]) in bf16, f16 or f32" in str(e.value)


def test_swiglus_derived_backward_reads_its_gradient_as_a_half_width_tile():
    text = epic.grad(str(ROOT / "samples" / "swiglu.epi")).backward_text
    spec = _gemm_spec(text, "gate_up_bwd", sizes=dict(M=64, D=64, F=64))
    assert [n.comment for n in spec.nodes if n.impl == "HalfWidthLoad"] == ["load tile d_y"]


# ------------------------------------------------------------------------------ host simulator
@pytest.mark.parametrize("path", [LOAD, SWIGLU_BWD])
@pytest.mark.parametrize("changes", [dict(epi_tile=(64, 16)), dict(epi_tile=(64, 64)), dict(aux_load="direct")],
                         ids=["epi64x16", "epi64x64", "direct"])
def test_half_width_loads_match_the_reference_at_ragged_sizes_on_host(path, changes):
    """Other epilogue subtiles than the heuristic's (the narrowest: 16 bytes of a bf16 tile's byte
    view per row), and registers loaded straight from global memory; M, N, K ragged."""
    hostsim.require_toolchain()
    prog = harness.compiled(str(ROOT / path))
    sizes = sizes_for(prog.program, 77, 392, 200)
    case = harness.prepare(str(ROOT / path), sizes, 8192, changes)
    assert sizes["F"] % 64 and "HalfWidthLoad" in {n.impl for s in case.specs if hasattr(s, "nodes") for n in s.nodes}
    harness.check(case, seed_of(path, tuple(changes.items())))


# ------------------------------------------------------------------------------ nvcc
def _build(units, tmp_path, monkeypatch) -> None:
    from epic.runtime import build
    if not build.shutil.which("nvcc"):
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    for path in build.build_all(units, quiet=True):
        assert path


@pytest.mark.nvcc
def test_nvcc_builds_half_width_loads_through_tma_and_straight_to_registers(tmp_path, monkeypatch):
    prog = epic.compile(str(ROOT / LOAD)).program
    sizes = dict(M=8192, K=256, F=256)
    units = []
    for m, changes in ((8192, {}), (64, dict(aux_load="direct"))):
        configs = {k: replace(c, **changes) for k, c in emit.kernel_configs(prog, m, None, sizes).items()}
        units += [u for _, u in emit.units(prog, configs)]
    _build(units, tmp_path, monkeypatch)


@pytest.mark.nvcc
def test_nvcc_builds_swiglus_derived_backward(tmp_path, monkeypatch):
    """The gemm whose epilogue reads d_y at half width. The backward's other two (d_a = d_gate_up @ W^T
    and d_b = A^T @ d_gate_up) have identity epilogues on the operand layouts and tiles that
    test_operand_layouts.py builds (its dx and dw): building them again here costs CI two CUTLASS
    compiles and checks nothing new."""
    prog = epic.compile(epic.grad(str(ROOT / "samples" / "swiglu.epi")).backward_text).program
    sizes = dict(M=64, D=256, F=256)
    pairs = emit.units(prog, emit.kernel_configs(prog, 64, None, sizes))
    plain = {"AccFetch", "_Compute"}
    fused = [u for s, u in pairs if {n.impl for n in s.nodes} - plain]
    assert len(pairs) == 3 and [u.name for u in fused] == ["gate_up_bwd.ping_64x64x64_c1x1"]
    assert "HalfWidthLoad" in {n.impl for s, _ in pairs for n in s.nodes}
    _build(fused, tmp_path, monkeypatch)
