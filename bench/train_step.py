"""Forward + backward of a training step's fused blocks beside the peers, timed in interleaved rounds
against the bare cuBLAS gemms of the same pass; with peak extra memory and a check against torch eager.

  python bench/train_step.py [--work ce,mlp] [--rows 8192] [--rounds 20] [--quack-tuned] [--out F]
                             [--candidates cublas,epic,eager,compile,quack,liger] [--sizes D=4096,V=128256]

Workloads (Llama-3-8B shapes): `ce` = LM head + cross entropy without logits (samples/cross_entropy.epi:
D 4096, V 128256; loss summed over rows), `mlp` = the SwiGLU MLP block (samples/swiglu_mlp.epi: D 4096,
F 14336; backward from a random dy). Candidates, all on the same operand tensors:

  cublas   the pass's gemms alone (ce: logits, dX, dW; mlp: gate/up, down and their four gradients):
           every ratio is the median over rounds of a candidate's time / cuBLAS's in the same round
  epic     epic.autograd: the derived forward and backward kernels, through its call path (ce also:
           epic-fused, epic-fused-2048, epic-fused-whole: policy fused in 4096- or 2048-row chunks, whole;
           epic-fused-cutlass: 4096-row chunks with dX and dW on epic's kernels, where the heuristic
           gives them cuBLAS: plan/backend.py)
  eager    the block as plain torch operations (also the reference of the check below)
  compile  torch.compile of the eager form, forward and backward
  quack    QuACK: chunked_linear_cross_entropy / mlp_func(activation="swiglu") on the interleaved gate/up
  liger    Liger: LigerFusedLinearCrossEntropyLoss / LigerSwiGLUMLP's forward (F.linear + liger_swiglu)

A candidate whose package is missing is left out with a note (bench/peers_install.sh installs QuACK
and Liger on the H200), and so is one that fails; the others still run. Check: each candidate's loss
(ce) or output (mlp) and every gradient against eager's, as ||a - b|| / ||b||. Peak extra memory:
torch.cuda.max_memory_allocated during one step above what was allocated before it (inputs, weights).
A new candidate is a builder in CE or MLP below: a function of the operands that returns a Step.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SHAPES = {"ce": dict(D=4096, V=128256), "mlp": dict(D=4096, F=14336)}


class Skip(Exception):
    """The candidate cannot run here (its package is missing): left out, with this as its note."""


@dataclass
class Step:
    run: Callable[[], torch.Tensor | None]    # forward + backward once; returns the forward's loss / output
    grads: Callable[[], dict] | None = None   # the gradients it left, under the eager form's names
    note: str = ""


@dataclass
class Result:
    work: str
    rows: int
    shapes: dict
    rounds: int
    median_ms: dict = field(default_factory=dict)
    ratio_to_cublas: dict = field(default_factory=dict)
    ratio_quartiles: dict = field(default_factory=dict)    # (25th, 75th percentile) of the per-round ratios
    round_ms: dict = field(default_factory=dict)           # every round's time, in the rounds' order
    peak_extra_bytes: dict = field(default_factory=dict)
    device_allocs: dict = field(default_factory=dict)       # cudaMalloc calls inside the timed steps, all rounds
    check: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)


def _program(work: str) -> str:
    return os.path.join(ROOT, "samples", {"ce": "cross_entropy.epi", "mlp": "swiglu_mlp.epi"}[work])


def _module(name: str):
    """The module; a missing package is a Skip."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise Skip(f"{name.split('.')[0]} not installed ({e})") from None


# ---- LM head + cross entropy: leaves x [M, D], w [V, D] (nn.Linear's layout) --------------------------

def ce_operands(m: int, shapes: dict, device: str, seed: int = 0) -> SimpleNamespace:
    g = torch.Generator(device=device).manual_seed(seed)
    dev = dict(device=device, dtype=torch.bfloat16)
    d, v = shapes["D"], shapes["V"]
    o = SimpleNamespace(m=m, d=d, v=v, device=device)
    o.x = torch.randn(m, d, generator=g, **dev).requires_grad_()
    o.w = (torch.randn(v, d, generator=g, **dev) / d ** 0.5).requires_grad_()
    o.label = torch.randint(0, v, (m,), generator=g, device=device, dtype=torch.int32)
    o.label64 = o.label.long()
    o.leaves = (o.x, o.w)
    o.grads = lambda: {"x": o.x.grad, "w": o.w.grad}
    return o


