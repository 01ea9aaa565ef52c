"""epic.autograd: the derived forward and backward programs inside torch.autograd, on the CPU through
the unfused torch form (fallback="eager"; tests/test_gpu.py runs the fused kernels). The expected
gradients are torch.autograd's of the same math written in torch, in float64."""
import pytest
import torch

import epic
from epic.autodiff import chunks
from epic.diagnostics import EpicError

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


@pytest.mark.parametrize("policy", ["save", "recompute"])
def test_swiglu(policy):
    f = epic.autograd(S / "swiglu.epi", fallback="eager", policy=policy)
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


# ---------------------------------------------------------------- the backward chunked over rows
def _ce_grads(chunk_rows, m=30):
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager", chunk_rows=chunk_rows)
    g, x, w = _weights(m, 32, 48, 6)
    label = torch.randint(0, 48, (m,), generator=g, dtype=torch.int32)
    out = f(x=x, w=w.t(), label=label)
    (out["loss"] * torch.linspace(0.5, 1.5, m)).sum().backward()
    return x.grad, w.grad


def test_cross_entropy_backward_in_chunks_of_7_rows_equals_one_pass():
    x_grad, w_grad = _ce_grads(None)
    x7, w7 = _ce_grads(7)
    torch.testing.assert_close(x7, x_grad, rtol=0, atol=0)         # per-row: the same rows computed
    # summed over 5 chunks: each chunk's dW partial is rounded to bf16 before the sum
    torch.testing.assert_close(w7.float(), w_grad.float(), rtol=2e-2, atol=1e-2 * w_grad.float().abs().max().item())


def test_chunks_run_the_backward_on_row_slices():
    f = epic.autograd(S / "cross_entropy.epi", fallback="eager", chunk_rows=7)
    rows = []

    class Spy:                      # the backward program, counting the rows of each call
        analysis = f.backward.analysis

        def __call__(self, real=f.backward, **feed):
            rows.append(feed["x"].shape[0])
            return real(**feed)
    f.backward = Spy()
    _, x, w = _weights(30, 32, 48, 7)
    f(x=x, w=w.t(), label=torch.zeros(30, dtype=torch.int32))["loss"].sum().backward()
    assert rows == [7, 7, 7, 7, 2]
    assert f.chunks.per_row == {"d_x"} and f.chunks.summed == {"d_w"}


def test_peak_extra_bytes_of_a_chunked_backward():
    sizes = {"M": 8192, "D": 4096, "V": 128000}
    whole = epic.autograd(S / "cross_entropy.epi", fallback="eager").peak_extra_bytes(sizes)
    chunked = epic.autograd(S / "cross_entropy.epi", fallback="eager", chunk_rows=1024).peak_extra_bytes(sizes)
    assert whole == 8192 * 128000 * 2                                    # dlogits [M, V] bf16
    # dlogits and d_x for 1024 rows, and one chunk's dW partial [V, D] bf16 while it is added up
    assert chunked == 1024 * 128000 * 2 + 1024 * 4096 * 2 + 128000 * 4096 * 2


@pytest.mark.parametrize("chunk_rows", [0, -3, 2.5, True])
def test_chunk_rows_must_be_a_positive_integer(chunk_rows):
    with pytest.raises(EpicError) as e:
        epic.autograd(S / "cross_entropy.epi", fallback="eager", chunk_rows=chunk_rows)
    assert e.value.diagnostics[0].code == "E903"


def test_a_backward_that_reads_the_row_index_is_not_chunked():
    text = "gemm a(x: bf16[M, D] @ w: bf16[D, N]) {\n  out y: bf16 = acc * f32(row)\n}\n"
    epic.autograd(text, fallback="eager")
    with pytest.raises(EpicError) as e:
        epic.autograd(text, fallback="eager", chunk_rows=8)
    assert e.value.diagnostics[0].code == "E903" and "row index" in e.value.diagnostics[0].message


FORWARD = "gemm a(x: bf16[M, D] @ w: bf16[D, N]) {\n  out y: bf16 = acc\n}\n"


@pytest.mark.parametrize("body, why", [
    ("out s: f32[N] = col_max(d_y * acc)", "col_max over the rows"),
    ("out s: f32 = all_sum(d_y * acc)", "whole-tensor"),
    ("tmp s: f32[N] = col_sum(d_y * acc)\n}\ngemm b(x @ w) {\n  out t: bf16[M, N] = acc * s", "not linear"),
    ("out s: f32[N] = exp(col_sum(d_y * acc))", "not linear"),
    ("out s: f32[N] = col_sum(d_y * acc) + 1.0", "not linear"),
    ("out s: f32[N] = f32(M) * col_sum(d_y * acc)", "as a number"),
])
def test_backwards_whose_result_chunking_would_change_are_refused(body, why):
    # backward programs written by hand: what the derivation could emit, checked by chunks.RowChunks
    back = epic.compile(f"in d_y: bf16[M, N]\ngemm g(x: bf16[M, D] @ w: bf16[D, N]) {{\n  {body}\n}}\n")
    forward = epic.compile(FORWARD).analysis.source_program
    with pytest.raises(EpicError) as e:
        chunks.RowChunks(forward, back.analysis.source_program, 8)
    assert e.value.diagnostics[0].code == "E903" and why in e.value.diagnostics[0].message


def test_linear_sums_are_chunked():
    back = epic.compile("in d_y: bf16[M, N]\nin b: f32[N]\ngemm g(x: bf16[M, D] @ w: bf16[D, N]) {\n"
                        "  out s: f32[N] = (-col_sum(d_y * acc) + col_sum(acc)) * b\n}\n")
    c = chunks.RowChunks(epic.compile(FORWARD).analysis.source_program, back.analysis.source_program, 8)
    assert c.summed == {"s"} and c.sliced == {"d_y", "x"}


@pytest.mark.parametrize("policy", ["save", "recompute"])
def test_mlp_block_both_policies(policy):
    f = epic.autograd(S / "swiglu_mlp.epi", fallback="eager", policy=policy)
    g, x, wgu = _weights(19, 32, 48, 5)
    wd = (torch.randn(32, 24, generator=g) / 24 ** 0.5).bfloat16().requires_grad_()
    _weighted(f(x=x, wgu=wgu.t(), wd=wd.t())["y"]).backward()

    def ref(d):
        h = d["x"] @ d["wgu"].t()
        return _weighted((torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]) @ d["wd"].t())
    _compare({}, dict(x=x, wgu=wgu, wd=wd), ref)
