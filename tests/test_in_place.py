"""Tiles the row combine kernel finishes in place (plan.aliases): the gemm stores cross entropy's
logits (bf16) for the combine kernel to finish into dlogits; the two share one buffer."""
import re

import pytest

import epic
from epic.diagnostics import EpicError
from epic.codegen import emit
from epic.plan import planner

from .conftest import ROOT

FUSED_CE = str(ROOT / "tests" / "programs" / "fused_cross_entropy.epi")
SIZES = dict(M=300, D=200, V=392)


def test_the_finished_dlogits_lie_in_the_logits_buffer():
    plan = epic.compile(FUSED_CE).plan(SIZES)
    assert plan.aliases == {"d_lm_head_acc__pre0": "d_lm_head_acc"}
    assert plan.storage("d_lm_head_acc__pre0") == "d_lm_head_acc" and plan.storage("d_x") == "d_x"
    allocated = {b.name for b in plan.allocations()}
    assert "d_lm_head_acc" in allocated and "d_lm_head_acc__pre0" not in allocated
    # one [M, V] bf16 buffer fewer than the plan without the alias
    whole = sum(b.nbytes for b in plan.allocations())
    every = sum(b.nbytes for b in plan.buffers.values() if b.role in ("out", "tmp", "buffer", "partial"))
    assert every - whole == 300 * 392 * 2
    assert "in d_lm_head_acc's memory" in plan.buffers["d_lm_head_acc__pre0"].layout


def test_a_plan_without_every_size_is_e607():
    with pytest.raises(EpicError) as info:
        epic.compile(FUSED_CE).plan(dict(M=300, D=200))
    assert info.value.codes == ["E607"] and "no size given for V" in str(info.value)


def test_no_alias_where_the_finished_tile_has_another_dtype():
    # per-token int8: the gemm stores the unquantized f32 tile, the combine kernel an int8 one
    plan = epic.compile(str(ROOT / "tests" / "programs" / "per_token_i8.epi")).plan(dict(M=300, K=200, N=400, P=144))
    assert any("__pre" in b for b in plan.buffers) and plan.aliases == {}


def test_a_pre_tile_another_kernel_reads_is_not_overwritten():
    plan = epic.compile(FUSED_CE).plan(SIZES)
    buffers = dict(plan.buffers)
    pre = buffers["d_lm_head_acc__pre0"]
    buffers["d_lm_head_acc__pre0"] = planner.Buffer(pre.name, pre.role, pre.dtype, pre.shape, pre.torch_dtype,
                                                     pre.nbytes, pre.layout, pre.writer, [*pre.readers, "lm_head_da"])
    assert planner.in_place(plan.program, buffers) == {}


def test_the_finish_loop_reads_each_element_before_it_stores_over_it():
    """In place is safe because every loop of the finish reads the logits of its columns before it
    stores their dlogits, in the same lane: no read of the logits after a store in one iteration."""
    prog = epic.compile(FUSED_CE)
    for v in (392, 512):        # the one-column loop (W % 16 != 0) and the vector loop (16 columns a step,
        #                            several steps loaded before the first is stored)
        plan = prog.plan(dict(SIZES, V=v))
        (spec, unit), = [(s, u) for s, u in emit.units(prog.program, plan.configs) if "combine" in u.name]
        ptr = {p.tensor: f"p{i}" for i, p in enumerate(spec.pointers) if p.role != "out"}
        out = {p.tensor: f"p{i}" for i, p in enumerate(spec.pointers) if p.role == "out"}
        read, write = ptr["d_lm_head_acc__pre0"], out["d_lm_head_acc"]
        loops = re.findall(r"for \(long long (?:j0|n) = .*?\n(.*?)\n  \}", unit.source, re.S)
        assert len(loops) == 2, unit.source
        for body in loops:
            reads = [m.start() for m in re.finditer(rf"\({read}\)", body)]
            writes = [m.start() for m in re.finditer(rf"\({write}\)", body)]
            assert reads and writes and max(reads) < min(writes), body
