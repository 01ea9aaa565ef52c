"""Derived backward kernels on the GPU (epic.autograd with the fused kernels) against torch.autograd
through the float64 reference, at ragged and tiny sizes."""
import pytest
import torch

import epic
from epic import reference
from epic.autodiff import check, derive as D

from .conftest import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (see docs/GPU.md)")]

S = ROOT / "samples"
CASES = ["bias_gelu", "cross_entropy", "residual_rmsnorm", "rope", "f16_accumulate", "swiglu_bwd", "swiglu_mlp",
         "prenorm_mlp", "swiglu"]
SIZES = {"ragged": dict(M=257, K=200, N=328, D=192, F=136, V=1000), "tiny": dict(M=3, K=64, N=64, D=64, F=32, V=64)}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", CASES)
def test_derived_backward_kernels_match_autograd(name, size):
    f = epic.autograd(S / f"{name}.epi")
    d = f.derivation
    sizes = {k: v for k, v in SIZES[size].items() if k in d.program.dims}
    inputs = reference.random_inputs(d.program, sizes, seed=7)
    outs64 = reference.run(d.program, inputs, exact=True, sizes=sizes)
    g = torch.Generator().manual_seed(8)
    upstream = {o: torch.randn(outs64[o].shape, generator=g, dtype=torch.float64) for o in d.upstream}
    want = check.autograd_grads(d.program, inputs, upstream, d.wrt, sizes)

    leaves = {k: (v.cuda().requires_grad_() if k in d.wrt else v.cuda()) for k, v in inputs.items()}
    args = {k: (v.t().contiguous().t() if d.program.tensors[k].layout == "kmajor" else v) for k, v in leaves.items()}
    outs = f(**args)
    total = sum((outs[o].double() * upstream[o].cuda()).sum() for o in d.upstream)
    total.backward()
    for k in d.wrt:
        got = leaves[k].grad.double().cpu()
        err = ((got - want[k]).abs().max() / want[k].abs().max()).item()
        assert err < 3e-2, (k, err)


@pytest.mark.parametrize("chunk_rows", [None, 100])
@pytest.mark.parametrize("size", list(SIZES))
def test_fused_loss_kernels_match_autograd(size, chunk_rows):
    """Policy "fused" (the LM head's gradients computed in its forward, dlogits finished by the row
    combine kernel) against torch.autograd of the source program in float64; the logits the combine
    reads back are rounded to bf16, hence the tolerance."""
    f = epic.autograd(S / "cross_entropy.epi", policy="fused", chunk_rows=chunk_rows)
    d = f.derivation
    sizes = {k: v for k, v in SIZES[size].items() if k in d.program.dims}
    inputs = reference.random_inputs(d.program, sizes, seed=9)
    g = torch.Generator().manual_seed(10)
    weights = {o: torch.rand(sizes["M"], generator=g, dtype=torch.float64) for o in d.upstream}
    want = check.autograd_grads(d.program, inputs, weights, d.wrt, sizes)
    want_total = sum((reference.run(d.program, inputs, exact=True, sizes=sizes)[o] * w).sum() for o, w in weights.items())
    leaves = {k: (v.cuda().requires_grad_() if k in d.wrt else v.cuda()) for k, v in inputs.items()}
    args = {k: (v.t().contiguous().t() if d.program.tensors[k].layout == "kmajor" else v) for k, v in leaves.items()}
    args.update({d.upstream[o]: w.float().cuda() for o, w in weights.items()})
    total, outs = f(**args)
    assert abs(total.item() - want_total.item()) <= 2e-2 * abs(want_total.item())
    (3 * total).backward()
    for k in d.wrt:
        got = leaves[k].grad.double().cpu()
        err = ((got - 3 * want[k]).abs().max() / (3 * want[k]).abs().max()).item()
        assert err < 3e-2, (k, err)


def units(names=None, sizes=None) -> list:
    """The kernels these tests run (of these cases and sizes: default all)."""
    from epic.codegen import emit
    out = []
    for name in names or CASES:
        d = epic.grad(S / f"{name}.epi")
        texts = [(d.forward_text, ()), (d.backward_text, ())]
        if name == "cross_entropy":       # the fused loss, also in chunks of 100 rows (and its later chunks' variant)
            texts.append((epic.grad(S / f"{name}.epi", policy="fused").forward_text, (100,)))
            later = D.derive_source(S / f"{name}.epi", path=True, policy="fused", accumulate=True)
            texts.append((later.forward_text, (100,)))
        for text, chunks in texts:
            prog = epic.compile(text)
            every = [SIZES[s] for s in (sizes or SIZES)]
            for size in every + [dict(every[0], M=m) for m in chunks]:
                sizes_ = {k: v for k, v in size.items() if k in prog.program.dims}
                configs = emit.kernel_configs(prog.program, sizes_["M"], None, sizes_)
                out += [u for _, u in emit.units(prog.program, configs)]
    return out


def prebuild() -> None:
    """Build every kernel these tests run, in parallel (`python -m tests.test_gpu_grad`), so that the
    device run does not wait for one nvcc after another."""
    from epic.runtime import build
    unique = {u.name + str(hash(u.source)): u for u in units()}
    for p in build.build_all(list(unique.values())):
        print(p)


if __name__ == "__main__":
    prebuild()
