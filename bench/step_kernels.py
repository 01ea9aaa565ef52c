#!/usr/bin/env python3
"""Where a training step's time goes: each GPU kernel of one forward + backward of bench/train_step.py's
candidates, from CUPTI (torch.profiler), summed by kernel name over a few steps (the L2 flushed before
each), so that a candidate's ratio to cuBLAS can be split into its kernels.

  python bench/step_kernels.py --work ce --candidates cublas,epic-fused,compile [--reps 5]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys


sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository: bench/ is a folder
from bench import train_step  # noqa: E402
from bench.profiling import cuda_events  # noqa: E402


def kernel_times(run, reps: int) -> dict[str, tuple[int, float]]:
    """kernel name -> (launches per step, microseconds per step)."""
    total: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in cuda_events(run, reps, warmup=2):
        if "fill" in e.name.lower() and "elementwise" in e.name:       # the flush
            continue
        total[e.name][0] += 1
        total[e.name][1] += e.device_time_total
    return {k: (n // reps, us / reps) for k, (n, us) in total.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="ce", choices=("ce", "mlp"))
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--candidates", default="cublas,epic-fused")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    work = {"ce": train_step.CE, "mlp": train_step.MLP}[args.work]
    shapes = train_step.SHAPES[args.work]
    operands = {"ce": train_step.ce_operands, "mlp": train_step.mlp_operands}[args.work](args.rows, shapes, "cuda")
    opts = argparse.Namespace(fallback="never", quack_tuned=False)
    for name in args.candidates.split(","):
        step = work[name](operands, opts)
        times = kernel_times(step.run, args.reps)
        print(f"{name}: {sum(us for _, us in times.values()) / 1000:.2f} ms of kernels per step")
        for kernel, (n, us) in sorted(times.items(), key=lambda kv: -kv[1][1]):
            print(f"  {us / 1000:8.3f} ms  x{n:<3} {kernel[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
