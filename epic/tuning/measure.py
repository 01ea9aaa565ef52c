"""Timing a call on the GPU the way the benchmark does: the L2 cache flushed before every run (a
tuned kernel must not win by finding its operands in L2), CUDA events around the call alone, the
median of `reps` runs after `warmup` runs and SETTLE_S seconds of back-to-back runs. A candidate
whose first timed run is already slower than `give_up_ms` (a multiple of the best time so far: it cannot win) stops there, so that a
pathological configuration (spills, a degenerate tile grid: 16x cuBLAS was seen) costs one run,
not `reps`.

Candidates are compared by paired_ms: the GPU's clocks follow its power draw within a second, so
medians taken one after the other differ by up to 10% for the same kernel, while the ratio of two
runs milliseconds apart, taken over rounds, is stable to a fraction of a percent
(docs/PERFORMANCE.md, bench/interleaved.py). Pairing also shares the power budget out between the
two: a kernel that draws more power per call (more DRAM traffic: cross entropy's tile order read 2.5x
the operand bytes and was 4% slower back to back, level in rounds) is not slowed by it there.
sustained_ms times a candidate the way a training step runs its gemms instead, back to back for
seconds (`epic tune --timing sustained`; docs/PERFORMANCE.md, "Sustained load")."""
from __future__ import annotations

import statistics
import time

L2_FLUSH_BYTES = 256 << 20      # larger than the H200's 50 MiB L2
# Seconds of back-to-back runs before the timed ones. A GPU that was idle (a child process of
# tuning/trial.py starts after seconds without work) runs its first hundred milliseconds at boost
# clocks that its power limit lowers under sustained load, and not every kernel slows alike: a
# cooperative 128x256 bias + GELU kernel timed at 1.295 ms that way and at 1.45 ms in a tuning
# process already under load, where the heuristic's read 1.309 ms both ways; in the interleaved
# harness it is 11% slower than the heuristic's (bench/results/2026-12-02-h200-tune-gelu-isolated.log).
SETTLE_S = 1.0
# Seconds a candidate is replayed back to back under sustained_ms (after SETTLE_S of the same).
SUSTAIN_S = 2.0
# How `epic tune` times its candidates: paired_ms against the first, or sustained_ms
TIMINGS = ("paired", "sustained")


def settle(fns, seconds: float = SETTLE_S, sync=None, clock=time.perf_counter) -> int:
    """Run fns in turn, synchronized, until `seconds` have passed (at least once each; not at all for
    seconds <= 0): the GPU at the clocks it keeps under load. Returns the rounds run."""
    if seconds <= 0:
        return 0
    sync = sync or _cuda_sync
    start, n = clock(), 0
    while n == 0 or clock() - start < seconds:
        for fn in fns:
            fn()
        sync()
        n += 1
    return n


def median_ms(fn, reps: int = 20, warmup: int = 3, give_up_ms: float | None = None, timed=None,
              settle_s: float = SETTLE_S, sync=None) -> float:
    """timed(fn) -> ms of one run (default: CUDA events after an L2 flush); tests pass their own."""
    timed = timed or _cuda_timer()
    for _ in range(warmup):
        fn()
    settle([fn], settle_s, sync)
    times = []
    for _ in range(reps):
        times.append(timed(fn))
        if give_up_ms is not None and len(times) == 1 and times[0] > give_up_ms:
            break
    return statistics.median(times)


def paired_ms(fn, ref, reference_ms: float, reps: int = 20, warmup: int = 3, give_up_ms: float | None = None,
              timed=None, settle_s: float = SETTLE_S, sync=None) -> float:
    """fn's time as reference_ms x the median over `reps` rounds of fn's time over ref's time in the
    same round; rounds alternate which of the two runs first. A first round whose scaled time is over
    give_up_ms stops there."""
    timed = timed or _cuda_timer()
    for _ in range(warmup):
        fn()
        ref()
    settle([fn, ref], settle_s, sync)
    ratios = []
    for i in range(reps):
        if i % 2:
            mine, theirs = timed(fn), timed(ref)
        else:
            theirs, mine = timed(ref), timed(fn)
        ratios.append(mine / theirs)
        if give_up_ms is not None and i == 0 and reference_ms * ratios[0] > give_up_ms:
            break
    return reference_ms * statistics.median(ratios)


def sustained_ms(fn, seconds: float = SUSTAIN_S, give_up_ms: float | None = None, warmup: int = 3,
                 batch_ms=None, settle_s: float = SETTLE_S, sync=None, clock=time.perf_counter, batch: int = 10) -> float:
    """fn's time per call replayed back to back: `warmup` untimed runs (a process's first call binds and
    loads its kernels), one timed run (over give_up_ms: that time, no more), settle_s of back-to-back
    runs, then batches of `batch` calls between two CUDA events, no L2 flush anywhere, until `seconds`
    have passed; the batches' total time over their calls.
    batch_ms(fn, n) -> ms of n calls (default: CUDA events); tests pass their own."""
    batch_ms = batch_ms or _events_ms
    for _ in range(warmup):
        fn()
    first = batch_ms(fn, 1)
    if give_up_ms is not None and first > give_up_ms:
        return first
    settle([fn], settle_s, sync)
    total, calls, start = 0.0, 0, clock()
    while calls == 0 or clock() - start < seconds:
        total += batch_ms(fn, batch)
        calls += batch
    return total / calls


def _events_ms(fn, n: int = 1) -> float:
    """ms of n back-to-back calls of fn, between two CUDA events."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _cuda_sync() -> None:
    import torch
    torch.cuda.synchronize()


def _cuda_timer():
    import torch
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def timed(fn) -> float:
        flush.zero_()
        return _events_ms(fn)
    return timed
