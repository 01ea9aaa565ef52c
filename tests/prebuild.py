"""Build, on a CPU machine, every kernel the GPU tests and the benchmark need, into the cache
($EPIC_CACHE_DIR): `EPIC_CACHE_DIR=.epic-cache python -m tests.prebuild`. The device run then
carries .epic-cache and builds nothing (docs/GPU.md)."""
import sys

import epic
from epic.codegen import emit
from epic.runtime import build

from .gpu_cases import PROGRAMS, SPLIT_CASES, path, split_k_config

EXTRA = ["bench/programs/plain.epi"]
ROWS = (64, 8192)      # the two configurations: small M (pingpong) and large M (cooperative)


def main() -> int:
    units = []
    for name in list(PROGRAMS) + EXTRA:
        prog = epic.compile(path(name))
        for m in ROWS:
            units += [u for _, u in emit.units(prog.program, emit.kernel_configs(prog.program, m))]
        for m, _, _ in (size for case, size in SPLIT_CASES if case == name):
            configs = emit.kernel_configs(prog.program, m, split_k_config(prog.program))
            units += [u for _, u in emit.units(prog.program, configs)]
    unique = {u.name + str(hash(u.source)): u for u in units}
    for p in build.build_all(list(unique.values())):
        print(p)
    from epic.runtime import fastcall
    print(fastcall.library() or f"no compiled call path: {fastcall.why_not()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
