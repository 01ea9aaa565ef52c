"""`epic plan FILE --shape ... --tuned`: what the tuning database measured for this program at these
sizes, on every GPU it holds: the tuned and heuristic fused times, the unfused torch form's (eager and
compiled), and which one fallback="auto" runs."""
from __future__ import annotations

from pathlib import Path

from ..frontend.sources import printable
from ..runtime import tuning_db as database
from . import measure


def _text(x, limit: int = 80) -> str:
    """Text from the database file (a user's file, maybe shipped by someone else) as it may reach a
    terminal: control characters escaped, length bounded."""
    s = printable(str(x))
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _cfg(cfg: dict) -> str:
    return _text(", ".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}"
                           for k, v in cfg.items()), 200)


def render(program, sizes: dict[str, int], file: Path | None = None) -> str:
    found = database.entries(program, sizes, file)
    where = file or database.path()
    bucket = database.bucket(program, sizes)
    if not found:
        return (f"tuned: the tuning database ({_text(where, 200)}) has no entry for this program at {bucket}, on any GPU; "
                "`epic tune FILE --shape ...` on the GPU makes one")
    out = [f"tuned ({_text(where, 200)}, {_text(bucket, 200)}):"]
    for gpu, entry in sorted(found.items()):
        fused = database.milliseconds(entry.get("ms"))
        timing = entry.get("timing") if entry.get("timing") in measure.TIMINGS else measure.TIMINGS[0]
        out.append(f"  {_text(gpu)}, measured {_text(entry.get('measured', '?'))} ({timing} timing):")
        if fused is None:
            out.append("    (no usable fused time in this entry)")
            continue
        rows = [("fused, tuned", fused),
                ("fused, heuristic configuration", database.milliseconds(entry.get("heuristic_ms")))]
        unfused = entry.get("unfused") if isinstance(entry.get("unfused"), dict) else {}
        for form in ("eager", "compiled"):
            rows.append((f"unfused torch form, {form}", database.milliseconds(unfused.get(f"{form}_ms"))))
        for label, ms in rows:
            if ms is not None:
                out.append(f"    {label:<32} {ms:9.4f} ms  {ms / fused:6.3f}x the fused")
            elif label.startswith("unfused"):
                why = unfused.get(f"{label.rsplit(' ', 1)[1]}_error")
                out.append(f"    {label:<32} {'not timed' + (f': {_text(why, 160)}' if why else '')}")
        configs = entry.get("configs") if isinstance(entry.get("configs"), dict) else {}
        for gemm, cfg in configs.items():
            if isinstance(cfg, dict):
                out.append(f"    gemm {_text(gemm)}: {_cfg(cfg)}")
        best = database.verdict(entry)
        if best is None:
            out.append("    no unfused times: fallback=\"auto\" runs the fused kernels")
        elif best[0] == "fused":
            out.append(f"    fusion wins, {best[1]:.3f}x faster than the best unfused form")
        else:
            out.append(f"    fusion LOSES: the unfused {best[0]} form is {best[1]:.3f}x faster; "
                       f"fallback=\"auto\" runs it")
    return "\n".join(out)
