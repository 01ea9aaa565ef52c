"""Ratios of epic's kernels to the bare cuBLAS GEMM, timed in interleaved rounds.

bench.py times cuBLAS first and epic afterwards; between back-to-back runs of the same kernels its
ratios moved by up to 10%, and so did medians of 40 ms blocks of runs taken in turns (the GPU's
clocks follow its power draw, which changes within a second). Here every round runs each candidate
once (a CUDA-graph replay after flushing L2, between two CUDA events), in an order that rotates from
round to round, so that the runs compared are milliseconds apart; a candidate's ratio is the median
over rounds of its time / cuBLAS's time in the same round, printed with the quartiles of that ratio.

  python bench/interleaved.py --work plain,bias_gelu --rows 8192 \
      --configs coop_128x256x64_c2x1_s8,coop_256x128x64_c1x2_s8 [--rounds 200] [--calls] [--out F]

Before timing, each configuration's outputs are compared with the default configuration's on the same
inputs (printed, and kept in the results as `outputs`): "equal bit for bit", or the largest difference;
after the timed rounds, once more with a call into poisoned outputs (`outputs_after`).

A configuration named `tuned` runs `epic tune` at the work's shape first and times its winners;
`serial` is the default configuration with no kernel launched as a programmatic dependent
(EPIC_DEPENDENT_LAUNCH=0), `noprefetch` without the dependents' L2 prefetch (EPIC_DEPENDENT_PREFETCH=0),
`dependent` with dependents at any row count (epic.plan.launch.DEPENDENT_ROWS lifted while it binds),
`first` with a one-gemm program's gemm launched as a dependent of the kernel before the call
(the default), `firstall` every program's first gemm, `infirst` none (EPIC_DEPENDENT_FIRST=0).
`nodes` (with --nodes-from DIR) is the default configuration generated with the custom node headers
in DIR (bench.py's nodes_from): another commit's nodes beside this one's, e.g. before and after a
node change. Build its kernels with `bench/prebuild.py --nodes-from DIR`.
`rowsR` (rows1, rows4, rows8, ...) is the default configuration with every grouped combine kernel
merging R rows (columns) per warp from the first row on (bench.py's combine_rows; rows1: a warp per
row), `rowsRxF` the same with F loads in flight per lane: the grouped form's rows per warp, loads in
flight and threshold measured in one run. Build its kernels with `bench/prebuild.py --combine-rows
1,4,8,4x16`.
`unfused` is the default configuration with each reduction of a grouped combine merged in a loop of its
own (combine.py's FUSE_LOOPS off); `unpicked`, with a picked label logit merged from every tile's partial
(split_reductions.PICK off). Build them with `bench/prebuild.py --combine-variants unfused,unpicked`.

--repeat N makes each run N calls back to back (cuBLAS's too), as a model's consecutive layers would:
a call's first gemm then follows the previous call's last kernel. `--work a+b` runs work a's program
then b's in each run (cuBLAS: a's GEMMs then b's), e.g. a decode layer's programs in order.

--calls times epic through its call path (`prog(**inputs)`) instead of graph replays, and cuBLAS as
`x @ w` calls; each run then starts on an idle GPU (synchronized after the flush), so the host's time
to issue the launches is inside the events.

--flush read flushes L2 by reading the 256 MB buffer instead of writing it: a write leaves the L2 full
of dirty lines that the timed run's reads must write back to DRAM first (cuBLAS at M = 64, N = K = 4096:
17.8 us after a write, 14.2 after a read, bench/decode_m_scaling.py); after a read the L2 holds clean
lines, as it would in a model's decode step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402
from epic.runtime import fastcall  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (ROOT, WORK, allow_tile_widths, combine_rows, combine_rows_label, graphed, nodes_from,  # noqa: E402
                   combine_variant, gemm_overrides, parse_config, COMBINE_VARIANTS)
from profiling import l2_flush  # noqa: E402


def candidates(name: str, m: int, configs: list[str], calls: bool = False, repeat: int = 1):
    """[(label, replay)] for cuBLAS, epic's default configuration and each configuration given
    (with calls: the calls themselves instead of CUDA-graph replays; repeat: each run makes that many
    calls back to back, as a model's consecutive layers do). A name `a+b` runs work a's program then
    b's in each call (cuBLAS: a's GEMMs then b's); it takes the launch-rule labels only."""
    if "+" in name:
        return sequence_candidates(name.split("+"), m, configs, calls, repeat)
    path, make = WORK[name]
    gemm, _, inputs = make(m)
    wrap = wrapper(calls, repeat)
    # the control: cuBLAS again, as a candidate; its ratio shows the method's noise floor
    out = [("cublas", wrap(gemm)), ("cublas-again", wrap(gemm))]
    base = epic.compile(os.path.join(ROOT, path))
    want = None
    for label in ["default"] + configs:
        try:
            if label == "tuned":      # what `epic tune` picks at this shape, timed beside the rest
                config = tuned_config(base, path, inputs)
                print(f"  {name} M={m} tuned: {config}", flush=True)
            elif label == "nodes" or label in COMBINE_VARIANTS or combine_rows_label(label):   # the default configuration,
                config = None         # compiled anew from other node headers, or with its combines changed
            elif label in SWITCHES or label in PATCHES:   # the default with a launch rule changed
                prog = bound_with_rule(path, inputs, label)
                out.append((label, wrap(lambda p=prog: p(**inputs))))
                continue
            else:
                config = gemm_overrides(base.program, parse_config(label)) if label != "default" else None
            other_nodes, rows = label == "nodes", combine_rows_label(label)
            anew = config is not None or other_nodes or rows is not None or label in COMBINE_VARIANTS
            with nodes_from(NODES_FROM if other_nodes else None), combine_rows(*(rows or (None,))), \
                    combine_variant(label):                         # the first call generates
                prog = epic.compile(os.path.join(ROOT, path), config) if anew else base     # the kernels
                got = outputs(prog(**inputs))
            if want is None:
                want = got
            else:       # a configuration that computes something else is not a faster kernel: say so
                AGREEMENT[(name, m, label)] = agreement(want, got)
                print(f"  {name} M={m} {label}: {AGREEMENT[(name, m, label)]}", flush=True)
                # and again after the timed rounds, into poisoned outputs (recheck())
                RECHECK.setdefault((name, m), []).append(
                    (label, lambda p=prog: outputs(p(poison=True, **inputs)), want))
            out.append((label, wrap(lambda p=prog: p(**inputs))))
        except Exception as e:   # a configuration this program cannot take: say why, time the rest
            print(f"  {name} M={m} {label}: {str(e).splitlines()[0][:160]}", flush=True)
    return out


NODES_FROM: str | None = None      # --nodes-from: the node headers of the `nodes` candidate

# (work, M, label) -> how a configuration's outputs compare with the default configuration's
AGREEMENT: dict[tuple[str, int, str], str] = {}
# (work, M) -> [(label, a call into poisoned outputs returning them, the default's outputs)]
RECHECK: dict[tuple[str, int], list] = {}


def recheck(checks: list) -> dict[str, str]:
    """label -> agreement() of one more call after the timed rounds with the default's first outputs.
    The first call alone can pass where later ones fail: a kernel that leaves state behind for the next
    launch (tile_order=dynamic's counter, 2026-12-06-h100-dynamic-scheduler-debug.log), and a graph
    replay that writes nothing leaves the previous replay's bytes in its buffers."""
    return {label: agreement(want, call()) for label, call, want in checks}


def outputs(result) -> dict:
    """A call's outputs, copied (the next call may write the same buffers)."""
    return {k: v.detach().clone() for k, v in result.items()} if isinstance(result, dict) else {}


def agreement(want: dict, got: dict) -> str:
    """'equal bit for bit' where every output has the same bytes as the default's, else the largest
    difference relative to the default output's root mean square, and in which output. A tile order
    or a diagnostic build leaves each element's arithmetic unchanged, so should read bit for bit;
    where a row statistic adds per-tile partials, another tile width groups them otherwise."""
    worst, where = 0.0, ""
    for k, w in want.items():
        g = got.get(k)
        if g is None or g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k} missing or of another shape/dtype"
        if torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)):
            continue
        wd, gd = w.double(), g.double()
        scale = wd.pow(2).mean().sqrt().item() or 1.0
        diff = (gd - wd).abs().nan_to_num(float("inf")).max().item() / scale
        if diff >= worst:
            worst, where = diff, k
    return "equal bit for bit" if not where else f"differs: max |difference| {worst:.2e} x rms in {where}"


