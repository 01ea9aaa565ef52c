"""epic.distributed.run_sharded on the CPU: two processes over gloo, each holding half of the LM
head's vocabulary, with the program's kernels run on the host (tests/hostsim/program.py). The labels'
mapping to each rank's columns, the gather of the ranks' partials in rank order and the combine over
them must give the one-device result bit for bit (and the reference's); tests/test_distributed.py does
the same on 2 GPUs.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from epic import reference
from epic.diagnostics import EpicError
from epic.distributed import run_sharded, shard_columns

from . import hostsim
from .conftest import ROOT
from .hostsim import harness
from .hostsim.program import HostProgram

PATH = str(ROOT / "samples" / "cross_entropy.epi")
CONFIG_M = 64                        # pingpong 64x64 tiles: each rank's 192 columns are 3 whole tiles
M, D, V, WORLD = 77, 200, 384, 2


def inputs(seed: int = 5) -> dict:
    """x, w [V, D] (an nn.Linear weight) and labels over the whole vocabulary; x and w quantized so the
    f32 accumulator is exact (as the host simulator's inputs are)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.round(torch.randn(M, D, generator=g) * 8) / 8).bfloat16()
    w = (torch.round(torch.randn(V, D, generator=g) / D ** 0.5 * 64) / 64).bfloat16()
    label = torch.randint(0, V, (M,), generator=g, dtype=torch.int32)
    label[:4] = torch.tensor([0, V // WORLD - 1, V // WORLD, V - 1])    # each rank's first and last column
    return dict(x=x, w=w, label=label)


def _one_device(cache: str, results: str) -> None:
    """The one-device run, building first what each rank builds, in the same order (the plan of its
    columns, then the whole vocabulary's), into the cache the ranks then read: no g++ in the ranks."""
    os.environ["EPIC_HOSTSIM_CACHE"] = cache
    torch.set_num_threads(1)
    prog, data = HostProgram(PATH, CONFIG_M), inputs()
    prog(keep=True, x=data["x"], w=data["w"][:V // WORLD].t(), label=data["label"])
    torch.save(prog(x=data["x"], w=data["w"].t(), label=data["label"]), os.path.join(results, "single.pt"))


def _rank(rank: int, store: str, cache: str, results: str) -> None:
    os.environ["EPIC_HOSTSIM_CACHE"] = cache
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        prog, data = HostProgram(PATH, CONFIG_M), inputs()
        shard = data["w"][rank * V // WORLD:(rank + 1) * V // WORLD]
        out = run_sharded(prog, x=data["x"], w=shard.t(), label=data["label"], column_inputs=("label",))
        torch.save(out, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_sharded_cross_entropy_is_the_one_device_result(tmp_path):
    hostsim.require_toolchain()
    ctx, cache = mp.get_context("spawn"), str(tmp_path / "cache")    # fresh processes: nothing built before
    for target, args in [(_one_device, [(cache, str(tmp_path))]),
                         (_rank, [(r, str(tmp_path / "store"), cache, str(tmp_path)) for r in range(WORLD)])]:
        procs = [ctx.Process(target=target, args=a) for a in args]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
        assert all(p.exitcode == 0 for p in procs), (target.__name__, [p.exitcode for p in procs])
    single = torch.load(tmp_path / "single.pt")
    data = inputs()
    want = reference.run(harness.compiled(PATH).analysis.source_program, dict(data, w=data["w"].t()), exact=False)
    for r in range(WORLD):
        out = torch.load(tmp_path / f"{r}.pt")
        assert set(out) == set(single) == {"loss", "lse_out"}
        for name, x in single.items():
            assert torch.equal(out[name], x), f"rank {r}: {name} differs from the one-device run"
            assert torch.allclose(x.double(), want[name].double(), rtol=1e-4, atol=1e-4), name


def test_labels_move_to_each_ranks_columns():
    program = harness.compiled(PATH).program
    label = torch.tensor([0, 191, 192, 383], dtype=torch.int32)
    assert shard_columns(program, dict(label=label), ("label",), 0, 192)["label"].tolist() == [0, 191, 192, 383]
    assert shard_columns(program, dict(label=label), ("label",), 1, 192)["label"].tolist() == [-192, -1, 0, 191]


@pytest.mark.parametrize("name", ["lable", "x_scale"])
def test_a_column_input_that_is_not_a_tensor_input_is_an_error(name):
    program = harness.compiled(PATH).program
    with pytest.raises(EpicError) as e:
        shard_columns(program, dict(label=torch.zeros(3, dtype=torch.int32), x_scale=1.0), (name,), 1, 192)
    assert e.value.codes == ["E601"] and name in str(e.value)
