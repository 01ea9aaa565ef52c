#!/usr/bin/env python3
"""Plant mutants by hand: for code that runs when its module is imported (rule tables built at
import), mutmut's switch comes too late, so its mutants "survive" untested. This applies each named
mutant's diff (`mutmut show`, run in MUTMUT_DIR) to a fresh copy of the source and runs the tests.

  tests/mutation/plant.py MUTMUT_DIR TESTS... -- NAME...
  PLANT_MARKERS="not gpu" tests/mutation/plant.py ...     # with the nvcc tests (mutmut's runs leave them out)

Prints one line per mutant: killed (a test failed) or SURVIVED.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    mm_dir = sys.argv[1]
    tests, names = sys.argv[2:sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1:]
    root = os.getcwd()
    survived = 0
    for name in names:
        diff = subprocess.run(["mutmut", "show", name], cwd=mm_dir, capture_output=True, text=True).stdout
        work = tempfile.mkdtemp(prefix="plant-")
        try:
            subprocess.run(f"git -C {root} archive HEAD | tar -x -C {work}", shell=True, check=True)
            if not _apply(work, diff):
                print(f"{name}: the diff does not apply")
                continue
            markers = os.environ.get("PLANT_MARKERS", "not nvcc and not gpu")   # "not gpu": nvcc tests too
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                                markers, *tests], cwd=work, capture_output=True, text=True)
            killed = r.returncode != 0
            survived += not killed
            print(f"{name}: {'killed' if killed else 'SURVIVED'}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if survived else 0


def _apply(work: str, diff: str) -> bool:
    """Replace the diff's removed lines by its added ones in the file it names. `mutmut show` prints a
    method dedented, so lines are matched without their leading blanks and re-indented as found."""
    path = os.path.join(work, re.search(r"^--- (\S+)", diff, re.M).group(1))
    lines = open(path).read().split("\n")
    body = diff[diff.index("@@"):].split("\n")
    old = [l[1:] for l in body if l.startswith("-") or l.startswith(" ")]
    new = [l[1:] for l in body if l.startswith("+") or l.startswith(" ")]
    while old and not old[-1].strip() and new and not new[-1].strip():
        old, new = old[:-1], new[:-1]
    for i in range(len(lines) - len(old) + 1):
        if all(lines[i + j].strip() == old[j].strip() for j in range(len(old))):
            shift = len(lines[i]) - len(lines[i].lstrip()) - (len(old[0]) - len(old[0].lstrip()))
            pad = " " * max(shift, 0)
            lines[i:i + len(old)] = [pad + l if l.strip() else l for l in new]
            open(path, "w").write("\n".join(lines))
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
