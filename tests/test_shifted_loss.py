"""The LM head + cross entropy without a pass over dlogits (epic/autodiff/shifted_loss.py), run as its
programs' unfused torch form on the CPU: the loss rows and the gradients against torch's float64
cross entropy, with ignored rows, ragged chunks, a scaled incoming gradient, and the check that sends
a row whose logits overflow the shift to policy "fused". tests/test_gpu_autograd.py runs the kernels."""
import pytest
import torch

from epic.autodiff.shifted_loss import MAX_ROW_SUM, ShiftedCrossEntropy

D, V = 64, 200
TOL = 2e-2            # bf16 logits and dlogits: the error of policy "fused" too (checked beside it below)


def _data(m: int, seed: int = 0, spike: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, D, generator=g).bfloat16()
    w = (torch.randn(V, D, generator=g) * 0.3).bfloat16()
    label = torch.randint(0, V, (m,), generator=g, dtype=torch.int32)
    label[1::5] = -1                                     # ignored rows
    if spike:     # row 0: a logit `spike` above its label's (its row sum of exp(z - t) ~ e^spike)
        other = (int(label[0]) + 1) % V
        x[0] = w[other].float() / w[other].float().norm() ** 2 * spike
        w[int(label[0])] = 0
    return x, w, label


def _reference(x, w, label, weights):
    """float64 torch: sum(weights * loss rows) and its gradients."""
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    logits = x64 @ w64.t()
    keep = label >= 0
    rows = torch.zeros(len(label), dtype=torch.float64)
    rows[keep] = torch.nn.functional.cross_entropy(logits[keep], label[keep].long(), reduction="none")
    total = (rows * weights.double()).sum()
    total.backward()
    return total.detach(), rows.detach(), x64.grad, w64.grad


def _run(head, x, w, label, weights, factor: float = 1.0):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    total, outs = head(x=x, w=w.t(), label=label, d_loss=weights)
    (total * factor).backward()
    return total.detach(), outs["loss"], x.grad, w.grad


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("m,chunk_rows", [(37, None), (37, 16), (1, None), (64, 64), (65, 32)])
def test_loss_and_gradients_equal_torch_s_cross_entropy(m, chunk_rows):
    x, w, label = _data(m)
    weights = (label >= 0).float() / max(int((label >= 0).sum()), 1)
    head = ShiftedCrossEntropy(fallback="eager", chunk_rows=chunk_rows)
    total, rows, gx, gw = _run(head, x, w, label, weights)
    want_total, want_rows, want_gx, want_gw = _reference(x, w, label, weights)
    assert head.runs == {"shifted": 1, "fused": 0}
    torch.testing.assert_close(rows.double(), want_rows, rtol=TOL, atol=TOL)
    assert (rows[label < 0] == 0).all()
    assert abs(float(total) - float(want_total)) <= TOL * abs(float(want_total))
    assert _rel(gx, want_gx) < TOL and _rel(gw, want_gw) < TOL
    assert (gx[label < 0] == 0).all(), "an ignored row's input gets no gradient"


def test_as_close_as_policy_fused():
    """The same bf16 logits, so both paths' errors against float64 are of one size."""
    from epic.autodiff.loss import FusedLoss
    from epic.integrations.programs import LM_HEAD_LOSS
    x, w, label = _data(48, seed=3)
    weights = torch.rand(48, generator=torch.Generator().manual_seed(1))
    _, _, want_gx, want_gw = _reference(x, w, label, weights)
    _, _, sx, sw = _run(ShiftedCrossEntropy(fallback="eager", chunk_rows=20), x, w, label, weights)
    _, _, fx, fw = _run(FusedLoss(LM_HEAD_LOSS, fallback="eager", chunk_rows=20), x, w, label, weights)
    assert _rel(sx, want_gx) < 2 * _rel(fx, want_gx) + 1e-3
    assert _rel(sw, want_gw) < 2 * _rel(fw, want_gw) + 1e-3


def test_an_incoming_gradient_other_than_one_scales_every_gradient():
    x, w, label = _data(30, seed=5)
    weights = torch.full((30,), 0.1)
    head = ShiftedCrossEntropy(fallback="eager", chunk_rows=8)
    _, _, gx1, gw1 = _run(head, x, w, label, weights)
    _, _, gx3, gw3 = _run(head, x, w, label, weights, factor=3.0)
    torch.testing.assert_close(gx3.float(), 3 * gx1.float(), rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(gw3.float(), 3 * gw1.float(), rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("spike", [60.0, 100.0])
def test_a_row_whose_logits_overflow_the_shift_runs_policy_fused(spike):
    """A logit 60 (100) above the label's: exp(z - t) sums to ~e^60 > 2^64 (overflows f32 at 100). The
    check sends the call to policy "fused", whose results equal torch's."""
    x, w, label = _data(24, seed=2, spike=spike)
    weights = (label >= 0).float()
    head = ShiftedCrossEntropy(fallback="eager", chunk_rows=10)
    rows_sum = torch.exp(x.double() @ w.double().t() - (x.double() @ w.double().t()).gather(1, label.clamp(min=0).long()[:, None])).sum(1)
    assert rows_sum[0] > MAX_ROW_SUM, "the spike must overflow the check"
    total, rows, gx, gw = _run(head, x, w, label, weights)
    assert head.runs == {"shifted": 0, "fused": 1}
    want_total, want_rows, want_gx, want_gw = _reference(x, w, label, weights)
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all()
    torch.testing.assert_close(rows.double(), want_rows, rtol=TOL, atol=TOL)
    assert _rel(gx, want_gx) < TOL and _rel(gw, want_gw) < TOL


def test_rows_below_the_check_stay_on_the_shifted_path():
    """A logit 30 above the label's (row sum ~e^30 < 2^64): no fallback, and still torch's result."""
    x, w, label = _data(24, seed=2, spike=30.0)
    weights = (label >= 0).float()
    head = ShiftedCrossEntropy(fallback="eager")
    _, rows, gx, gw = _run(head, x, w, label, weights)
    assert head.runs == {"shifted": 1, "fused": 0}
    _, want_rows, want_gx, want_gw = _reference(x, w, label, weights)
    torch.testing.assert_close(rows.double(), want_rows, rtol=TOL, atol=TOL)
    assert _rel(gx, want_gx) < TOL and _rel(gw, want_gw) < TOL


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_a_bad_chunk_size_is_refused(bad):
    from epic.diagnostics import EpicError
    with pytest.raises(EpicError, match="chunk_rows"):
        ShiftedCrossEntropy(fallback="eager", chunk_rows=bad)
