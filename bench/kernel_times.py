"""Where a workload's time goes: each kernel's duration and the gaps between them, from CUPTI
(torch.profiler), for cuBLAS and for epic's configurations, one call after an L2 flush, repeated.

  python bench/kernel_times.py --work qk_norm,resid_norm --rows 64 --configs ping_64x64x64_c1x1 [--reps 50]

Prints per candidate the median duration of each kernel of a call (in launch order), the median gap
before it (from the previous kernel's end; negative: it started early, as a PDL dependent does), the
median time it runs past the previous kernel's end ("after": what it adds to the call; for a PDL
dependent its duration less the wait), and the median span from the first kernel's start to the last
one's end."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from interleaved import candidates  # noqa: E402
from profiling import cuda_events  # noqa: E402


def kernels_per_call(fn, reps: int) -> list[list[tuple[str, float, float]]]:
    events = cuda_events(fn, reps)
    calls, cur = [], None
    evs = sorted((e for e in events if e.name != "Memset (Device)" and "Memcpy" not in e.name),
                 key=lambda e: e.time_range.start)
    for e in evs:
        if "elementwise" in e.name or "fill" in e.name.lower():   # the flush opens a call
            cur = []
            calls.append(cur)
        elif cur is not None:
            cur.append((e.name[:60], e.time_range.start, e.time_range.end))
    return [c for c in calls if c]


def summary(calls):
    n = min(len(c) for c in calls)
    rows = []
    for i in range(n):
        dur = statistics.median(c[i][2] - c[i][1] for c in calls)
        gap = statistics.median(c[i][1] - c[i - 1][2] for c in calls) if i else 0.0
        after = statistics.median(c[i][2] - max(c[i][1], c[i - 1][2]) for c in calls) if i else dur
        rows.append({"kernel": calls[0][i][0], "us": round(dur, 2), "gap_us": round(gap, 2),
                     "after_us": round(after, 2)})
    span = statistics.median(c[n - 1][2] - c[0][1] for c in calls)
    return rows, round(span, 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="resid_norm")
    ap.add_argument("--rows", default="64")
    ap.add_argument("--configs", default="")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    out = []
    for name in args.work.split(","):
        for m in (int(r) for r in args.rows.split(",")):
            for label, fn in candidates(name, m, configs, calls=True):
                if label == "cublas-again":
                    continue
                try:
                    rows, span = summary(kernels_per_call(fn, args.reps))
                except Exception as e:   # a configuration the program refuses at its sizes: say why
                    print(f"{name} M={m} {label}: {str(e).splitlines()[0][:160]}", flush=True)
                    continue
                print(f"{name} M={m} {label}: span {span} us", flush=True)
                for r in rows:
                    print(f"    {r['us']:8.2f} us  gap {r['gap_us']:6.2f}  after {r['after_us']:8.2f}  {r['kernel']}",
                          flush=True)
                out.append({"work": name, "M": m, "label": label, "span_us": span, "kernels": rows})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["bench/kernel_times.py"] + sys.argv[1:]), "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
