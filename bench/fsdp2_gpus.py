"""The epic-patched small Llama trained with FSDP2 (torch.distributed.fsdp.fully_shard, parameters sharded)
on two GPUs, against the same model, seed and data on one GPU: prints both loss curves and their largest
difference, writes a JSON.

  python bench/fsdp2_gpus.py [--world 2] [--steps 10] [--layers 4] [--hidden 1024] ... [--out F.json]
  python bench/fsdp2_gpus.py --backend gloo --device cpu ...   # the same on CPU processes, epic's unfused form

Each process trains on its slice of every batch's rows (batch must divide by --world); every row has
the same number of counted tokens (a prompt of the same length is ignored in each), so the mean of the
processes' losses is the whole batch's loss and FSDP2's averaged gradients are the whole batch's: the
curves agree within bf16 noise. fully_shard wraps each decoder layer, then the model (as
tests/test_integrations.py does with gloo). --patch none trains HF's own model the same way (a control).
epic's kernels (both row counts) build before the processes start.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import train_llama  # noqa: E402  (its config, batches and kernel build)

# NVLink multicast stays off (it can take a shared host's GPUs out of service)
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="processes (one GPU each)")
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--patch", default="epic", choices=("epic", "none"))
    train_llama.add_model_args(ap, steps=10, warmup=2)
    ap.add_argument("--out", default="fsdp2_gpus.json")
    args = ap.parse_args(argv)
    if args.batch % args.world:
        ap.error(f"--batch {args.batch} must be a multiple of --world {args.world}")
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    if args.device == "cuda" and args.backend != "nccl" or args.device == "cpu" and args.backend != "gloo":
        ap.error("use --backend nccl with --device cuda, --backend gloo with --device cpu")
    return args


def _model(args, device):
    from transformers import LlamaForCausalLM
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(train_llama.config(args)).to(torch.bfloat16).to(device)    # the same weights everywhere
    if args.patch == "epic":
        import epic.integrations
        epic.integrations.apply_epic_to_llama(model, fallback="never" if args.device == "cuda" else "eager")
    return model


def _train(model, args, rank: int = 0, world: int = 1):
    """(losses, step seconds) on rows rank*b/world .. (rank+1)*b/world of every batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    rows = args.batch // world
    losses, times = [], []
    for ids, labels in train_llama.batches(args):
        ids, labels = ids[rank * rows:(rank + 1) * rows], labels[rank * rows:(rank + 1) * rows]
        if args.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach().float())
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return torch.stack(losses), times


def _worker(rank: int, world: int, port: int, args, result: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group(args.backend, rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group(args.backend, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh(args.device, (world,))
        model = _model(args, args.device)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        sharded = isinstance(model.lm_head.weight, torch.distributed.tensor.DTensor)
        losses, times = _train(model, args, rank, world)
        dist.all_reduce(losses)
        if rank == 0:
            torch.save({"loss": (losses / world).tolist(), "times": times, "sharded": sharded}, result)
        dist.barrier()           # neither process tears the group down while the other still talks to it
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    import torch.multiprocessing as mp
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("EPIC_LAUNCHER", "ctypes")     # the unfused form launches nothing
    elif torch.cuda.device_count() < args.world:
        print(f"error: --world {args.world} needs as many GPUs; this machine has {torch.cuda.device_count()}",
              file=sys.stderr)
        return 2
    report = {"config": vars(args).copy(), "command": " ".join(sys.argv), "torch": torch.__version__}
    if args.device == "cuda":
        report["gpus"] = [torch.cuda.get_device_name(i) for i in range(args.world)]
        if args.patch == "epic":
            cfg = train_llama.config(args)
            rows = args.batch * args.seq
            report["epic_build_s"] = sum(train_llama.build_epic_kernels(cfg, m) for m in {rows, rows // args.world})
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rank0.pt")
        mp.spawn(_worker, args=(args.world, _free_port(), args, result), nprocs=args.world, join=True)
        sharded = torch.load(result)
    if not sharded["sharded"]:
        print("error: fully_shard left the parameters unsharded", file=sys.stderr)
        return 1
    single, single_times = _train(_model(args, args.device), args)
    single = single.tolist()
    diff = [abs(a - b) for a, b in zip(sharded["loss"], single)]
    report.update(sharded_loss=sharded["loss"], single_loss=single, loss_abs_diff=diff, max_loss_abs_diff=max(diff),
                  sharded_step_ms=1e3 * statistics.median(sharded["times"][args.warmup:]),
                  single_step_ms=1e3 * statistics.median(single_times[args.warmup:]))
    print(f"{'step':>4} {'fsdp2 x' + str(args.world):>12} {'one device':>12} {'|diff|':>9}")
    for i, (a, b, d) in enumerate(zip(sharded["loss"], single, diff)):
        print(f"{i:>4} {a:>12.5f} {b:>12.5f} {d:>9.2e}")
    print(f"max |diff| {max(diff):.2e}; step {report['sharded_step_ms']:.1f} ms sharded, "
          f"{report['single_step_ms']:.1f} ms on one device")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
