"""One candidate of `epic tune`, timed in a child process: a kernel that hangs (a bad configuration,
a scheduler that never finishes) hangs the child, which the parent kills after --timeout seconds and
reports as that candidate's failure, instead of hanging the whole tune.

  python -m epic.tuning.trial < request.json    ->  {"ms": 0.123} or {"why": "..."} on stdout

The request: {"source": path or program text, "sizes": {...}, "configs": {gemm: options}, "reps": n,
"seed": s, "give_up_ms": ms or null (measure.median_ms), "reference": {gemm: options} or null,
"reference_ms": ms or null, "timing": "paired" or "sustained"}. With a reference, the candidate is
timed in rounds against it (measure.paired_ms) and its time is reference_ms scaled by their ratio;
with timing "sustained", back to back for seconds (measure.sustained_ms), with no reference. The
child builds nothing (EPIC_NO_BUILD: the parent built every candidate) and ignores the tuning
database (EPIC_NO_TUNING: the candidate's configuration is the point).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from ..diagnostics import Diagnostic, EpicError


def request(source: str, sizes: dict, configs: dict, reps: int, seed: int = 0, give_up_ms: float | None = None,
            reference: dict | None = None, reference_ms: float | None = None, timing: str = "paired") -> str:
    return json.dumps({"source": source, "sizes": sizes, "configs": configs, "reps": reps, "seed": seed,
                       "give_up_ms": give_up_ms, "reference": reference or None, "reference_ms": reference_ms,
                       "timing": timing})


def run_isolated(payload: str, timeout: float, argv: list[str] | None = None) -> float:
    """The child's time in ms; EpicError (E707's wording is the caller's) with why it has none."""
    argv = argv or [sys.executable, "-m", "epic.tuning.trial"]
    env = {**os.environ, "EPIC_NO_BUILD": "1", "EPIC_NO_TUNING": "1"}
    try:
        done = subprocess.run(argv, input=payload, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise EpicError(Diagnostic("E707", f"timed out after {timeout:g} s (a kernel that never finishes?); "
                                   "the child process was killed")) from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if isinstance(answer, dict) and isinstance(answer.get("ms"), (int, float)) and answer["ms"] > 0:
        return float(answer["ms"])
    why = answer.get("why") if isinstance(answer, dict) else None
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
    raise EpicError(Diagnostic("E707", why or f"the timing process exited with status {done.returncode} ({tail})"))


def main() -> int:
    from .. import pipeline
    from ..frontend import options
    from ..runtime.compiled import CompiledProgram
    from . import measure
    from .inputs import device_inputs
    try:
        req = json.loads(sys.stdin.read())
        analysis = pipeline.analyze(req["source"])
        gemms = {k.name: k.span for k in analysis.program.kernels if k.kind == "gemm"}
        prog = CompiledProgram(analysis, options.check_config(req["configs"], gemms))
        inputs = device_inputs(analysis.source_program, req["sizes"], req.get("seed", 0))
        give_up = req.get("give_up_ms")
        give_up = float(give_up) if isinstance(give_up, (int, float)) else None
        if req.get("timing") == "sustained":
            ms = measure.sustained_ms(lambda: prog(**inputs), give_up_ms=give_up)
        elif req.get("reference") and isinstance(req.get("reference_ms"), (int, float)):
            ref = CompiledProgram(analysis, options.check_config(req["reference"], gemms))
            ms = measure.paired_ms(lambda: prog(**inputs), lambda: ref(**inputs), float(req["reference_ms"]),
                                   int(req["reps"]), give_up_ms=give_up)
        else:
            ms = measure.median_ms(lambda: prog(**inputs), int(req["reps"]), give_up_ms=give_up)
        print(json.dumps({"ms": ms}))
    except EpicError as e:
        print(json.dumps({"why": e.diagnostics[0].message.splitlines()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