def wrapper(calls: bool, repeat: int):
    def wrap(fn):
        runs = fn if repeat == 1 else (lambda: [fn() for _ in range(repeat)])
        return runs if calls else graphed(runs)
    return wrap


def sequence_candidates(names: list[str], m: int, configs: list[str], calls: bool, repeat: int):
    """candidates() of works run one after the other in each call."""
    works = [(WORK[n][0], *WORK[n][1](m)) for n in names]     # (path, gemm, make's second, inputs)
    wrap = wrapper(calls, repeat)
    gemm = wrap(lambda: [g() for _, g, _, _ in works])
    out = [("cublas", gemm), ("cublas-again", wrap(lambda: [g() for _, g, _, _ in works]))]
    for label in ["default"] + configs:
        if label != "default" and label not in SWITCHES and label not in PATCHES:
            print(f"  {'+'.join(names)} M={m} {label}: a sequence takes launch-rule labels only", flush=True)
            continue
        progs = [(bound_with_rule(path, inputs, label), inputs) for path, _, _, inputs in works]
        out.append((label, wrap(lambda ps=progs: [p(**i) for p, i in ps])))
    return out


def bound_with_rule(path: str, inputs: dict, label: str):
    """The program bound to these inputs with the launch rule of a SWITCHES or PATCHES label (none for
    'default')."""
    prog = epic.compile(os.path.join(ROOT, path))
    rule = (switched_off(SWITCHES[label]) if label in SWITCHES else
            patched(*PATCHES[label]) if label in PATCHES else contextlib.nullcontext())
    with rule:
        prog(**inputs)    # binds here, with the rule read
    return prog


