"""Cross entropy's label logit on a GPU with labels anywhere: on both sides of tile edges, the last
column, and outside the columns (HF's ignore_index -100, V, past V, the i32 extremes), against the
float64 reference; with the combine reading the label's tile alone (split-reductions' pick, the
default) and with the combine folded into the gemm (combine=fold), which merges every tile's partial.
The host simulator checks the same labels on the host (tests/test_hostsim.py).
"""
import pytest
import torch

import epic
from epic import reference

from .gpu_cases import PROGRAMS, fold_config, make_inputs, path, to_device
from .test_gpu import check_close, seed_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

NAME = "samples/cross_entropy.epi"
# (M, V, D) as tests/gpu_cases.py's SIZES and MANY_ROWS_SIZES write them: their kernels are the suite's
SIZES = [(77, 392, 200), (8191, 392, 200), (300, 4104, 136)]


def special_labels(v: int) -> list[int]:
    return [-100, -1, 0, 1, 63, 64, 127, 128, 191, 192, 255, 256, v - 1, v, v + 7, 2**31 - 1, -2**31]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_label_logit_anywhere_matches_reference(size):
    prog = epic.compile(path(NAME))
    sizes = PROGRAMS[NAME](*size)
    inputs = make_inputs(prog.analysis.source_program, sizes, seed_of("label pick", size))
    special = special_labels(sizes["V"])
    inputs["label"][:len(special)] = torch.tensor(special, dtype=inputs["label"].dtype)
    inputs["label"][len(special)::5] = -100
    want = reference.run(prog.analysis.source_program, inputs, exact=False, sizes=sizes)
    dev = to_device(prog.program, inputs)
    got = prog(poison=True, **dev)
    folded = epic.compile(path(NAME), config=fold_config(prog.program))(poison=True, **dev)
    torch.cuda.synchronize()
    for name in ("loss", "lse_out"):
        check_close(name, got[name].double().cpu(), want[name], "f32")
        check_close(f"{name} (folded)", folded[name].double().cpu(), want[name], "f32")
