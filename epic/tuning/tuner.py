"""`epic tune FILE --shape ...`: search each gemm's configuration on the GPU and store the winners.

Gemm by gemm, in program order (a chain's later gemms are tuned with the earlier ones' winners in
place): the candidates of tuning/space.py are built all at once (parallel nvcc), then each is timed
as the whole program's call (so a configuration that makes a combine kernel slower loses) on the
same random inputs. The gemm's first candidate (the heuristic's) is timed alone; every later one in
rounds against it (measure.paired_ms: runs milliseconds apart, so the GPU's clock drift cancels),
its time being the first one's scaled by their ratio. A candidate that cannot be built or launched is
reported and skipped; one whose first timed run is over GIVE_UP times the best so far is timed no
further (it cannot win). The heuristic's configuration stays unless a candidate is MARGIN (1%) faster.
A chain's winners are timed once more against the all-heuristic plan. With timing="sustained"
(`epic tune --timing sustained`) every candidate is instead replayed back to back for seconds
(measure.sustained_ms): at its own power limit, as a training step runs its gemms, where rounds
against another kernel share the power budget out and hide a configuration's extra DRAM traffic
(docs/PERFORMANCE.md, "Sustained load"). Then the program's unfused torch form (runtime/unfused.py)
is timed on the same inputs, eager and compiled, in rounds against the winner (or back to back, as
the candidates were): the baseline fusion must beat
(`epic plan --tuned` prints the comparison; fallback="auto" runs the faster form). The result goes
to the tuning database, which epic.compile consults from then on.
"""
from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass, field

from .. import pipeline, sizes as sizes_mod
from ..codegen import emit
from ..diagnostics import EpicError
from ..plan import gpus, planner
from ..runtime import build
from ..runtime import tuning_db as database
from . import measure, space
from . import trial as isolated
from .inputs import device_inputs

GIVE_UP = 3.0    # a candidate whose first timed run exceeds this multiple of the best so far stops there
# A candidate replaces the heuristic's configuration only if it is at least this much faster: a lead
# smaller than that is within what the timing mode can rank (the H200 tune of cross entropy at M = 8192
# picked a tile order 0.3% faster in paired rounds that is 8.9% slower back to back,
# bench/results/2026-12-06-h200-tune-timing.log).
MARGIN = 0.01


@dataclass
class Trial:
    gemm: str
    config: str                  # str(KernelConfig)
    override: dict
    ms: float | None = None
    why: str | None = None       # why it was not timed
    units: list = field(default_factory=list, repr=False)


@dataclass
class Result:
    key: str
    configs: dict[str, dict]
    ms: float
    heuristic_ms: float
    trials: list[Trial] = field(default_factory=list)


