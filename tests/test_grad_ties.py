"""The gradient of a max (min, amax) whose extreme is tied: torch's amax shares it evenly between the
tied elements, and so does the derived backward (a row's count of them is a sum the backward takes).
With bf16 or otherwise rounded inputs a row's max is often tied; each tie getting all of it would
multiply that gradient by the count. Inputs here sit on a grid of 0.5 and each row or block has its
extreme at least three times."""
import pytest
import torch

from epic import reference
from epic.autodiff import check, derive as D

F64 = torch.float64
PROGRAMS = {
    "row_max": "out y: f32 = acc * row_max(z) + z",
    "row_min": "out y: f32 = acc * row_min(z)",
    "col_max": "out s: f32[N] = col_max(z)\n  out y: f32 = acc + z",
    "row_amax": "out y: f32 = acc / row_amax(z)",
    "block_max": "out y: f32 = acc * block_max(z, 8)",
    "block_amax": "out y: f32 = acc * block_amax(z, 8) + z",
}


def _tied(z: torch.Tensor, extreme, dim: int, block: int | None) -> torch.Tensor:
    """z on a grid of 0.5, its extreme (along dim, or per 1 x block) copied to three places."""
    z = torch.round(z * 2) / 2
    view = z.reshape(z.shape[0], -1, block) if block else z
    d = -1 if block or dim == 1 else 0
    e = extreme(view, d)
    for i in (1, 3, 5):
        idx = [slice(None)] * view.dim()
        idx[d] = i
        view[tuple(idx)] = e
    return view.reshape(z.shape)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_tied_extreme_shares_its_gradient_like_torch(tmp_path, name):
    f = tmp_path / "t.epi"
    f.write_text("gemm g(x: bf16[M, K] @ w: bf16[K, N]) {\n  in z: f32[M, N]\n  " + PROGRAMS[name] + "\n}\n")
    d = D.derive_source(str(f), path=True)
    sizes = dict(M=6, K=8, N=16)
    inputs = {k: v.to(F64) for k, v in reference.random_inputs(d.program, sizes, 0).items()}
    block = 8 if name.startswith("block") else None
    take_abs = "amax" in name
    extreme = (lambda v, d: v.abs().amax(d)) if take_abs else (lambda v, d: v.amin(d)) if "min" in name \
        else (lambda v, d: v.amax(d))
    inputs["z"] = _tied(inputs["z"], extreme, 0 if name.startswith("col") else 1, block)
    gen = torch.Generator().manual_seed(1)
    outs = reference.run(d.program, inputs, exact=True, sizes=sizes)
    upstream = {t.name: torch.randn(outs[t.name].shape, dtype=F64, generator=gen) for t in d.program.outputs()}
    want = check.autograd_grads(d.program, inputs, upstream, d.wrt, sizes)
    _, got = check.derived_grads(d, inputs, upstream, sizes)
    assert (want["z"] != 0).any()
    for k in d.wrt:
        err = ((got[k] - want[k]).abs().max() / want[k].abs().max()).item()
        assert err < 1e-12, (k, err)