def _ce_eager_loss(x, w, label64):
    return F.cross_entropy((x @ w.t()).float(), label64, reduction="sum")


def _backward_of(loss_fn):
    def run():
        loss = loss_fn()
        loss.backward()
        return loss
    return run


FUSED_CHUNK = 4096       # rows per chunk of epic's fused loss
# the fused loss's dX and dW gemms on epic's own kernels (the heuristic gives them cuBLAS at V = 128256)
CUTLASS_GRADS = {g: {"backend": "cutlass"} for g in ("lm_head_da", "lm_head_db")}


def ce_cublas(o, opts):
    x, w = o.x.detach(), o.w.detach()
    dl = torch.empty(o.m, o.v, device=o.device, dtype=torch.bfloat16)
    dx, dw = torch.empty_like(x), torch.empty_like(w)

    def run():
        torch.matmul(x, w.t(), out=dl)
        torch.matmul(dl, w, out=dx)
        torch.matmul(dl.t(), x, out=dw)
    return Step(run)


def ce_epic(o, opts):
    f = epic.autograd(_program("ce"), fallback=opts.fallback)
    return Step(_backward_of(lambda: f(x=o.x, w=o.w.t(), label=o.label)["loss"].sum()), o.grads)


def _ce_epic_fused(chunk_rows, config=None):
    """policy "fused": the gradients computed in the forward (3 gemms); weights 1: the sum of the rows."""
    def build(o, opts):
        f = epic.autograd(_program("ce"), policy="fused", fallback=opts.fallback, chunk_rows=chunk_rows, config=config)
        ones = torch.ones(o.m, device=o.device, dtype=torch.float32)
        return Step(_backward_of(lambda: f(x=o.x, w=o.w.t(), label=o.label, d_loss=ones)[0]), o.grads,
                    f"policy fused, chunk_rows={chunk_rows}" + (f", config {config}" if config else ""))
    return build


def ce_eager(o, opts):
    return Step(_backward_of(lambda: _ce_eager_loss(o.x, o.w, o.label64)), o.grads)


def ce_compile(o, opts):
    cf = torch.compile(_ce_eager_loss)
    return Step(_backward_of(lambda: cf(o.x, o.w, o.label64)), o.grads)


def ce_quack(o, opts):
    lce = _module("quack.linear_cross_entropy")
    chunk = 2048     # 4096 = D makes QuACK 0.6.5's dX gemm square, which its epilogue refuses (m == n ambiguous)
    path = "scaled-exp" if lce.scaled_exp_lce_supported(o.x, o.w, chunk, "sum") else "chunked"
    return Step(_backward_of(lambda: lce.chunked_linear_cross_entropy(o.x, o.w, o.label64, chunk_size=chunk,
                                                                       reduction="sum", tuned=opts.quack_tuned)),
                o.grads, f"chunked_linear_cross_entropy chunk_size={chunk} tuned={opts.quack_tuned} ({path} path)")


def ce_liger(o, opts):
    mod = _module("liger_kernel.transformers")
    flce = mod.LigerFusedLinearCrossEntropyLoss(reduction="sum")
    return Step(_backward_of(lambda: flce(o.w, o.x, o.label64)), o.grads, "LigerFusedLinearCrossEntropyLoss")


CE = {"cublas": ce_cublas, "epic": ce_epic, "epic-fused": _ce_epic_fused(FUSED_CHUNK),
      "epic-fused-whole": _ce_epic_fused(None), "epic-fused-2048": _ce_epic_fused(2048),
      "epic-fused-cutlass": _ce_epic_fused(FUSED_CHUNK, CUTLASS_GRADS),
      "eager": ce_eager,
      "compile": ce_compile, "quack": ce_quack,
      "liger": ce_liger}


# ---- SwiGLU MLP block: leaves x, wg, wu [F, D], wd [D, F] and wgu (gate/up rows interleaved) ------------

