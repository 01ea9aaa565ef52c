"""How a call launches its kernels, one after another on the caller's stream.

A gemm of at most DEPENDENT_ROWS rows is launched as a programmatic dependent (CUDA's programmatic
stream serialization) of the kernel before it on the stream: the call's previous kernel, or, for the
gemm of a program with one gemm, the caller's last kernel (in a decode step often another program's;
first_is_dependent(); EPIC_DEPENDENT_FIRST=0 launches it in stream order). It becomes resident and
runs its prologue while that kernel finishes, and waits in its producer warps (griddepcontrol.wait:
until the kernel before it has finished and its writes are visible) before any global memory access.
Meanwhile it asks L2 for its first tile's B (templates/nodes/epic_nodes/l2_prefetch_mainloop.hpp), a
hint that loads nothing into the SM. Split-K gemms (built without griddepcontrol) and the vendor's
gemms are launched in stream order; combine kernels are always dependents of their gemm
(templates/combine.cu.j2).
EPIC_DEPENDENT_LAUNCH=0 and EPIC_DEPENDENT_PREFETCH=0 switch the two off. The flags reach the kernel
as sizes[6] (templates/gemm.cu.j2)."""
from __future__ import annotations

from .. import envflags

# One row of decode tiles. At M = 64 the pre-norm first half read 0.987-0.993 of its GEMMs against
# 1.032-1.035 launched in order, the MLP block 0.965-0.969 against 0.996-1.003; at M = 256 they read
# 1.284 against 1.088 and 1.213 against 1.099, at M = 8192 the MLP block 1.027 against 0.989
# (bench/results/2026-12-04-h200-interleaved-dependent-launch.log).
DEPENDENT_ROWS = 64
# Which programs' first gemm is a dependent of the caller's last kernel: "one-gemm" (programs with one
# gemm), "all", "none"; None: EPIC_DEPENDENT_FIRST decides (unset or 1: "one-gemm", 0: "none").
# bench/interleaved.py's labels `first`, `firstall` and `infirst` set it. Back to back at M = 64,
# one-gemm programs read 1.168 of cuBLAS as dependents against 1.247 in order; chains were slower as
# dependents (the MLP block x 4 1.103 against 0.989)
# (bench/results/2026-12-04-h200-interleaved-first-dependent.log). The GPU test that writes the
# operand just before the call (tests/test_gpu.py, test_a_decode_call_waits_...) passed on 2026-12-05,
# and so did the whole GPU suite with the rule on (bench/results/2026-12-05-h200-gpu-suite-first.log).
FIRST_DEPENDENT = None
PROGRAMMATIC, PREFETCH_B = 1, 2


def first_is_dependent(one_gemm: bool) -> bool:
    """Whether a program's first gemm is a dependent of the caller's last kernel (FIRST_DEPENDENT)."""
    rule = FIRST_DEPENDENT
    if rule is None:
        rule = "one-gemm" if envflags.enabled("EPIC_DEPENDENT_FIRST", True) else "none"
    return rule == "all" or (rule == "one-gemm" and one_gemm)


def has_one_gemm(program) -> bool:
    """gemm_flags' one_gemm for this program's gemms."""
    return sum(k.kind == "gemm" for k in program.kernels) == 1


def gemm_flags(after_another: bool, rows: int, config, one_gemm: bool = False) -> int:
    """The launch flags of an epic gemm of `rows` rows with this KernelConfig; after_another: a kernel
    of the same call is launched before it (else the gemm opens the call); one_gemm: the program's only
    gemm."""
    if rows > DEPENDENT_ROWS or config.split_k or config.vendor:
        return 0
    if not after_another and not first_is_dependent(one_gemm):
        return 0
    if not envflags.enabled("EPIC_DEPENDENT_LAUNCH", True):
        return 0
    # the prefetch takes the CTA's index for its first tile's column block: true with one row of tiles
    prefetch = rows <= config.tile_m and envflags.enabled("EPIC_DEPENDENT_PREFETCH", True)
    return PROGRAMMATIC | (PREFETCH_B if prefetch else 0)


def describe(flags: int, previous: str | None, b: str) -> str | None:
    """What `epic plan` says about a gemm's launch (None: launched in stream order); previous: the
    call's kernel before it, None for the call's first."""
    if not flags & PROGRAMMATIC:
        return None
    return ((f"launched as {previous}'s programmatic dependent" if previous else
             "launched as a programmatic dependent of the caller's last kernel on the stream")
            + (f"; asks L2 for its first tile's {b} while it waits" if flags & PREFETCH_B else ""))
