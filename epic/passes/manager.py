"""The pass manager: named passes in a fixed, documented order, each dumpable (`epic ir --after`).

Each pass declares what it needs (`requires`, names some earlier pass ensured) and what it
guarantees (`ensures`, checked by epic/passes/ensures.py). With EPIC_VERIFY set (the test suite
sets it) the manager verifies the IR (epic/ir/verify.py) and every guarantee made so far after each
pass. The passes, in the order they run:
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import envflags
from ..checks import locality
from ..diagnostics import EpicError
from ..ir import verify as ir_verify
from . import block_quant, cse, dce, defer_row_scale, ensures, hoist_block_scale, simplify, split_reductions


@dataclass(frozen=True)
class Pass:
    name: str
    summary: str
    run: Callable          # (program, trace: list[str] | None) -> program
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()
    gate: Callable | None = None   # program -> diagnostics that stop compilation before this pass


@dataclass
class Stage:
    name: str
    program: object
    trace: list[str]       # what the pass did where (simplify: the rules that fired)


MAX_CLEANUP_ROUNDS = 8


def _cleanup(program, trace=None):
    """simplify + cse + dce until nothing changes (cse can expose a rule, e.g. select(c, x, x))."""
    from ..ir.dump import to_text
    for _ in range(MAX_CLEANUP_ROUNDS):
        before = to_text(program)
        program = dce.run(cse.run(simplify.run(program, trace)))
        if to_text(program) == before:
            break
    return program


PASSES = [
    Pass("simplify", "fold constants, apply algebraic identities, drop redundant casts", simplify.run,
         ensures=("canonical",)),
    Pass("cse", "merge structurally equal values", cse.run, ensures=("no-duplicates",)),
    Pass("dce", "drop values and tensors nothing stores or reads", dce.run, ensures=("no-dead-values",)),
    Pass("defer-row-scale", "move per-row scales (RMSNorm's 1/rms) into the next gemm's epilogue",
         defer_row_scale.run, requires=("no-dead-values",), ensures=("row-scales-deferred",)),
    Pass("split-reductions", "whole-row/column reductions -> per-tile partials + combine kernels",
         split_reductions.run, requires=("row-scales-deferred",), ensures=("tile-local-gemms",),
         gate=locality.check),
    Pass("hoist-block-scale", "move a per-block scale (QK-norm's 1/rms per head) to the stored value",
         hoist_block_scale.run, requires=("tile-local-gemms",), ensures=("block-scales-hoisted",)),
    Pass("block-quant", "recognise block quantization (x / its 1xB block scale, in any spelling) as one op",
         block_quant.run, requires=("block-scales-hoisted",), ensures=("block-quants-made",)),
    Pass("cleanup", "simplify + cse + dce on the final kernels, until nothing changes", _cleanup,
         ensures=("canonical", "no-duplicates", "no-dead-values")),
]

__doc__ += "\n".join(f"  {i + 1}. {p.name:<18} {p.summary}" for i, p in enumerate(PASSES))

# Guarantees a later pass may undo; the others hold from the pass that makes them to the end.
_FRAGILE = {"canonical", "no-duplicates", "no-dead-values"}


def pass_names() -> list[str]:
    return [p.name for p in PASSES]


def verifying() -> bool:
    return envflags.enabled("EPIC_VERIFY")


def run_all(program, stop_after: str | None = None, verify: bool | None = None) -> list[Stage]:
    """Run the passes in order; returns a Stage per pass, stopping after `stop_after`."""
    verify = verifying() if verify is None else verify
    if verify:
        ir_verify.verify(program)
    stages: list[Stage] = []
    held: set[str] = set()
    for p in PASSES:
        missing = [r for r in p.requires if r not in held]
        assert not missing, f"pass {p.name} needs {missing}"   # the order above guarantees it
        if p.gate is not None:
            diags = p.gate(program)
            if diags:
                raise EpicError(diags)
        trace: list[str] = []
        program = p.run(program, trace)
        held = {e for e in held if e not in _FRAGILE} | set(p.ensures)
        if verify:
            ir_verify.verify(program, f"pass {p.name}", ensures.check(program, tuple(sorted(held))))
        stages.append(Stage(p.name, program, trace))
        if p.name == stop_after:
            break
    return stages