def mlp_operands(m: int, shapes: dict, device: str, seed: int = 0) -> SimpleNamespace:
    g = torch.Generator(device=device).manual_seed(seed)
    dev = dict(device=device, dtype=torch.bfloat16)
    d, f = shapes["D"], shapes["F"]
    o = SimpleNamespace(m=m, d=d, f=f, device=device)
    o.x = torch.randn(m, d, generator=g, **dev).requires_grad_()
    o.wg = (torch.randn(f, d, generator=g, **dev) / d ** 0.5).requires_grad_()
    o.wu = (torch.randn(f, d, generator=g, **dev) / d ** 0.5).requires_grad_()
    o.wd = (torch.randn(d, f, generator=g, **dev) / f ** 0.5).requires_grad_()
    # rows (2k, 2k+1) = (gate_k, up_k): epic's wgu (epic.weights.interleave_gate_up) and QuACK's fc1
    o.wgu = torch.stack((o.wg.detach(), o.wu.detach()), 1).reshape(2 * f, d).requires_grad_()
    o.dy = torch.randn(m, d, generator=g, **dev)
    o.leaves = (o.x, o.wg, o.wu, o.wd, o.wgu)
    o.grads = lambda: {"x": o.x.grad, "wg": o.wg.grad, "wu": o.wu.grad, "wd": o.wd.grad}

    def interleaved():
        gu = o.wgu.grad.view(f, 2, d)
        return {"x": o.x.grad, "wg": gu[:, 0], "wu": gu[:, 1], "wd": o.wd.grad}
    o.grads_interleaved = interleaved
    return o


def _mlp_eager(x, wg, wu, wd):
    return (F.silu(x @ wg.t()) * (x @ wu.t())) @ wd.t()


def _backward_from(o, out_fn):
    def run():
        y = out_fn()
        y.backward(o.dy)
        return y
    return run


def mlp_cublas(o, opts):
    x, wgu, wd, dy = o.x.detach(), o.wgu.detach(), o.wd.detach(), o.dy
    bf = dict(device=o.device, dtype=torch.bfloat16)
    h, a = torch.empty(o.m, 2 * o.f, **bf), torch.empty(o.m, o.f, **bf)
    y, da, dh = torch.empty(o.m, o.d, **bf), torch.empty(o.m, o.f, **bf), torch.empty(o.m, 2 * o.f, **bf)
    dx, dwgu, dwd = torch.empty_like(x), torch.empty_like(wgu), torch.empty_like(wd)

    def run():
        torch.matmul(x, wgu.t(), out=h)
        torch.matmul(a, wd.t(), out=y)
        torch.matmul(dy, wd, out=da)
        torch.matmul(dy.t(), a, out=dwd)
        torch.matmul(dh, wgu, out=dx)
        torch.matmul(dh.t(), x, out=dwgu)
    return Step(run)


def mlp_epic(o, opts):
    f = epic.autograd(_program("mlp"), fallback=opts.fallback)
    return Step(_backward_from(o, lambda: f(x=o.x, wgu=o.wgu.t(), wd=o.wd.t())["y"]), o.grads_interleaved)


def mlp_eager(o, opts):
    return Step(_backward_from(o, lambda: _mlp_eager(o.x, o.wg, o.wu, o.wd)), o.grads)


def mlp_compile(o, opts):
    cf = torch.compile(_mlp_eager)
    return Step(_backward_from(o, lambda: cf(o.x, o.wg, o.wu, o.wd)), o.grads)


def mlp_quack(o, opts):
    mod = _module("quack.mlp")
    return Step(_backward_from(o, lambda: mod.mlp_func(o.x, o.wgu, o.wd, activation="swiglu",
                                                       tuned=opts.quack_tuned)),
                o.grads_interleaved, f"mlp_func(activation='swiglu') tuned={opts.quack_tuned}")


def mlp_liger(o, opts):
    fn = _module("liger_kernel.transformers.functional")
    return Step(_backward_from(o, lambda: F.linear(fn.liger_swiglu(F.linear(o.x, o.wg), F.linear(o.x, o.wu)), o.wd)),
                o.grads, "LigerSwiGLUMLP.forward on these weights")


MLP = {"cublas": mlp_cublas, "epic": mlp_epic, "eager": mlp_eager, "compile": mlp_compile, "quack": mlp_quack,
       "liger": mlp_liger}

