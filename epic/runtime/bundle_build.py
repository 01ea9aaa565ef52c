"""`epic build FILE --bundle DIR`: build a program's kernels at the given sizes and row counts, then
copy them into a bundle (runtime/bundle.py) with the program's tuning entries."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..codegen import emit
from ..diagnostics import EpicError, error
from ..frontend.sources import MAX_BYTES, printable, read_bytes
from . import build as build_mod, bundle
from . import tuning_db as database     # the tuning database (moved here from epic/tuning)


def units(program, sizes: dict | None, rows: list[int] | None) -> list:
    """The translation units of every configuration a call at these sizes (each row count of rows,
    else the sizes' own, else the large-M default) would run on any GPU (plan/gpus.py: an H100's
    heuristic differs from an H200's), without repeats."""
    out = {}
    for m in rows or [emit.rows(program, sizes)]:
        for _, unit in emit.units_for_gpus(program, m, None, sizes):
            out.setdefault((unit.name, unit.source), unit)
    return list(out.values())


def tuned_units(program, sizes: dict | None, rows: list[int] | None) -> tuple[list, dict]:
    """The kernels of the configurations the tuning database holds for this program at these sizes
    (with --shape only: its entries are per shape), and the program's entries to ship."""
    fp = database.fingerprint(program)
    entries = {k: v for k, v in database.load().items() if k.startswith(fp + "|")}
    if not sizes or not entries:
        return [], entries
    from ..plan import planner
    gemms = {k.name: k.span for k in program.kernels if k.kind == "gemm"}
    out = []
    row_dim = next(k.rows for k in program.kernels)
    for m in rows or [None]:
        at = dict(sizes)
        if m is not None:
            if len(row_dim.names) != 1 or row_dim.coef != 1:
                continue                    # M*S rows: which of the two is m? the shape's own only
            at[row_dim.names[0]] = m
        for gpu in database.entries(program, at):
            configs = database.lookup(program, at, gpu, gemms)
            if configs:
                try:
                    out += [u for _, u in emit.units(program, planner.make_plan(program, at, configs).configs)]
                except EpicError:           # an entry the plan refuses: calls take the heuristic's (shipped)
                    continue
    return out, entries


def build(analysis, file: str, sizes: dict | None, rows: list[int] | None, jobs: int | None,
          target: Path | None) -> list[Path]:
    program = analysis.program
    todo = units(program, sizes, rows)
    tuned, entries = tuned_units(program, sizes, rows) if target is not None else ([], {})
    seen = {(u.name, u.source) for u in todo}
    todo += [u for u in tuned if (u.name, u.source) not in seen and not seen.add((u.name, u.source))]
    paths = build_mod.build_all(todo, jobs)
    if target is None:
        return paths
    info = {"name": Path(file).name, "fingerprint": database.fingerprint(program),
            "source_sha256": hashlib.sha256(read_bytes(file, MAX_BYTES, "program file")).hexdigest(),
            "sizes": sizes or {}, "rows": rows or [emit.rows(program, sizes)]}
    bundle.write(target, info, list(zip(todo, paths)), versions(todo))
    if entries:
        _ship_tuning(target / bundle.TUNING, entries)
    return [target / p.parent.name / p.name for p in paths]


def versions(units) -> dict:
    """The versions that the kernels' keys hash (the bundle's index records them)."""
    from ..version import __version__
    cutlass = build_mod.cutlass_paths()[0] if any(u.uses_cutlass for u in units) else "-"
    return {"epic_version": __version__, "nvcc_version": build_mod.nvcc_version(build_mod.nvcc_path()),
            "cutlass_version": cutlass, "codegen_version": build_mod.CODEGEN_VERSION}


def _ship_tuning(path: Path, entries: dict) -> None:
    """The program's tuning entries, added to the bundle's tuning.json (a tuning database itself)."""
    old = database.load(path) if path.is_file() and not path.is_symlink() else {}
    data = {"version": database.VERSION, "entries": {**old, **entries}}
    try:
        bundle.replace_file(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    except OSError as e:
        raise error("E801", f"cannot write {printable(str(path))}: {e.strerror or e}") from None
