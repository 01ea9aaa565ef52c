"""The metrics in which profiled kernels differ, from an Nsight Compute CSV export: the step between
`bench/ncu_compare.py` (one launch each of cuBLAS, epic and QuACK) and a result file.

  ncu --import $OUT/gemms.ncu-rep --page details --csv > gemms.csv     # or --page raw
  python bench/ncu_diff.py gemms.csv --labels cublas,epic,quack --compare epic,quack [--min 0.01] [--match stall]

Prints, for every numeric metric whose values for the two compared kernels differ by more than --min
(relative to the larger), one line: section and metric, unit, then each kernel's value in launch order.
Both export pages are read: `details` (a row per kernel and metric) and `raw` (a row per kernel, a
column per metric, a row of units under the names).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys


# the raw page's columns that name a launch rather than measure it
IDENTITY = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC"}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _rows(text: str) -> list[list[str]]:
    """The CSV table, without the profiler's own lines (==PROF==, warnings) before its header."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no Nsight Compute CSV header (a line starting with "ID") in the file')
    return list(csv.reader(io.StringIO("\n".join(lines[start:]))))


def metrics(text: str) -> tuple[list[str], dict[str, tuple[str, list[str]]]]:
    """(kernel names in launch order, {metric: (unit, [value per kernel])})."""
    rows = _rows(text)
    header, body = rows[0], rows[1:]
    if "Metric Name" in header:                       # the details page
        col = {name: i for i, name in enumerate(header)}
        ids: list[str] = []
        names: list[str] = []
        table: dict[str, tuple[str, dict[str, str]]] = {}
        for r in body:
            kid = r[col["ID"]]
            if kid not in ids:
                ids.append(kid)
                names.append(r[col["Kernel Name"]])
            key = f"{r[col['Section Name']]} / {r[col['Metric Name']]}"
            table.setdefault(key, (r[col["Metric Unit"]], {}))[1][kid] = r[col["Metric Value"]]
        return names, {k: (unit, [vals.get(i, "") for i in ids]) for k, (unit, vals) in table.items()}
    units, kernels = body[0], body[1:]                # the raw page: units under the names
    name_col = header.index("Kernel Name")
    names = [r[name_col] for r in kernels]
    return names, {h: (units[j], [r[j] if j < len(r) else "" for r in kernels]) for j, h in enumerate(header)
                   if h not in IDENTITY}


def differing(table: dict[str, tuple[str, list[str]]], a: int, b: int, minimum: float, match: str = ""):
    """[(metric, unit, values)] whose kernels a and b differ by more than `minimum`, relative."""
    pattern = re.compile(match, re.I) if match else None
    out = []
    for name, (unit, values) in table.items():
        if pattern and not pattern.search(name):
            continue
        x, y = _number(values[a]), _number(values[b])
        if x is None or y is None or max(abs(x), abs(y)) == 0:
            continue
        if abs(x - y) / max(abs(x), abs(y)) > minimum:
            out.append((name, unit, values))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/ncu_diff.py", description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="an `ncu --import R --page details|raw --csv` export")
    ap.add_argument("--labels", default="", help="names for the kernels in launch order, e.g. cublas,epic,quack")
    ap.add_argument("--compare", default="", help="the two labels (or 1-based positions) to compare; "
                    "default: the last two kernels")
    ap.add_argument("--min", type=float, default=0.0, help="smallest relative difference printed (0.01: 1%%)")
    ap.add_argument("--match", default="", help="only metrics whose name matches this regular expression")
    args = ap.parse_args(argv)
    with open(args.csv, encoding="utf-8", errors="replace") as f:
        names, table = metrics(f.read())
    labels = [s for s in args.labels.split(",") if s] or [f"k{i + 1}" for i in range(len(names))]
    if len(labels) != len(names):
        print(f"error: {len(names)} kernels in the file, {len(labels)} labels given", file=sys.stderr)
        return 2
    if len(names) < 2:
        print("error: fewer than two kernels in the file: nothing to compare", file=sys.stderr)
        return 2
    pair = [s for s in args.compare.split(",") if s] or labels[-2:]
    try:
        a, b = (labels.index(p) if p in labels else int(p) - 1 for p in pair)
    except ValueError:
        a = b = -1
    if not (0 <= a < len(labels) and 0 <= b < len(labels)) or a == b:
        print(f"error: --compare takes two of {', '.join(labels)} (or positions 1-{len(labels)})", file=sys.stderr)
        return 2
    for label, name in zip(labels, names):
        print(f"{label}: {name[:110]}")
    print(f"metrics where {labels[a]} and {labels[b]} differ by more than {args.min:.1%}; "
          f"columns: {' | '.join(labels)}")
    for name, unit, values in differing(table, a, b, args.min, args.match):
        print(f"{name[:90]:90s} {unit[:12]:12s} {' | '.join(values)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
