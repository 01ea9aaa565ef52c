"""Policy "fused": a loss head's gradient computed in its forward (epic/autodiff/fused.py, loss.py).

Expected values come from torch.autograd: through the reference interpreter's semantics of the source
program (float64), and through torch's own cross entropy for the autograd function."""
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from epic import pipeline, reference
from epic.autodiff import check, derive as D
from epic.autodiff.loss import FusedLoss
from epic.diagnostics import EpicError
from epic.integrations.programs import LM_HEAD_LOSS

from .conftest import ROOT
from .progen import program as random_program

CE = str(ROOT / "samples" / "cross_entropy.epi")
SIZES = [dict(M=37, D=24, V=56), dict(M=1, D=8, V=8), dict(M=130, D=72, V=200)]


def _fused(source=CE, **kw):
    return D.derive_source(source, path=source == CE, policy="fused", **kw)


@pytest.mark.parametrize("sizes", SIZES, ids=["ragged", "tiny", "larger"])
@pytest.mark.parametrize("source", [CE, LM_HEAD_LOSS], ids=["sample", "integration"])
def test_fused_gradients_match_autograd(source, sizes):
    d = _fused(source)
    for seed in (0, 1):
        errors = check.compare(d, sizes, seed)
        assert errors and max(errors.values()) < 1e-10, errors


def test_fused_outputs_are_the_forwards():
    d = _fused()
    sizes = SIZES[0]
    inputs = {k: (v.double() if v.is_floating_point() else v)
              for k, v in reference.random_inputs(d.program, sizes, 2).items()}
    weights = {o: torch.rand(sizes["M"], dtype=torch.float64) for o in d.upstream}
    outs, _ = check.derived_grads(d, inputs, weights, sizes)
    want = reference.run(d.program, inputs, exact=True, sizes=sizes)
    for name in ("loss", "lse_out"):
        torch.testing.assert_close(outs[name], want[name], rtol=1e-12, atol=1e-12)


def test_fused_program_is_three_gemms_with_dlogits_finished_by_the_row_combine():
    """No gemm recomputes the logits: the loss head's gemm stores its accumulator (rounded to bf16) for
    the row combine kernel, which writes dlogits; the dX and dW gemms read it."""
    d = _fused()
    assert d.fused and not d.backward_text and not d.saved and "lm_head_lse" not in d.forward_text
    assert "bf16(acc)" in d.forward_text
    a = pipeline.analyze(d.forward_text)
    kinds = [(k.kind, k.name) for k in a.program.kernels]
    assert [k for k, _ in kinds] == ["gemm", "combine", "gemm", "gemm"], kinds
    combine = a.program.kernels[1]
    assert "d_lm_head_acc" in [s.tensor for s in combine.stores]
    buffers = [t for t in a.program.tensors.values() if t.role == "buffer"]
    # the combine reads back only the rounded accumulator (the one-hot term is recomputed there)
    assert [(t.dtype.name, len(t.dims)) for t in buffers] == [("bf16", 2)], buffers


def test_fused_refuses_to_leave_the_weight_out_and_derives_the_weight_alone():
    with pytest.raises(EpicError) as e:
        _fused(wrt=["x"])
    assert e.value.diagnostics[0].code == "E903" and "'w'" in str(e.value)
    d = _fused(wrt=["w"])
    pipeline.analyze(d.forward_text, name="fused")
    assert max(check.compare(d, SIZES[0], 0).values()) < 1e-10


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(random_program(), st.integers(0, 2**16))
def test_random_programs_of_one_gemm_fuse_like_autograd(text, seed):
    """Every random program: a chain is refused (E903), a quantizing one E901/E902; the others derive a
    fused program that passes epic's checks and whose gradients are torch.autograd's."""
    try:
        d = D.derive_source(text, policy="fused")
    except EpicError as e:
        assume(e.diagnostics[0].code in ("E901", "E902", "E903"))
        return
    pipeline.analyze(d.forward_text, name="fused")
    errors = check.compare(d, {k: v for k, v in dict(M=19, D=64, E=24).items() if k in d.program.dims}, seed)
    assert max(errors.values()) < 1e-8, (errors, text)


def test_fused_refuses_a_chain():
    with pytest.raises(EpicError) as e:
        D.derive_source(str(ROOT / "samples" / "prenorm_mlp.epi"), path=True, policy="fused")
    assert e.value.diagnostics[0].code == "E903" and "one gemm" in str(e.value)


