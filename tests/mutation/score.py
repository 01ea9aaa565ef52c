#!/usr/bin/env python3
"""The mutation score from `mutmut results --all true` on stdin: per module and overall.

Detected: killed (a test failed), segfault (the test process crashed) and timeout (it hung: the
suite does not pass). Not detected: survived, no tests (no CPU test runs the function: GPU-only
paths) and suspicious (slow but passing). Mutants not run yet are left out and counted.
"""
import collections
import re
import sys

DETECTED = {"killed", "segfault", "timeout"}
MISSED = {"survived", "no tests", "suspicious"}


def main() -> None:
    only = None
    if len(sys.argv) == 3 and sys.argv[1] == "--only":           # score a sample (sample.py's names)
        only = set(open(sys.argv[2]).read().split())
    per = collections.defaultdict(collections.Counter)
    for line in sys.stdin:
        m = re.match(r"\s*([\w.]+)__mutmut_\d+: (.+?)\s*$", line)
        if not m or (only is not None and line.split(":")[0].strip() not in only):
            continue
        module = m.group(1).rsplit(".", 1)[0].replace(".x_", ".").rsplit(".x", 1)[0]
        per[module][m.group(2)] += 1
    total = collections.Counter()
    print(f"{'module':<34} {'detected':>9} {'missed':>7} {'not run':>8} {'score':>7}")
    for module in sorted(per):
        c = per[module]
        total.update(c)
        print(_row(module, c))
    print(_row("all", total))


def _row(name: str, c: collections.Counter) -> str:
    detected = sum(c[s] for s in DETECTED)
    missed = sum(c[s] for s in MISSED)
    pending = sum(v for s, v in c.items() if s not in DETECTED | MISSED)
    score = f"{100 * detected / (detected + missed):.1f}%" if detected + missed else "-"
    return f"{name:<34} {detected:>9} {missed:>7} {pending:>8} {score:>7}"


if __name__ == "__main__":
    main()
