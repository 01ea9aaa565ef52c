"""Where a call's host time goes (on a GPU machine): the whole call, the C launch alone, and a
profile of the Python around it, for one program. `python bench/host_profile.py [--n 2000]`"""
import argparse
import cProfile
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ROOT, WORK, host_us as per_call_us  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="resid_norm")
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    path, make = WORK[args.work]
    _, _, inputs = make(args.m)
    prog = epic.compile(os.path.join(ROOT, path))
    call = lambda: prog(**inputs)   # noqa: E731
    print(f"{args.work} M={args.m}: whole call {per_call_us(call, args.n):.1f} us")
    bound = next(iter(prog._bound.values()))
    out = prog(**inputs)
    buffers = dict(inputs, **out)
    for b in bound.allocations:
        buffers.setdefault(b.name, torch.empty(b.shape, dtype=getattr(torch, b.torch_dtype), device="cuda"))
    stream = torch.cuda.current_stream().cuda_stream
    for i, launch in enumerate(bound.launches):
        scalars = {t.name: float(t.default or 0.5) for t in prog.inputs if t.is_scalar}
        fixed = lambda: launch.run(buffers, scalars, stream, bound.device)   # noqa: E731
        print(f"  launch {i} ({launch.library.info['kernel']}) with fixed pointers: {per_call_us(fixed, args.n):.1f} us")
        lib = launch.library.lib
        c = lambda: lib.epic_launch(launch.c_ptrs, launch.c_dims, launch.c_scalars, stream, None, 0)   # noqa: E731
        print(f"    the C entry point alone (ctypes): {per_call_us(c, args.n):.1f} us")
    alloc = lambda: [torch.empty(b.shape, dtype=getattr(torch, b.torch_dtype), device="cuda") for b in bound.allocations]   # noqa: E731
    print(f"  allocating the {len(bound.allocations)} outputs/buffers: {per_call_us(alloc, args.n):.1f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.n):
        call()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
