"""The CUDA events of a few runs of a function, from CUPTI (torch.profiler): the L2 flushed by zeroing a
256 MiB buffer (larger than the H200's 50 MB L2) before each run, which bench/kernel_times.py and
bench/step_kernels.py read back as the kernel that opens a run."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile


def l2_flush(kind: str = "write"):
    """A function that flushes the L2 with a 256 MiB buffer (more than the H200's 50 MB). "write" zeroes
    it (as triton's do_bench does), leaving the L2 full of dirty lines that the next run's reads must
    write back to DRAM first; "read" sums it, leaving clean lines, as a model's decode step finds them."""
    if kind not in ("write", "read"):
        raise ValueError(f"flush kind {kind!r}: write or read")
    buf = torch.zeros(256 * 2**20, dtype=torch.int8, device="cuda")
    return buf.zero_ if kind == "write" else (lambda: buf.sum(dtype=torch.int32))


def cuda_events(fn, reps: int, warmup: int = 3) -> list:
    """The CUDA events (kernels, memsets, copies) of `reps` runs of fn after `warmup` unprofiled ones."""
    flush = l2_flush("write")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
