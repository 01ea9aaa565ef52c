"""How cuBLAS's time at N = K = 4096 (bf16) changes with the number of rows M, beside a plain read and
a copy of the same weights: is a decode gemm bound by its rows or by one pass over its weights?

  python3 bench/decode_m_scaling.py [--flush write|read]

One call per L2 flush (profiling.l2_flush: by default a write, which leaves dirty lines to write back;
`--flush read` leaves clean ones), timed with CUDA events (launch included), median of 50."""
import argparse
import statistics

import torch

from profiling import l2_flush


def timed_us(fn, flush, reps: int = 50) -> float:
    out = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1000)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flush", choices=("write", "read"), default="write")
    args = ap.parse_args()
    torch.manual_seed(0)
    flush = l2_flush(args.flush)
    print(f"flush: {args.flush}")
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    mbytes = w.numel() * w.element_size()
    for m in (1, 8, 16, 32, 64, 128, 256):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        us = timed_us(lambda: x @ w.t(), flush)
        print(f"M={m:4d} mm {us:6.2f} us  {mbytes / us / 1e6:5.2f} TB/s of weights")
    print(f"w.sum()   {timed_us(lambda: w.sum(), flush):6.2f} us (32 MB read)")
    w2 = torch.empty_like(w)
    print(f"copy_     {timed_us(lambda: w2.copy_(w), flush):6.2f} us (32 MB read + 32 MB write)")


if __name__ == "__main__":
    main()
