"""Gemms on the vendor's library (`backend=cublas`, epic/plan/backend.py) on the GPU: every operand
order, with and without an added tensor, at ragged and tiny sizes, against float64, outputs poisoned;
the compiled launcher gives the ctypes path's bytes; and the fused cross-entropy loss at a vocabulary
where the heuristic puts its dX and dW gemms on cuBLAS, against torch's cross entropy, eagerly and
replayed from a CUDA graph. tests/test_vendor_gemm.py checks the same on the host."""
import itertools

import pytest
import torch

import epic

from .conftest import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

CE = ROOT / "samples" / "cross_entropy.epi"
SIZES = [(77 * 8, 392, 200), (8, 8, 8), (1000, 72, 4104)]      # M, N, K (16-byte rows where contiguous)


def _program(tmp_path, a_t, b_t, c):
    text = (f"in a: {'bf16[K, M]' if a_t else 'bf16[M, K]'}\nin b: {'bf16[N, K]' if b_t else 'bf16[K, N]'}\n"
            f"gemm g({'a.T' if a_t else 'a'} @ {'b.T' if b_t else 'b'}) with backend=cublas {{\n"
            + ("  in c: bf16[M, N]\n" if c else "") + f"  out d: bf16 = acc{' + c' if c else ''}\n}}\n")
    path = tmp_path / f"v{int(a_t)}{int(b_t)}{int(c)}.epi"
    path.write_text(text)
    return epic.compile(str(path))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("a_t,b_t,c", list(itertools.product([False, True], repeat=3)))
def test_the_vendor_gemm_matches_float64(tmp_path, a_t, b_t, c, size):
    m, n, k = size
    prog = _program(tmp_path, a_t, b_t, c)
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    cc = torch.randn(m, n, generator=g).bfloat16()
    want = a.double() @ b.double() + (cc.double() if c else 0)
    args = {"a": (a.t().contiguous() if a_t else a).cuda(), "b": (b.t().contiguous() if b_t else b).cuda()}
    if c:
        args["c"] = cc.cuda()
    assert prog.plan({"M": m, "N": n, "K": k}).configs["g"].backend == "cublas"
    poisoned = prog(poison=True, **args)["d"]              # the Python path, outputs NaN first
    fast = prog(**args)["d"]                               # the compiled launcher
    torch.cuda.synchronize()
    assert not poisoned.isnan().any()
    err = (poisoned.double().cpu() - want).abs().max() / want.abs().max()
    assert err < 1e-2, err
    assert torch.equal(fast.view(torch.int16), poisoned.view(torch.int16))


M, D, V = 200, 128, 66000           # V over the heuristic's vocabulary bound: dX and dW on cuBLAS


def _ce_data():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(M, D, generator=g).bfloat16().cuda()
    w = (torch.randn(V, D, generator=g) / D ** 0.5).bfloat16().cuda()
    label = torch.randint(0, V, (M,), generator=g, dtype=torch.int32).cuda()
    weights = torch.full((M,), 1.0).cuda()
    weights[::7] = 0.0                     # ignored rows
    return x, w, label, weights / weights.sum()


def _want(x, w, label, weights):
    x, w = x.double().requires_grad_(), w.double().requires_grad_()
    rows = torch.nn.functional.cross_entropy(x @ w.t(), label.long(), reduction="none")
    loss = (rows * weights.double()).sum()
    loss.backward()
    return loss.detach(), x.grad, w.grad


@pytest.mark.parametrize("chunk_rows", [None, 64])
def test_the_fused_loss_with_its_gradients_on_cublas(chunk_rows):
    head = epic.autograd(str(CE), policy="fused", chunk_rows=chunk_rows)
    configs = head.program.plan({"M": chunk_rows or M, "D": D, "V": V}).configs
    assert {k: c.backend for k, c in configs.items()} == {
        "lm_head_fused": "cutlass", "lm_head_da": "cublas", "lm_head_db": "cublas"}
    x0, w0, label, weights = _ce_data()

    def leaves():
        return x0.clone().requires_grad_(), w0.clone().requires_grad_()

    def step(x, w):
        total, _ = head(x=x, w=w.t(), label=label, d_loss=weights)
        total.backward()
        return total.detach()

    def eager():
        x, w = leaves()
        return step(x, w), x.grad, w.grad

    got = eager()
    loss, gx, gw = _want(x0, w0, label, weights)
    assert abs(got[0].item() - loss.item()) < 1e-2 * loss.item()
    for g, ref in zip(got[1:], (gx, gw)):
        err = (g.double() - ref.cuda()).abs().max() / ref.abs().max()
        assert err < 2e-2, err
    # the same step captured in a CUDA graph (warmed up on a side stream, as torch's docs say) and replayed
    x, w = leaves()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            x.grad = w.grad = None
            step(x, w)
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(x, w)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip((captured, x.grad, w.grad), got):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-3, atol=1e-3 * b.float().abs().max().item())


def units() -> list:
    """The kernels the fused loss runs here (whole and in chunks, the later chunks' variant too)."""
    from epic.autodiff.derive import derive_source
    from epic.codegen import emit
    fused = epic.grad(str(CE), policy="fused").forward_text
    later = derive_source(str(CE), path=True, policy="fused", accumulate=True).forward_text
    units = []
    for text, rows in ((fused, (M, 64)), (later, (64, M % 64))):
        prog = epic.compile(text)
        for m in rows:
            configs = emit.kernel_configs(prog.program, m, None, {"M": m, "D": D, "V": V})
            units += [u for _, u in emit.units(prog.program, configs)]
    return list({u.name + str(hash(u.source)): u for u in units}.values())


if __name__ == "__main__":         # `python -m tests.test_gpu_vendor_gemm` builds them in parallel first
    from epic.runtime import build
    for p in build.build_all(units()):
        print(p)