WORKS = {"ce": (ce_operands, CE), "mlp": (mlp_operands, MLP)}
CANDIDATES = tuple(dict.fromkeys([*CE, *MLP]))      # a candidate of one work only is noted in the other


# ---- the harness -------------------------------------------------------------------------------------

def _zero_grads(tensors) -> None:
    for t in tensors:
        t.grad = None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def relerr(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _snapshot(step: Step, leaves, device: str):
    _zero_grads(leaves)
    out = step.run()
    _sync(device)
    return out.detach().clone(), {k: v.detach().clone() for k, v in step.grads().items()}


def _time_once(fn, device: str, flush) -> float:
    """ms for one run, started on an idle device (the host's time to issue it counts)."""
    if device != "cuda":
        gc.collect()
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    flush.zero_()
    gc.collect()          # a collection due now would land in this step's host time: taken before it starts
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def run(work: str, m: int, rounds: int, names=CANDIDATES, device: str = "cuda", shapes: dict | None = None,
        quack_tuned: bool = False) -> Result:
    shapes = shapes or SHAPES[work]
    make_operands, builders = WORKS[work]
    o = make_operands(m, shapes, device)
    opts = SimpleNamespace(fallback="never" if device == "cuda" else "eager", quack_tuned=quack_tuned)
    res = Result(work, m, shapes, rounds)
    reference = _snapshot(builders["eager"](o, opts), o.leaves, device)   # what every check compares with
    steps = {}
    for name in ["cublas"] + [n for n in names if n != "cublas"]:        # cuBLAS: the bar of every ratio
        if name not in builders:
            res.notes[name] = f"skipped: not a candidate of {work}"
            continue
        try:
            step = builders[name](o, opts)
            for _ in range(2):                  # warm-up: builds, autotuning, compilation
                _zero_grads(o.leaves)
                step.run()
            _sync(device)
        except Skip as e:
            res.notes[name] = f"skipped: {e}"
            continue
        except Exception as e:  # noqa: BLE001  (recorded: the other candidates still run)
            res.notes[name] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            _sync(device)
            continue
        steps[name] = step
        if step.note:
            res.notes[name] = step.note
        if step.grads is not None:
            out, grads = _snapshot(step, o.leaves, device)
            res.check[name] = {"out": relerr(out, reference[0]),
                               **{k: relerr(grads[k], reference[1][k]) for k in reference[1]}}
    _zero_grads(o.leaves)
    for name, step in steps.items():
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step.run()
            torch.cuda.synchronize()
            res.peak_extra_bytes[name] = torch.cuda.max_memory_allocated() - base
        else:
            res.peak_extra_bytes[name] = None
        _zero_grads(o.leaves)
    order = list(steps)
    times = {n: [] for n in order}
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if device == "cuda" else None   # > L2
    allocs = {n: 0 for n in order}
    for r in range(rounds):
        for n in order[r % len(order):] + order[:r % len(order)]:
            _zero_grads(o.leaves)
            before = _device_allocs(device)
            times[n].append(_time_once(steps[n].run, device, flush))
            allocs[n] += _device_allocs(device) - before
    if device == "cuda":
        res.device_allocs = allocs
    _zero_grads(o.leaves)
    res.median_ms = {n: statistics.median(t) for n, t in times.items()}
    ratios = {n: [t / c for t, c in zip(times[n], times["cublas"])] for n in order}
    res.ratio_to_cublas = {n: statistics.median(r) for n, r in ratios.items()}
    res.ratio_quartiles = {n: _quartiles(r) for n, r in ratios.items()}
    res.round_ms = times
    return res


def _device_allocs(device: str) -> int:
    """cudaMalloc calls so far (the caching allocator's count): one inside a timed step is a
    synchronizing allocation that the step's time includes; 0 where torch does not count them."""
    return torch.cuda.memory_stats().get("num_device_alloc", 0) if device == "cuda" else 0


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles: how far one run's rounds spread around the median."""
    if len(values) < 2:
        return (values[0], values[0])
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[0], q[2])


