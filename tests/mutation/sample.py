#!/usr/bin/env python3
"""A uniform random sample of mutant names from `mutmut results --all true` on stdin:
sample.py N SEED prints N names (sorted), the same for the same mutants (listed in mutmut's order)
and seed."""
import random
import re
import sys


def main() -> None:
    n, seed = int(sys.argv[1]), int(sys.argv[2])
    names = [m.group(1) for line in sys.stdin if (m := re.match(r"\s*(\S+__mutmut_\d+):", line))]
    random.seed(seed)
    print("\n".join(sorted(random.sample(names, min(n, len(names))))))


if __name__ == "__main__":
    main()