# labels of the default configuration with one of the runtime's launch switches off
SWITCHES = {"serial": "EPIC_DEPENDENT_LAUNCH", "noprefetch": "EPIC_DEPENDENT_PREFETCH"}


@contextlib.contextmanager
def switched_off(name: str):
    """name=0 while a program binds (runtime/binding.py reads the switches there)."""
    before = os.environ.get(name)
    os.environ[name] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


# labels of the default configuration with a rule of epic.plan.launch changed: dependents at any row
# count; which programs' first gemm is a dependent of the kernel before the call
PATCHES = {"dependent": ("DEPENDENT_ROWS", 1 << 30), "first": ("FIRST_DEPENDENT", "one-gemm"),
           "infirst": ("FIRST_DEPENDENT", "none"), "firstall": ("FIRST_DEPENDENT", "all")}


@contextlib.contextmanager
def patched(name: str, value):
    """epic.plan.launch.<name> = value while a program binds."""
    from epic.plan import launch
    before = getattr(launch, name)
    setattr(launch, name, value)
    try:
        yield
    finally:
        setattr(launch, name, before)


def tuned_config(prog, path: str, inputs: dict) -> dict:
    """`epic tune`'s winners for this program at these inputs' sizes (its own database file, so the
    default candidate stays the heuristic's)."""
    import tempfile

    from epic.runtime import validate
    from epic.tuning import tuner
    shapes = {k: tuple(v.shape) for k, v in inputs.items() if hasattr(v, "shape") and v.dim() > 0}
    sizes = validate.solve(prog.program, shapes, indexable=True)
    with tempfile.TemporaryDirectory() as d:
        return tuner.tune(os.path.join(ROOT, path), sizes, database_file=Path(d) / "tuning.json",
                          report=lambda *a, **k: None).configs


def rounds(cands, n: int, batch: int = 10, idle: bool = False, flush_by: str = "write") -> dict[str, list[float]]:
    """ms per run: n rounds, each running every candidate once; synchronized every `batch` rounds
    (idle: also before each run, so that the time to issue it counts)."""
    flush = l2_flush(flush_by)
    times: dict[str, list[float]] = {label: [] for label, _ in cands}
    for _, fn in cands:                                                   # warm up
        fn()
    for first in range(0, n, batch):
        marks = []
        for r in range(first, min(n, first + batch)):
            for label, fn in cands[r % len(cands):] + cands[:r % len(cands)]:
                flush()
                if idle:
                    torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                marks.append((label, start, end))
        torch.cuda.synchronize()
        for label, start, end in marks:
            times[label].append(start.elapsed_time(end))
    return times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


