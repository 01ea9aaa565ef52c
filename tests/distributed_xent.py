"""Run with `torchrun --nproc-per-node 2 tests/distributed_xent.py` (tests/test_distributed.py does):
a vocabulary-parallel LM head + cross entropy over 2 GPUs (each holds V/2 columns of the weight),
merged across ranks by the program's own combine kernel, must equal the single-GPU run bit for bit."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402
from epic.distributed import run_sharded  # noqa: E402


def main() -> int:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    prog = epic.compile(os.path.join(root, "samples", "cross_entropy.epi"))
    ok = True
    for m, d, v in ((64, 256, 128256), (512, 512, 128256), (77, 256, 2 * 1024)):
        g = torch.Generator(device="cuda").manual_seed(1234 + m)      # the same inputs on every rank
        x = torch.randn(m, d, device="cuda", generator=g).bfloat16()
        w = (torch.randn(v, d, device="cuda", generator=g) / d ** 0.5).bfloat16()
        label = torch.randint(0, v, (m,), device="cuda", generator=g, dtype=torch.int32)
        shard = w[rank * v // world:(rank + 1) * v // world]
        out = run_sharded(prog, x=x, w=shard.t(), label=label, column_inputs=("label",))
        single = prog(x=x, w=w.t(), label=label)
        torch.cuda.synchronize()
        same = all(torch.equal(out[k], single[k]) for k in single)
        diff = max((out[k].double() - single[k].double()).abs().max().item() for k in single)
        print(f"rank {rank}: M={m} V={v}: {'bit-identical' if same else f'DIFFERENT (max {diff:.3g})'}", flush=True)
        ok &= same
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
