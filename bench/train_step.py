"""Forward + backward of a training step's fused blocks, timed in interleaved rounds beside the bare
cuBLAS gemms of the same pass, torch eager and (--compile) torch.compile; with peak extra memory.

  python bench/train_step.py [--work ce,mlp] [--rows 8192] [--rounds 20] [--compile] [--out F]

Workloads (Llama-3-8B shapes): `ce` = LM head + cross entropy without logits (samples/cross_entropy.epi:
D 4096, V 128256), `mlp` = the SwiGLU MLP block (samples/swiglu_mlp.epi: D 4096, F 14336). epic runs
them through epic.autograd (the derived forward and backward kernels, through its call path). "cublas"
is the pass's gemms alone (ce: logits, dX, dW; mlp: gate/up, down, and their four gradients), the
bar every ratio is taken against, in the same round. Peak extra memory: torch.cuda.max_memory_allocated
during one step, above what was allocated before it (inputs and weights).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPES = {"ce": dict(D=4096, V=128256), "mlp": dict(D=4096, F=14336)}


def _program(work: str) -> str:
    return os.path.join(ROOT, "samples", {"ce": "cross_entropy.epi", "mlp": "swiglu_mlp.epi"}[work])


def make(work: str, m: int, use_compile: bool):
    """(inputs, {label: step()}) where step runs forward + backward once."""
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = dict(device="cuda", dtype=torch.bfloat16)
    s = SHAPES[work]
    if work == "ce":
        d, v = s["D"], s["V"]
        x = torch.randn(m, d, generator=g, **dev).requires_grad_()
        w = (torch.randn(v, d, generator=g, **dev) / d ** 0.5).requires_grad_()
        label = torch.randint(0, v, (m,), generator=g, device="cuda", dtype=torch.int32)
        f = epic.autograd(_program("ce"))
        dl = torch.empty(m, v, **dev)
        dx, dw = torch.empty(m, d, **dev), torch.empty(v, d, **dev)

        def cublas():
            torch.matmul(x.detach(), w.detach().t(), out=dl)
            torch.matmul(dl, w.detach(), out=dx)
            torch.matmul(dl.t(), x.detach(), out=dw)

        def epic_step():
            out = f(x=x, w=w.t(), label=label)
            out["loss"].sum().backward()

        def eager():
            loss = torch.nn.functional.cross_entropy((x @ w.t()).float(), label.long(), reduction="sum")
            loss.backward()
        steps = {"cublas": cublas, "epic": epic_step, "torch eager": eager}
        if use_compile:
            compiled = torch.compile(lambda a, b: torch.nn.functional.cross_entropy((a @ b.t()).float(),
                                                                                   label.long(), reduction="sum"))
            steps["torch.compile"] = lambda: compiled(x, w).backward()
        return (x, w), steps
    d, f_ = s["D"], s["F"]
    x = torch.randn(m, d, generator=g, **dev).requires_grad_()
    wg = (torch.randn(f_, d, generator=g, **dev) / d ** 0.5).requires_grad_()
    wu = (torch.randn(f_, d, generator=g, **dev) / d ** 0.5).requires_grad_()
    wd = (torch.randn(d, f_, generator=g, **dev) / f_ ** 0.5).requires_grad_()
    wgu = torch.stack((wg.detach(), wu.detach()), 1).reshape(2 * f_, d).requires_grad_()   # interleaved rows
    prog = epic.autograd(_program("mlp"))
    dy = torch.randn(m, d, generator=g, **dev)
    h, a = torch.empty(m, 2 * f_, **dev), torch.empty(m, f_, **dev)
    y, da, dh = torch.empty(m, d, **dev), torch.empty(m, f_, **dev), torch.empty(m, 2 * f_, **dev)
    dx, dwgu, dwd = torch.empty(m, d, **dev), torch.empty(2 * f_, d, **dev), torch.empty(d, f_, **dev)

    def cublas():
        torch.matmul(x.detach(), wgu.detach().t(), out=h)
        torch.matmul(a, wd.detach().t(), out=y)
        torch.matmul(dy, wd.detach(), out=da)
        torch.matmul(dy.t(), a, out=dwd)
        torch.matmul(dh, wgu.detach(), out=dx)
        torch.matmul(dh.t(), x.detach(), out=dwgu)

    def epic_step():
        out = prog(x=x, wgu=wgu.t(), wd=wd.t())
        out["y"].backward(dy)

    def mlp(x_, wg_, wu_, wd_):
        return (torch.nn.functional.silu(x_ @ wg_.t()) * (x_ @ wu_.t())) @ wd_.t()

    def eager():
        mlp(x, wg, wu, wd).backward(dy)
    steps = {"cublas": cublas, "epic": epic_step, "torch eager": eager}
    if use_compile:
        compiled = torch.compile(mlp)
        steps["torch.compile"] = lambda: compiled(x, wg, wu, wd).backward(dy)
    return (x, wg, wu, wd, wgu), steps


def _zero_grads(tensors) -> None:
    for t in tensors:
        t.grad = None


def run(work: str, m: int, rounds: int, use_compile: bool) -> dict:
    leaves, steps = make(work, m, use_compile)
    for fn in steps.values():                     # warm-up: builds, autotuning, compilation
        for _ in range(2):
            fn()
            _zero_grads(leaves)
    torch.cuda.synchronize()
    peak = {}
    for label, fn in steps.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak[label] = torch.cuda.max_memory_allocated() - base
        _zero_grads(leaves)
    names = list(steps)
    times = {n: [] for n in names}
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            flush.zero_()
            _zero_grads(leaves)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            steps[n]()
            end.record()
            torch.cuda.synchronize()
            times[n].append(start.elapsed_time(end))
    ratios = {n: statistics.median(t / c for t, c in zip(times[n], times["cublas"])) for n in names}
    return {"work": work, "rows": m, "shapes": SHAPES[work], "rounds": rounds,
            "median_ms": {n: statistics.median(times[n]) for n in names}, "ratio_to_cublas": ratios,
            "peak_extra_bytes": peak}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="ce,mlp")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    results = [run(w, args.rows, args.rounds, args.compile) for w in args.work.split(",")]
    for r in results:
        print(f"{r['work']} M={r['rows']} {r['shapes']}")
        for n in r["median_ms"]:
            print(f"  {n:<14} {r['median_ms'][n]:8.2f} ms  x{r['ratio_to_cublas'][n]:.3f} of cuBLAS  "
                  f"peak extra {r['peak_extra_bytes'][n] / 2**30:.2f} GiB")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(), "results": results},
                      fh, indent=1)
    return 0


def prebuild(rows: int = 8192) -> None:
    """Build the kernels this benchmark runs, in parallel (`python -c 'import bench.train_step as t;
    t.prebuild()'`), before the timed run."""
    from epic.codegen import emit
    from epic.runtime import build
    units = []
    for work, shapes in SHAPES.items():
        d = epic.grad(_program(work))
        for text in (d.forward_text, d.backward_text):
            prog = epic.compile(text)
            sizes = dict(shapes, M=rows)
            sizes = {k: v for k, v in sizes.items() if k in prog.program.dims}
            configs = emit.kernel_configs(prog.program, rows, None, sizes)
            units += [u for _, u in emit.units(prog.program, configs)]
    unique = {u.name + str(hash(u.source)): u for u in units}
    for p in build.build_all(list(unique.values())):
        print(p)


if __name__ == "__main__":
    sys.exit(main())