def tune(path_or_source: str, sizes: dict[str, int], limit: int = 6, reps: int = 20, jobs: int | None = None,
         database_file=None, gpu: str | None = None, timer=None, builder=None, report=print,
         unfused_timer=None, timeout: float = 120.0, timing: str = "paired") -> Result:
    """Tune every gemm of a program at these sizes; stores and returns the result.
    Each candidate is timed in a child process killed after `timeout` seconds (0: in this process).
    timer(prog, inputs) -> ms, unfused_timer(unfused, inputs) -> the entry's "unfused" dict and
    builder(units) exist for tests; by default the GPU times the calls."""
    import torch
    from ..runtime.compiled import CompiledProgram
    if timing not in measure.TIMINGS:
        raise ValueError(f"timing {timing!r}: one of {', '.join(measure.TIMINGS)}")
    sustained = timing == "sustained"
    analysis = pipeline.analyze(path_or_source)
    program = analysis.program
    planner.make_plan(program, sizes)                                  # the sizes are legal at all
    gpu = gpu or torch.cuda.get_device_name()
    on_gpu = timer is None
    give_up: dict[str, float | None] = {"ms": None}     # GIVE_UP x the best time so far of this gemm
    reference: dict = {"prog": None, "ms": None}      # the gemm's first timed candidate: the others pair with it
    if timer is None:
        def timer(prog, inputs):
            ref = reference["prog"]
            if timeout:
                return isolated.run_isolated(isolated.request(
                    path_or_source, sizes, prog.config, reps, give_up_ms=give_up["ms"],
                    reference=ref.config if ref and not sustained else None, reference_ms=reference["ms"],
                    timing=timing), timeout)
            if sustained:
                return measure.sustained_ms(lambda: prog(**inputs), give_up_ms=give_up["ms"])
            if ref is None:
                return measure.median_ms(lambda: prog(**inputs), reps, give_up_ms=give_up["ms"])
            return measure.paired_ms(lambda: prog(**inputs), lambda: ref(**inputs), reference["ms"], reps,
                                     give_up_ms=give_up["ms"])
    builder = builder or (lambda units: build.build_all(units, jobs))
    inputs = device_inputs(analysis.source_program, sizes) if on_gpu else {}
    best: dict[str, dict] = {}
    trials: list[Trial] = []
    heuristic_ms = heuristic = None
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    for kernel in gemms:
        round_trials = _trials(program, sizes, kernel, limit, best, gpus.key(gpu))
        report(f"{kernel.name}: building {len(kernels_of(round_trials))} kernel(s) for {len(round_trials)} "
               "configuration(s)")
        _build_each(builder, round_trials)
        give_up["ms"] = None
        reference.update(prog=None, ms=None)
        for trial in round_trials:
            if trial.why is None:
                try:
                    prog = CompiledProgram(analysis, {**best, kernel.name: trial.override})
                    trial.ms = timer(prog, inputs)
                except EpicError as e:
                    trial.why = e.diagnostics[0].message.splitlines()[0]
                if trial.ms is not None and reference["prog"] is None:
                    reference.update(prog=prog, ms=trial.ms)
            slow = trial.ms is not None and give_up["ms"] is not None and trial.ms > give_up["ms"]
            report(f"  {trial.config:<48} " + (f"{trial.ms:8.3f} ms" if trial.ms is not None else f"skipped: {trial.why}")
                   + (f"  (over {GIVE_UP:g}x the best so far)" if slow else ""))
            if trial.ms is not None:
                give_up["ms"] = min(give_up["ms"] or float("inf"), GIVE_UP * trial.ms)
            trial.units = []
        trials += round_trials
        timed = [t for t in round_trials if t.ms is not None]
        if not timed:
            raise EpicError(_no_candidate(kernel.name, round_trials))
        if heuristic_ms is None and round_trials[0].ms is not None:   # every gemm at the heuristic's configuration
            heuristic_ms, heuristic = round_trials[0].ms, {**best, kernel.name: round_trials[0].override}
        winner = min(timed, key=lambda t: t.ms)
        first = round_trials[0]
        if winner is not first and first.ms is not None and winner.ms > first.ms * (1 - MARGIN):
            report(f"  ({winner.config} is less than {MARGIN:.0%} faster than the heuristic's: kept)")
            winner = first
        best[kernel.name] = winner.override
        ms = winner.ms
        report(f"  -> {winner.config}")
    if len(gemms) > 1 and heuristic is not None and on_gpu:
        # a chain: each gemm's times were scaled by its own first candidate's; time the winners once more
        # in rounds against the all-heuristic plan, so that tuned and heuristic totals compare
        give_up["ms"] = None
        reference.update(prog=CompiledProgram(analysis, heuristic), ms=heuristic_ms)
        try:
            ms = timer(CompiledProgram(analysis, best), inputs)
        except EpicError as e:
            report(f"  (the winners could not be timed against the heuristic's plan: {e.diagnostics[0].message})")
    entry = {"configs": best, "ms": round(ms, 4), "heuristic_ms": round(heuristic_ms or ms, 4),
             "measured": datetime.date.today().isoformat(), "sizes": dict(sizes), "candidates": len(trials),
             "timing": timing}
    if unfused_timer is None and on_gpu:        # in rounds against the fused winner, scaled by its time
        winner_prog = CompiledProgram(analysis, best)

        def unfused_timer(unfused, inputs):
            if sustained:
                return _time_unfused(unfused, inputs, reps, sustained=True)
            return _time_unfused(unfused, inputs, reps, lambda: winner_prog(**inputs), ms)
    if unfused_timer is not None:
        from ..runtime.unfused import Unfused
        entry["unfused"] = unfused_timer(Unfused(program, analysis.source_program), inputs)
        for form in ("eager", "compiled"):
            got = entry["unfused"].get(f"{form}_ms")
            report(f"unfused torch form, {form}: " + (f"{got:.3f} ms ({got / ms:.3f}x the fused)" if got
                                                      else entry["unfused"].get(f"{form}_error", "not timed")))
    key = database.store(program, sizes, gpu, entry, database_file)
    return Result(key, best, ms, heuristic_ms or ms, trials)