def _ce_reference(x, W, label, weights):
    """sum(weights * per-row cross entropy) in float64 through torch, and its gradients."""
    x64 = x.detach().double().requires_grad_()
    W64 = W.detach().double().requires_grad_()
    rows = torch.nn.functional.cross_entropy(x64 @ W64.t(), label.long(), reduction="none")
    total = (rows * weights.double()).sum()
    total.backward()
    return total.detach(), x64.grad, W64.grad


@pytest.mark.parametrize("factor", [1, 2])
@pytest.mark.parametrize("chunk_rows", [None, 10])
def test_fused_loss_autograd_matches_torch(chunk_rows, factor):
    """epic.autograd(..., policy="fused") on the unfused torch path: total, and the gradients scaled by
    the total's incoming gradient (1: passed on as they are; 2), against torch's cross entropy; ignored
    rows (weight 0)."""
    torch.manual_seed(0)
    M, D, V = 37, 24, 304
    x = torch.randn(M, D, dtype=torch.bfloat16, requires_grad=True)
    W = (torch.randn(V, D) * 0.3).to(torch.bfloat16).requires_grad_()
    label = torch.randint(0, V, (M,), dtype=torch.int32)
    weights = torch.full((M,), 1.0 / M)
    weights[::5] = 0.0
    head = FusedLoss(CE, fallback="eager", chunk_rows=chunk_rows)
    total, outs = head(x=x, w=W.t(), label=label, d_loss=weights)
    (factor * total).backward()
    want, gx, gW = _ce_reference(x, W, label, weights)
    assert abs(total.item() - want.item()) < 2e-2 * abs(want.item())
    assert not outs["loss"].requires_grad
    for got, ref in ((x.grad, factor * gx), (W.grad, factor * gW)):
        assert got.dtype == torch.bfloat16
        err = (got.double() - ref).abs().max() / ref.abs().max()
        assert err < 2e-2, err


def test_fused_loss_needs_weights_and_known_inputs():
    head = FusedLoss(CE, fallback="eager")
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    label = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(EpicError) as e:
        head(x=x, w=w, label=label)
    assert e.value.diagnostics[0].code == "E601" and "d_loss" in str(e.value)
    with pytest.raises(EpicError) as e:
        head(x=x, w=w, label=label, d_loss=torch.ones(4), bogus=x)
    assert e.value.diagnostics[0].code == "E601" and "bogus" in str(e.value)


def test_later_chunks_add_the_earlier_sum_in_the_weight_gradient_gemm():
    """accumulate=True: dW (a sum over rows) adds an input d_w_sum in its own gemm's epilogue; dX (per
    row) does not; and run on two halves of the rows, the two programs give the whole one's gradients."""
    d = D.derive_source(CE, path=True, policy="fused", accumulate=True)
    assert d.sums == {"d_w": "d_w_sum"} and "out d_w: bf16[V, D] = acc + d_w_sum" in d.forward_text
    first = _fused()
    sizes = dict(M=20, D=16, V=40)
    inputs = {k: (v.double() if v.is_floating_point() else v)
              for k, v in reference.random_inputs(first.program, sizes, 4).items()}
    weights = {"loss": torch.rand(20, dtype=torch.float64), "lse_out": torch.rand(20, dtype=torch.float64)}
    _, whole = check.derived_grads(first, inputs, weights, sizes)
    halves = [{k: (v[:12] if k in ("x", "label") else v) for k, v in inputs.items()},
              {k: (v[12:] if k in ("x", "label") else v) for k, v in inputs.items()}]
    wsplit = [{o: w[:12] for o, w in weights.items()}, {o: w[12:] for o, w in weights.items()}]
    _, a = check.derived_grads(first, halves[0], wsplit[0], dict(sizes, M=12))
    from epic.frontend.lower import load_program
    later = load_program(d.forward_text, "<later>", ".")
    feed = {**halves[1], "d_loss": wsplit[1]["loss"], "d_lse_out": wsplit[1]["lse_out"], "d_w_sum": a["w"].t()}
    b = reference.run(later, feed, exact=True, sizes=dict(sizes, M=8))
    torch.testing.assert_close(b["d_w"].t(), whole["w"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.cat([a["x"], b["d_x"]]), whole["x"], rtol=1e-12, atol=1e-12)


def test_the_fused_test_program_is_what_epic_grad_derives():
    """tests/programs/fused_cross_entropy.epi (run by the host simulator and the GPU tests) is the
    derivation's current output, comments aside."""
    def code(text):
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    kept = (ROOT / "tests" / "programs" / "fused_cross_entropy.epi").read_text()
    assert code(kept) == code(_fused().forward_text)