def report(r: Result) -> str:
    lines = [f"{r.work} M={r.rows} {r.shapes}"]
    for n in r.median_ms:
        peak = r.peak_extra_bytes.get(n)
        check = "  check " + " ".join(f"{k} {v:.1e}" for k, v in r.check[n].items()) if n in r.check else ""
        lo, hi = r.ratio_quartiles.get(n, (r.ratio_to_cublas[n],) * 2)
        lines.append(f"  {n:<9} {r.median_ms[n]:8.2f} ms  x{r.ratio_to_cublas[n]:.3f} of cuBLAS "
                     f"(rounds' middle half {lo:.3f}-{hi:.3f})  peak extra "
                     + (f"{peak / 2**30:.2f} GiB" if peak is not None else "-") + check)
    lines += [f"  note {n}: {k} cudaMalloc calls inside its timed steps ({r.rounds} rounds)"
              for n, k in r.device_allocs.items() if k]
    lines += [f"  note {n}: {t}" for n, t in r.notes.items()]
    return "\n".join(lines)


def _sizes(text: str) -> dict:
    try:
        return {k.strip(): int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=INT,..., got {text!r}") from None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="ce,mlp")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help="cublas always runs (the bar of the ratios); eager is also the check's reference")
    ap.add_argument("--compile", action="store_true", help="kept for old commands: compile is a candidate")
    ap.add_argument("--quack-tuned", action="store_true", help="QuACK with tuned=True (its autotuner)")
    ap.add_argument("--sizes", type=_sizes, default=None, help="other shapes than Llama-3-8B's, e.g. D=1024,V=32000")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a smoke run (epic's unfused form)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    args.candidates = [c for c in args.candidates.split(",") if c] + (["compile"] if args.compile else [])
    bad = sorted(set(args.candidates) - set(CANDIDATES))
    if bad:
        ap.error(f"unknown candidate(s) {bad}; choose from {', '.join(CANDIDATES)}")
    bad = [w for w in args.work.split(",") if w not in WORKS]
    if bad:
        ap.error(f"unknown work {bad}; choose from {', '.join(WORKS)}")
    args.candidates = list(dict.fromkeys(args.candidates))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = []
    for w in args.work.split(","):
        shapes = {k: v for k, v in (args.sizes or {}).items() if k in SHAPES[w]}
        results.append(run(w, args.rows, args.rounds, args.candidates, args.device, {**SHAPES[w], **shapes},
                           args.quack_tuned))
        print(report(results[-1]), flush=True)
    if args.out:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        with open(args.out, "w") as fh:
            json.dump({"command": " ".join(sys.argv), "device": device, "torch": torch.__version__,
                       "results": [r.__dict__ for r in results]}, fh, indent=1)
    return 0


def prebuild(rows: int = 8192, works=tuple(SHAPES)) -> None:
    """Build the kernels this benchmark runs, in parallel (`python -c 'import bench.train_step as t;
    t.prebuild()'`), before the timed run."""
    from epic.runtime import build
    for p in build.build_all(units(rows, works)):
        print(p)


def units(rows: int = 8192, works=tuple(SHAPES)) -> list:
    """The kernels this benchmark runs at these rows."""
    from epic.autodiff.derive import derive_source
    from epic.codegen import emit
    units = []
    for work, shapes in ((w, SHAPES[w]) for w in works):
        d = epic.grad(_program(work))
        texts = [(d.forward_text, rows), (d.backward_text, rows)]
        if work == "ce":                  # the fused loss, whole and in chunks (the later chunks' variant too)
            later = derive_source(_program(work), policy="fused", accumulate=True)
            fused = epic.grad(_program(work), policy="fused").forward_text
            texts += [(fused, rows), (fused, min(rows, FUSED_CHUNK)), (later.forward_text, min(rows, FUSED_CHUNK))]
        for text, m in texts:
            prog = epic.compile(text)
            sizes = dict(shapes, M=m)
            sizes = {k: v for k, v in sizes.items() if k in prog.program.dims}
            for overrides in (None, CUTLASS_GRADS if any(k.name == "lm_head_da" for k in prog.program.kernels) else None):
                configs = emit.kernel_configs(prog.program, m, overrides, sizes)
                units += [u for _, u in emit.units(prog.program, configs)]
    return list({u.name + str(hash(u.source)): u for u in units}.values())


if __name__ == "__main__":
    sys.exit(main())