def _trials(program, sizes: dict[str, int], kernel, limit: int, best: dict[str, dict],
            key: str | None) -> list[Trial]:
    """One gemm's candidates as trials, each with the kernels its plan builds (the program's other gemms
    at `best`, the heuristic's for the GPU of key `key` where absent: plan/gpus.py); a configuration the
    plan refuses says why."""
    m, n = sizes_mod.evaluate(kernel.rows, sizes), sizes_mod.evaluate(kernel.n, sizes)   # this gemm's own
    out = []
    for cfg in space.candidates(kernel, program.tensors, m, n, limit, sizes_mod.evaluate(kernel.k, sizes), key,
                                program):
        trial = Trial(kernel.name, str(cfg), space.override(cfg))
        try:
            plan = planner.make_plan(program, sizes, {**best, kernel.name: trial.override}, key)
            trial.units = [u for _, u in emit.units(program, plan.configs)]
        except EpicError as e:
            trial.why = e.diagnostics[0].message.splitlines()[0]
        out.append(trial)
    return out


def build_candidates(path_or_source: str, sizes: dict[str, int], limit: int = 6, jobs: int | None = None,
                     builder=None) -> list[Trial]:
    """`epic tune --build-only`: build, without a GPU, the kernels a tune at these sizes times, in one
    parallel nvcc run, so that the tune on the GPU machine finds them in the cache. Every gemm's
    candidates are planned with the program's other gemms at the heuristic's configuration: a chain's
    tune plans its later gemms with the earlier winners in place, so where a winner is not the
    heuristic's the tune builds those kernels itself. Returns the trials (why: a candidate the plan
    refused or nvcc could not build); E707 where none of a gemm's could be built."""
    program = pipeline.analyze(path_or_source).program
    planner.make_plan(program, sizes)                                  # the sizes are legal at all
    per_gemm = {}                             # every GPU's candidates where this machine has none
    for k in (k for k in program.kernels if k.kind == "gemm"):
        trials_of: dict[tuple, Trial] = {}     # (configuration, the plan's kernels): the same trial once
        for key in gpus.build_keys():
            for t in _trials(program, sizes, k, limit, {}, key):
                trials_of.setdefault((t.config, tuple(u.name for u in t.units)), t)
        per_gemm[k.name] = list(trials_of.values())
    trials = [t for ts in per_gemm.values() for t in ts]
    _build_each(builder or (lambda units: build.build_all(units, jobs)), trials)
    for gemm, ts in per_gemm.items():         # none of a gemm's candidates built (nvcc missing, ...)
        if all(t.why for t in ts):
            raise EpicError(_no_candidate(gemm, ts, "built"))
    return trials


def kernels_of(trials: list[Trial]) -> dict:
    """The distinct kernel units of the trials the plan accepted (launch options share one kernel)."""
    return {u.name + u.source: u for t in trials if t.why is None for u in t.units}


def _build_each(builder, trials: list[Trial]) -> None:
    """Build every trial's kernels in one parallel run; if that fails, trial by trial, so one
    configuration nvcc refuses (E217: too little shared memory) only skips itself."""
    todo = [t for t in trials if t.why is None]
    try:
        builder([u for t in todo for u in t.units])
        return
    except EpicError:
        pass
    for t in todo:
        try:
            builder(t.units)
        except EpicError as e:
            t.why = e.diagnostics[0].message.splitlines()[0]


def _no_candidate(gemm: str, trials: list[Trial], done: str = "built and timed"):
    from ..diagnostics import Diagnostic
    why = "; ".join(f"{t.config}: {t.why}" for t in trials[:3])
    return Diagnostic("E707", f"no configuration of gemm '{gemm}' could be {done} ({why})")


def _time_unfused(unfused, inputs: dict, reps: int = 20, fused=None, fused_ms: float | None = None,
                  sustained: bool = False) -> dict:
    """The unfused form's times, eager and compiled (with how long compiling took); a form that fails
    (torch.compile refusing a graph) is recorded with why, not raised. With fused() and its time, each
    form is timed in rounds against it (measure.paired_ms), so fused and unfused compare without the
    clock drift between two separate medians; sustained: back to back (measure.sustained_ms), as the
    fused candidates were."""
    import time
    out: dict = {}
    for form, compiled in (("eager", False), ("compiled", True)):
        try:
            start = time.perf_counter()
            unfused(compiled=compiled, **inputs)
            if compiled:
                out["compile_s"] = round(time.perf_counter() - start, 1)
            run = functools.partial(unfused, compiled=compiled, **inputs)
            if sustained:
                ms = measure.sustained_ms(run)
            else:
                ms = measure.paired_ms(run, fused, fused_ms, reps) if fused is not None else measure.median_ms(run, reps)
            out[f"{form}_ms"] = round(ms, 4)
        except Exception as e:      # noqa: BLE001 -- a baseline that cannot run is a finding, not a crash
            out[f"{form}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return out