# A candidate whose middle half of rounds spans more than this share of its median: its time has more
# than one mode (on an H100 the default tile at N = 4096 runs at about 0.99 or about 1.15 of cuBLAS,
# bench/results/2026-12-06-h100-n4096-second-machine.log), or it is noisy (decode sizes: cuBLAS against
# itself spans 0.2-0.6% at M = 8192, up to about 5% at M = 64), so its median depends on the run.
SPREAD = 0.04


def spread_notes(ratios: dict) -> list[str]:
    """A line for each candidate (label -> {"median", "q1", "q3"}) whose quartiles lie wider apart than
    SPREAD of its median."""
    notes = []
    for label, r in ratios.items():
        width = (r["q3"] - r["q1"]) / r["median"]
        if width > SPREAD:
            notes.append(f"  {label}: its rounds' middle half spans {width:.0%} of its median "
                         f"[{r['q1']:.3f}-{r['q3']:.3f}]: more than one mode, or noise; its median depends on the run "
                         "(compare bench/kernel_times.py and bench/sustained.py)")
    return notes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="plain")
    ap.add_argument("--rows", default="8192")
    ap.add_argument("--configs", default="")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--calls", action="store_true", help="time calls (host path included), not graph replays")
    ap.add_argument("--repeat", type=int, default=1, help="calls back to back in each run")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="flush L2 by writing (dirty lines, the default) or reading a 256 MB buffer")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "interleaved.json"))
    ap.add_argument("--tile-widths", default="", help="also tiles of these widths in --configs (bench.py's "
                    "allow_tile_widths: not checked on a GPU by epic's tests), e.g. 176,208")
    ap.add_argument("--nodes-from", default=None, help="also time the default configuration generated with the "
                    "custom node headers in this directory (candidate `nodes`, bench.py's nodes_from)")
    args = ap.parse_args()
    if args.tile_widths:
        allow_tile_widths(args.tile_widths)
    configs = [c for c in args.configs.split(",") if c]
    if args.nodes_from:
        global NODES_FROM
        NODES_FROM = args.nodes_from
        configs.append("nodes")
    print(torch.__version__, torch.cuda.get_device_name(), time.strftime("%Y-%m-%d"), flush=True)
    fastcall.library()      # built before any call: calls take the ctypes path while it builds
    results = []
    for name in args.work.split(","):
        for m in (int(r) for r in args.rows.split(",")):
            times = rounds(candidates(name, m, configs, args.calls, args.repeat), args.rounds, idle=args.calls,
                           flush_by=args.flush)
            base = times["cublas"]
            rec = {"work": name, "M": m, "timed": "calls" if args.calls else "graph replays", "flush": args.flush,
                   "repeat": args.repeat,
                   "cublas_ms": statistics.median(base), "ratios": {}}
            for label, ts in times.items():
                if label == "cublas":
                    continue
                low, mid, high = quartiles([t / b for t, b in zip(ts, base)])
                rec["ratios"][label] = {"median": mid, "q1": low, "q3": high, "ms": statistics.median(ts)}
                if (name, m, label) in AGREEMENT:
                    rec["ratios"][label]["outputs"] = AGREEMENT[(name, m, label)]
            for label, said in recheck(RECHECK.pop((name, m), [])).items():
                rec["ratios"][label]["outputs_after"] = said
                print(f"  {name} M={m} {label} after the timed rounds: {said}", flush=True)
            results.append(rec)
            line = "  ".join(f"{k}={v['median']:.3f} [{v['q1']:.3f}-{v['q3']:.3f}]" for k, v in rec["ratios"].items())
            print(f"{name:<14}{m:>6}  cublas {rec['cublas_ms']:.4f} ms  {line}", flush=True)
            for note in spread_notes(rec["ratios"]):
                print(note, flush=True)
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "rounds": args.rounds, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
