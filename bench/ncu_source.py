"""Where profiled kernels' warps wait, instruction by instruction: Nsight Compute's sampled warp stalls
from its source page, per kernel, as a share of that kernel's samples.

  ncu --profile-from-start off --set full -o gemms python3 bench/ncu_compare.py --work plain_gate_up_k1024
  ncu --import gemms.ncu-rep --page source --csv --print-source sass > gemms-sass.csv
  python bench/ncu_source.py gemms-sass.csv --labels cublas,epic,quack [--top 20]

Prints, for each kernel (a block of the export that starts with its "Kernel Name" line), the opcodes
its warps were sampled at (HGMMA, SYNCS.PHASECHK for an mbarrier wait, BAR.SYNC, ...) and its top
instructions, each with its offset in the kernel (the numbers `cuobjdump -sass` prints beside each
instruction), its share of the samples and its three largest stall reasons; then the opcodes side by
side, one column per kernel. The sampler samples every warp at the same interval, so a kernel's
sample count is proportional to its warps' time on the SMs: compare shares within a kernel and
counts across kernels of the same launch shape.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass, field

ALL = "Warp Stall Sampling (All Samples)"


@dataclass
class Kernel:
    name: str
    rows: list[tuple[int, str, int, dict[str, int]]] = field(default_factory=list)  # offset, sass, samples, reasons

    @property
    def samples(self) -> int:
        return sum(r[2] for r in self.rows)


def _int(text: str) -> int:
    try:
        return int(float(text.replace(",", "")))
    except ValueError:
        return 0


def opcode(sass: str) -> str:
    """The instruction's opcode and first modifier ("SYNCS.PHASECHK", "HGMMA.64x192x16"), past a predicate."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return ".".join(words[0].rstrip(";").split(".")[:2]) if words else ""


def kernels(text: str) -> list[Kernel]:
    """The kernels of a `--page source --csv` export, in launch order."""
    out: list[Kernel] = []
    header: list[str] | None = None
    base = 0
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            out.append(Kernel(row[1] if len(row) > 1 else f"kernel {len(out) + 1}"))
            header = None
        elif row[0] == "Address" and "Source" in row and ALL in row:
            header = row
            if not out:                               # one kernel, exported without its name line
                out.append(Kernel(f"kernel {len(out) + 1}"))
        elif header and row[0].startswith("0x") and len(row) == len(header):
            col = dict(zip(header, row))
            address = int(row[0], 16)
            if not out[-1].rows:
                base = address
            reasons = {h[len("stall_"):]: _int(v) for h, v in col.items()
                       if h.startswith("stall_") and "Not Issued" not in h and _int(v)}
            out[-1].rows.append((address - base, col["Source"].strip(), _int(col[ALL]), reasons))
    if not any(k.rows for k in out):
        raise ValueError(f'no source-page rows (a header "Address","Source",...,"{ALL}") in the file')
    return [k for k in out if k.rows]


def by_opcode(kernel: Kernel) -> dict[str, int]:
    totals: dict[str, int] = {}
    for _, sass, n, _ in kernel.rows:
        totals[opcode(sass)] = totals.get(opcode(sass), 0) + n
    return totals


def report(ks: list[Kernel], labels: list[str], top: int) -> list[str]:
    lines: list[str] = []
    for label, k in zip(labels, ks):
        total = k.samples or 1
        lines.append(f"== {label}: {k.name[:100]} ({k.samples} samples)")
        for offset, sass, n, reasons in sorted(k.rows, key=lambda r: -r[2])[:top]:
            if n == 0:
                break
            why = ", ".join(f"{r} {v / n:.0%}" for r, v in sorted(reasons.items(), key=lambda x: -x[1])[:3])
            lines.append(f"  {offset:06x} {n / total:6.1%}  {sass[:70]:70s} {why}")
    ops = [by_opcode(k) for k in ks]
    names = sorted({o for t in ops for o in t}, key=lambda o: -max(t.get(o, 0) for t in ops))
    lines.append("== samples by opcode: " + " | ".join(labels))
    for o in names:
        if all(t.get(o, 0) == 0 for t in ops):
            continue
        cells = [f"{t.get(o, 0):>8d} {t.get(o, 0) / (k.samples or 1):6.1%}" for t, k in zip(ops, ks)]
        lines.append(f"  {o:28s} " + " | ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/ncu_source.py", description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="an `ncu --import R --page source --csv --print-source sass` export")
    ap.add_argument("--labels", default="", help="names for the kernels in launch order, e.g. cublas,epic,quack")
    ap.add_argument("--top", type=int, default=20, help="instructions listed per kernel (default 20)")
    args = ap.parse_args(argv)
    try:
        with open(args.csv, encoding="utf-8", errors="replace") as f:
            ks = kernels(f.read())
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    labels = [s for s in args.labels.split(",") if s] or [f"k{i + 1}" for i in range(len(ks))]
    if len(labels) != len(ks):
        print(f"error: {len(ks)} kernels in the file, {len(labels)} labels given", file=sys.stderr)
        return 2
    print("\n".join(report(ks, labels, max(args.top, 0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
