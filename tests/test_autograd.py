"""epic.autograd: the derived forward and backward programs inside torch.autograd, on the CPU through
the unfused torch form (fallback="eager"; tests/test_gpu.py runs the fused kernels). The expected
gradients are torch.autograd's of the same math written in torch, in float64."""
import pytest
import torch

import epic

from .conftest import ROOT

S = ROOT / "samples"


def _weights(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(n, k, generator=g) / k ** 0.5).bfloat16().requires_grad_()
    return g, x, w


def _compare(got: dict, leaves: dict, ref_loss, tol=2e-2):
    ref = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    ref_loss(ref).backward()
    for k, v in leaves.items():
        err = (v.grad.double() - ref[k].grad).abs().max() / ref[k].grad.abs().max()
        assert err < tol, (k, err.item())


def _weighted(y: torch.Tensor) -> torch.Tensor:
    return (y.double() * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)).sum()


@pytest.mark.parametrize("m", [1, 37])
def test_bias_gelu(m):
    f = epic.autograd(S / "bias_gelu.epi", fallback="eager")
    g, x, w = _weights(m, 24, 40, 0)
    b = torch.randn(40, generator=g).bfloat16().requires_grad_()
    _weighted(f(x=x, w=w.t(), bias=b)["y"]).backward()

    def ref(d):
        h = d["x"] @ d["w"].t() + d["b"]
        return _weighted(h * torch.sigmoid(1.5957691216057308 * (h + 0.044715 * h ** 3)))
    _compare({}, dict(x=x, w=w, b=b), ref)


def test_cross_entropy_with_ignored_gradient_of_lse():
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager")
    g, x, w = _weights(29, 32, 48, 1)
    label = torch.randint(0, 48, (29,), generator=g, dtype=torch.int32)
    out = f(x=x, w=w.t(), label=label)
    out["loss"].sum().backward()          # lse_out takes no part: its gradient is zero

    def ref(d):
        logits = d["x"] @ d["w"].t()
        return torch.nn.functional.cross_entropy(logits, label.long(), reduction="sum")
    _compare({}, dict(x=x, w=w), ref)


def test_swiglu():
    f = epic.autograd(S / "swiglu.epi", fallback="eager")
    g, x, w = _weights(33, 24, 32, 2)
    _weighted(f(x=x, wgu=w.t())["y"]).backward()

    def ref(d):
        h = d["x"] @ d["w"].t()
        return _weighted(torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2])
    _compare({}, dict(x=x, w=w), ref)


def test_residual_rmsnorm_every_output():
    f = epic.autograd(S / "residual_rmsnorm.epi", fallback="eager")
    g, x, w = _weights(21, 32, 32, 3)
    z = torch.randn(21, 32, generator=g).bfloat16().requires_grad_()
    gamma = (1 + 0.1 * torch.randn(32, generator=g)).bfloat16().requires_grad_()
    out = f(x=x, wo=w.t(), z=z, gamma=gamma)
    (_weighted(out["resid"]) + _weighted(out["hg"]) + _weighted(out["r"])).backward()

    def ref(d):
        h = d["x"] @ d["w"].t() + d["z"]
        r = torch.rsqrt((h * h).mean(1) + 1e-6)
        return _weighted(h) + _weighted(h * d["gamma"]) + _weighted(r)
    _compare({}, dict(x=x, w=w, z=z, gamma=gamma), ref)


def test_quantized_outputs_are_constants():
    f = epic.autograd("""
gemm a(x: bf16[M, D] @ w: bf16[D, N]) {
  out y: bf16 = acc
  out q: i8 = acc
}
""", fallback="eager")
    _, x, w = _weights(8, 16, 16, 4)
    out = f(x=x, w=w.t())
    assert out["y"].requires_grad and not out["q"].requires_grad
