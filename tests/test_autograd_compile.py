"""epic.autograd inside torch.compile'd code (epic/autodiff/torch_ops.py), on the CPU through the
unfused torch form: one graph (fullgraph=True), and outputs and gradients equal to eager calls."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import epic

from .conftest import ROOT

S = ROOT / "samples"


def _leaves(seed: int, **shapes):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(*s, generator=g).bfloat16().requires_grad_() for k, s in shapes.items()}


def _run(step, leaves: dict):
    for v in leaves.values():
        v.grad = None
    loss = step(**leaves)
    loss.backward()
    return loss.detach(), {k: v.grad.clone() for k, v in leaves.items()}


def _same(eager, compiled):
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=0)
    for k in eager[1]:
        torch.testing.assert_close(compiled[1][k], eager[1][k], rtol=0, atol=0)


def test_cross_entropy_under_inductor_in_one_graph():
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager")
    label = torch.randint(0, 48, (30,), generator=torch.Generator().manual_seed(5), dtype=torch.int32)

    def step(x, w):
        return f(x=x, w=w.t(), label=label)["loss"].sum()
    leaves = _leaves(0, x=(30, 32), w=(48, 32))
    eager = _run(step, leaves)
    _same(eager, _run(torch.compile(step, fullgraph=True), leaves))
    assert torch._dynamo.explain(step)(**leaves).graph_break_count == 0


@pytest.mark.parametrize("chunk_rows", [None, 8])
def test_fused_loss_under_inductor_in_one_graph(chunk_rows):
    """policy "fused": one custom op whose formula scales the gradients the forward computed; the same
    total and gradients as eager calls, with no graph break."""
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager", policy="fused", chunk_rows=chunk_rows)
    label = torch.randint(0, 48, (30,), generator=torch.Generator().manual_seed(5), dtype=torch.int32)
    weights = torch.rand(30, generator=torch.Generator().manual_seed(6))

    def step(x, w):
        total, outs = f(x=x, w=w.t(), label=label, d_loss=weights)
        return 3 * total + 0 * outs["loss"].sum()
    leaves = _leaves(1, x=(30, 32), w=(48, 32))
    eager = _run(step, leaves)
    _same(eager, _run(torch.compile(step, fullgraph=True), leaves))
    assert torch._dynamo.explain(step)(**leaves).graph_break_count == 0


@pytest.mark.parametrize("chunk_rows", [None, 4])
def test_residual_rmsnorm_with_a_scalar_and_every_output(chunk_rows):
    f = epic.autograd(S / "residual_rmsnorm.epi", fallback="eager", chunk_rows=chunk_rows)

    def step(x, w, z, gamma):
        out = f(x=x, wo=w.t(), z=z, gamma=gamma, eps=1e-5)
        return out["resid"].float().sum() + (out["hg"].float() ** 2).sum() + out["r"].sum()
    leaves = _leaves(1, x=(21, 32), w=(32, 32), z=(21, 32), gamma=(32,))
    eager = _run(step, leaves)
    _same(eager, _run(torch.compile(step, fullgraph=True, backend="aot_eager"), leaves))


def test_quantized_outputs_and_block_scales_stay_constants_under_compile():
    f = epic.autograd("""
gemm a(x: bf16[M, D] @ w: bf16[D, N]) {
  s = fp8_e4m3_scale(acc, 128)
  out y: bf16 = acc
  out q: e4m3 = acc / s
  out q_scale: f32[M, N/128] = s
}""", fallback="eager")

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(x, w):
        out = f(x=x, w=w.t())
        return out["y"], out["q"], out["q_scale"]
    leaves = _leaves(2, x=(8, 16), w=(128, 16))
    y, q, scale = step(**leaves)
    assert y.requires_grad and not q.requires_grad and not scale.requires_grad
    assert scale.dtype == torch.float32



def test_one_graph_for_every_row_count_with_dynamic_shapes():
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager", chunk_rows=7)
    counter = CompileCounterWithBackend("aot_eager")

    def step(x, w, label):
        return f(x=x, w=w.t(), label=label)["loss"].sum()
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=counter)
    for m in (30, 45):
        leaves = _leaves(m, x=(m, 32), w=(48, 32))
        label = torch.randint(0, 48, (m,), generator=torch.Generator().manual_seed(m), dtype=torch.int32)
        _same(_run(lambda **a: step(**a, label=label), leaves), _run(lambda **a: compiled(**a, label=label), leaves))
    assert counter.frame_count == 1
