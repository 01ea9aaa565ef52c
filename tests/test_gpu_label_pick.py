"""Cross entropy's label logit on a GPU with labels anywhere: on both sides of tile edges, the last
column, and outside the columns (HF's ignore_index -100, V, past V, the i32 extremes).

The gemm writes the per-tile partials of row_pick (a row sum of select(col == label, x, 0)) with
epic_nodes::Sm90RowPickPartial: x at column label[m] from the one lane that holds it, 0 from every other
tile. That must be the stock reduction of the select bit for bit (the `summed` form, plan/epilogue.py's
PICK_NODE off), so every buffer is compared byte for byte with it, and the outputs with the float64
reference; with the combine picking the label's tile (the default) and with the combine folded into
the gemm (combine=fold), which merges every tile's partial.
"""
from unittest import mock

import pytest
import torch

import epic
from epic import reference
from epic.plan import epilogue

from .gpu_cases import PROGRAMS, fold_config, make_inputs, path, to_device
from .test_gpu import check_close, seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

NAME = "samples/cross_entropy.epi"
# (M, V, D) as tests/gpu_cases.py's SIZES and MANY_ROWS_SIZES write them: their default kernels are built
SIZES = [(77, 392, 200), (8191, 392, 200), (300, 4104, 136)]


def special_labels(v: int) -> list[int]:
    return [-100, -1, 0, 1, 63, 64, 127, 128, 191, 192, 255, 256, v - 1, v, v + 7, 2**31 - 1, -2**31]


def summed():
    """The select summed by the stock row reduction (the form before the pick node)."""
    return mock.patch.object(epilogue, "PICK_NODE", False)


def units():
    """The `summed` form's kernels, for python -m tests.prebuild (the others are the suite's own)."""
    from epic.codegen import emit
    out = []
    with summed():
        prog = epic.compile(path(NAME))
        for size in SIZES:
            sizes = PROGRAMS[NAME](*size)
            out += [u for _, u in emit.units(prog.program, emit.kernel_configs(prog.program, sizes["M"], None, sizes))]
    return out


def _picks(prog, sizes) -> bool:
    """Whether the program's gemm at these sizes writes the label logit with the pick node."""
    from epic.codegen import emit
    return any("epic_nodes::Sm90RowPickPartial<" in u.source for _, u in emit.units(prog.program, prog.plan(sizes).configs))


def _inputs(prog, size):
    sizes = PROGRAMS[NAME](*size)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed_of("label pick", size))
    special = special_labels(sizes["V"])
    inputs["label"][:len(special)] = torch.tensor(special, dtype=inputs["label"].dtype)
    inputs["label"][len(special)::5] = -100
    return sizes, inputs


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_label_logit_anywhere_matches_reference_and_the_summed_form(size):
    prog = epic.compile(path(NAME))
    sizes, inputs = _inputs(prog, size)
    assert _picks(prog, sizes)
    want = reference.run(prog.analysis.source_program, inputs, exact=False, sizes=sizes)
    dev = to_device(prog.program, inputs)
    got = prog(poison=True, keep=True, **dev)
    with summed():
        base = epic.compile(path(NAME))
        assert not _picks(base, sizes)
        old = base(poison=True, keep=True, **dev)
    folded = epic.compile(path(NAME), config=fold_config(prog.program))(poison=True, **dev)
    torch.cuda.synchronize()
    assert set(got) == set(old)
    for t in got:
        assert torch.equal(got[t].reshape(-1).view(torch.uint8), old[t].reshape(-1).view(torch.uint8)), \
            f"{t} differs from the summed form's at {sizes}"
    for name in ("loss", "lse_out"):
        check_close(name, got[name].double().cpu(), want[name], "f32")
        check_close(f"{name} (folded)", folded[name].double().cpu(), want[name], "f32")
