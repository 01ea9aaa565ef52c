"""Timing a call on the GPU the way the benchmark does: the L2 cache flushed before every run (a
tuned kernel must not win by finding its operands in L2), CUDA events around the call alone, the
median of `reps` runs after `warmup`."""
from __future__ import annotations

import statistics

import torch

L2_FLUSH_BYTES = 256 << 20      # larger than the H200's 50 MiB L2


def median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
