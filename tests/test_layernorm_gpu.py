"""LayerNorm deferred into the next gemm, on a GPU: the derived tensors (gamma @ wu, beta @ wu) are the
runtime's, cached per weight tensor and recomputed when a weight changes in place; a captured CUDA
graph recomputes them on every replay. (Kernels against the reference: tests/test_gpu.py.)"""
import pytest
import torch

import epic

from .gpu_cases import PROGRAMS, make_inputs, path, to_device

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

NAME = "tests/programs/layernorm_chain.epi"


def _setup(seed):
    prog = epic.compile(path(NAME))
    sizes = PROGRAMS[NAME](77, 392, 200)
    return prog, to_device(prog.program, make_inputs(prog.analysis.source_program, sizes, seed))


def _close(got, want):
    scale = want.double().pow(2).mean().sqrt().item()
    assert ((got.double() - want.double()).abs() <= 2 ** -7 * want.double().abs() + 1e-2 * scale).all()


def _reference(prog, inputs):
    return prog.reference(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})


def test_an_in_place_weight_update_reaches_the_next_call():
    prog, inputs = _setup(1)
    before = prog(**inputs)["y"].clone()
    assert len(prog._derived) == 2
    inputs["beta"].add_(1.0)                  # beta @ wu must be recomputed
    inputs["wu"].mul_(-1.0)                   # and gamma @ wu
    after = prog(**inputs)["y"]
    torch.cuda.synchronize()
    assert not torch.equal(before, after)
    _close(after.cpu(), _reference(prog, inputs)["y"])


def test_a_captured_graph_recomputes_derived_tensors_on_replay():
    prog, inputs = _setup(2)
    g = prog.capture(**inputs)
    _close(g()["y"].cpu(), _reference(prog, inputs)["y"])
    inputs["gamma"].mul_(0.5)                  # updated in place between replays
    inputs["beta"].sub_(0.25)
    got = g()["y"]
    torch.cuda.synchronize()
    _close(got.cpu(), _reference(prog, inputs)["y"])
