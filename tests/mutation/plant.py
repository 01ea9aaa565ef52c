#!/usr/bin/env python3
"""Plant mutants by hand: for code that runs when its module is imported (rule tables built at
import), mutmut's switch comes too late, so its mutants "survive" untested. This applies each named
mutant's diff (`mutmut show`, run in MUTMUT_DIR) to a fresh copy of the source and runs the tests.

  tests/mutation/plant.py MUTMUT_DIR TESTS... -- NAME...

Prints one line per mutant: killed (a test failed) or SURVIVED.
"""
import os
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
            patch = subprocess.run(["patch", "-p0", "-s"], cwd=work, input=diff[diff.index("---"):], text=True)
            if patch.returncode:
                print(f"{name}: the diff does not apply")
                continue
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                                "not nvcc and not gpu", *tests], cwd=work, capture_output=True, text=True)
            killed = r.returncode != 0
            survived += not killed
            print(f"{name}: {'killed' if killed else 'SURVIVED'}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
