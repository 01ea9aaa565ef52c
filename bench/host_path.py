"""Host time per call of epic programs on a GPU: the compiled call path (runtime/fastcall.py) against
the ctypes path, in the same process, on the benchmark's workloads (bench/bench.py).

  python bench/host_path.py [--rows 64,8192] [--work resid_norm,...] [--out results.json]

Host time per call: n calls issued back to back without synchronizing, divided by n, the best of
`repeat` such batches; n is small enough (100 calls of at most 4 launches) that the GPU's launch
queue never fills, so no call waits for the GPU. Also per program: its launch count, the host time
of the launcher's own run() with prepared arguments (the part in C++), and torch's host time for
the bare x @ w timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]     # bench.py before the bench/ directory
import epic  # noqa: E402
import time  # noqa: E402

from bench import WORK, ROOT  # noqa: E402
from epic.runtime import fastcall  # noqa: E402


def host_us(fn, n: int, repeat: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    torch.cuda.synchronize()
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64")
    ap.add_argument("--work", default="plain,resid_norm,bias_gelu,rope,prenorm_half,swiglu,xent,fp8_quant,prenorm_mlp")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fastcall.library()      # built before any call: calls take the ctypes path while it builds
    results = []
    for name in args.work.split(","):
        path, make = WORK[name]
        for m in map(int, args.rows.split(",")):
            gemm, _, inputs = make(m)
            prog = epic.compile(os.path.join(ROOT, path))
            ref = prog(poison=True, **inputs)            # the Python path, buffers poisoned
            out = prog(**inputs)                         # the compiled path (bound by the call above)
            torch.cuda.synchronize()
            same = all(torch.equal(out[k].view(torch.uint8), ref[k].view(torch.uint8)) for k in ref)
            fast = prog._fast
            rec = {"work": name, "M": m, "launches": len(next(iter(prog._bound.values())).launches),
                   "compiled_path": fast is not None and len(fast) > 0, "same_bytes": same,
                   "why_not": fastcall.why_not(),
                   "torch_matmul_us": host_us(gemm, args.n),
                   "compiled_us": host_us(lambda: prog(**inputs), args.n)}
            names = [t.name for t in prog.inputs if not t.is_scalar]
            tensors = [inputs[n] for n in names]
            scalars = [float(t.default) for t in prog.inputs if t.is_scalar]
            stream = torch.cuda.current_stream().cuda_stream
            rec["launcher_run_us"] = host_us(lambda: fast.run(tensors, scalars, stream, False), args.n)
            rec["launcher_call_us"] = host_us(lambda: fast.call(inputs, False), args.n)
            prog._fast = None                            # the ctypes path of the same bound plan
            rec["ctypes_us"] = host_us(lambda: prog(**inputs), args.n)
            prog._fast = fast
            results.append(rec)
            print(json.dumps(rec), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
