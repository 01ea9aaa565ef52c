"""The CUDA events of a few runs of a function, from CUPTI (torch.profiler): the L2 flushed by zeroing a
256 MiB buffer (larger than the H200's 50 MB L2) before each run, which bench/kernel_times.py and
bench/step_kernels.py read back as the kernel that opens a run."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def cuda_events(fn, reps: int, warmup: int = 3) -> list:
    """The CUDA events (kernels, memsets, copies) of `reps` runs of fn after `warmup` unprofiled ones."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
