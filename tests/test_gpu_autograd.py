"""epic.autograd's forward and backward with the fused kernels under CUDA graphs and torch.compile, on
the GPU: a whole training step (forward, loss.backward()) recorded with torch.cuda.graph and replayed
on new input values, torch.cuda.make_graphed_callables, and torch.compile (fullgraph, and
mode="reduce-overhead", which records CUDA graphs itself), each against eager calls of the same
kernels; with and without chunk_rows. `python -m tests.test_gpu_autograd` builds their kernels first."""
import pytest
import torch

import epic

from .conftest import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

CE = ROOT / "samples" / "cross_entropy.epi"
M, D, V = 257, 192, 1000           # ragged: 257 rows are chunks of 64, 64, 64, 64 and 1
CHUNKS = [None, 64]


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, D, generator=g).bfloat16()
    w = (torch.randn(V, D, generator=g) / D ** 0.5).bfloat16()
    return x.cuda(), w.cuda()


def _label():
    return torch.randint(0, V, (M,), generator=torch.Generator().manual_seed(9), dtype=torch.int32).cuda()


def _eager(f, x, w, label):
    """loss and gradients of a plain (uncaptured, uncompiled) call on copies of x and w."""
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = f(x=x, w=w.t(), label=label)["loss"].sum()
    loss.backward()
    return loss.detach(), x.grad, w.grad


def _close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-3, atol=1e-3 * b.float().abs().max().item())


@pytest.mark.parametrize("chunk_rows", CHUNKS)
def test_a_training_step_replays_as_one_cuda_graph(chunk_rows):
    f = epic.autograd(CE, chunk_rows=chunk_rows)
    label = _label()
    x0, w0 = _data(0)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()

    def step():
        loss = f(x=x, w=w.t(), label=label)["loss"].sum()
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):        # warm-up: builds, loads and binds every kernel (each chunk's rows)
        for _ in range(2):
            x.grad = w.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None               # the captured backward allocates the gradients in the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step()
    for seed in (1, 2):
        nx, nw = _data(seed)
        with torch.no_grad():
            x.copy_(nx)
            w.copy_(nw)
        graph.replay()
        torch.cuda.synchronize()
        _close((loss, x.grad, w.grad), _eager(f, nx, nw, label))


@pytest.mark.parametrize("chunk_rows", CHUNKS)
def test_make_graphed_callables(chunk_rows):
    f = epic.autograd(CE, chunk_rows=chunk_rows)
    label = _label()

    def loss_rows(x, w):
        return f(x=x, w=w.t(), label=label)["loss"]

    x0, w0 = _data(0)
    graphed = torch.cuda.make_graphed_callables(loss_rows, (x0.clone().requires_grad_(), w0.clone().requires_grad_()))
    nx, nw = _data(3)
    x, w = nx.clone().requires_grad_(), nw.clone().requires_grad_()
    loss = graphed(x, w).sum()
    loss.backward()
    _close((loss.detach(), x.grad, w.grad), _eager(f, nx, nw, label))


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_torch_compile_with_the_fused_kernels(mode):
    f = epic.autograd(CE, chunk_rows=64)
    label = _label()

    def step(x, w):
        return f(x=x, w=w.t(), label=label)["loss"].sum()
    compiled = torch.compile(step, fullgraph=True, mode=mode)
    for seed in (4, 5, 6):               # reduce-overhead records its graph after warm-up calls
        nx, nw = _data(seed)
        x, w = nx.clone().requires_grad_(), nw.clone().requires_grad_()
        loss = compiled(x, w)
        loss.backward()
        _close((loss.detach(), x.grad, w.grad), _eager(f, nx, nw, label))


@pytest.mark.parametrize("chunk_rows", CHUNKS)
def test_the_fused_loss_in_a_cuda_graph_and_under_torch_compile(chunk_rows):
    """policy "fused": a step captured as one CUDA graph and replayed on new values, and the step under
    torch.compile (fullgraph), against eager calls of the same kernels."""
    f = epic.autograd(CE, chunk_rows=chunk_rows, policy="fused")
    label = _label()
    weights = torch.full((M,), 1.0 / M, device="cuda")

    def loss_of(x, w):
        return f(x=x, w=w.t(), label=label, d_loss=weights)[0]

    def eager(nx, nw):
        x, w = nx.clone().requires_grad_(), nw.clone().requires_grad_()
        loss = loss_of(x, w)
        loss.backward()
        return loss.detach(), x.grad, w.grad

    x0, w0 = _data(0)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            x.grad = w.grad = None
            loss_of(x, w).backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = loss_of(x, w)
        loss.backward()
    nx, nw = _data(1)
    with torch.no_grad():
        x.copy_(nx)
        w.copy_(nw)
    graph.replay()
    torch.cuda.synchronize()
    _close((loss, x.grad, w.grad), eager(nx, nw))
    compiled = torch.compile(loss_of, fullgraph=True)
    nx, nw = _data(2)
    x, w = nx.clone().requires_grad_(), nw.clone().requires_grad_()
    loss = compiled(x, w)
    loss.backward()
    _close((loss.detach(), x.grad, w.grad), eager(nx, nw))


def units() -> list:
    """Every kernel these tests run (forward at M rows, backward at M and at each chunk's rows; the
    fused loss and its later chunks' variant)."""
    from epic.autodiff.derive import derive_source
    from epic.codegen import emit
    d = epic.grad(CE)
    fused = epic.grad(CE, policy="fused").forward_text
    later = derive_source(CE, path=True, policy="fused", accumulate=True).forward_text
    units = []
    for text, rows in ((d.forward_text, (M,)), (d.backward_text, (M, 64, 1)), (fused, (M, 64)), (later, (64, 1))):
        prog = epic.compile(text)
        for m in rows:
            sizes = {"M": m, "D": D, "V": V}
            units += [u for _, u in emit.units(prog.program, emit.kernel_configs(prog.program, m, None, sizes))]
    return list({u.name + str(hash(u.source)): u for u in units}.values())


def prebuild() -> None:
    """Build them in parallel: `python -m tests.test_gpu_autograd` on any machine with nvcc."""
    from epic.runtime import build
    for p in build.build_all(units()):
        print(p)


if __name__ == "__main__":
    prebuild()
