"""The pass manager: named passes in a fixed, documented order, each dumpable (`epic ir --after`).

Each pass declares what it needs and what it guarantees; the manager runs them in this order:
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import cse, dce, defer_row_scale, simplify, split_reductions


@dataclass(frozen=True)
class Pass:
    name: str
    summary: str
    run: Callable
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()


PASSES = [
    Pass("simplify", "fold constants, apply algebraic identities, drop redundant casts", simplify.run,
         ensures=("canonical",)),
    Pass("cse", "merge structurally equal values", cse.run, ensures=("no-duplicates",)),
    Pass("dce", "drop values and tensors nothing stores or reads", dce.run, ensures=("no-dead-values",)),
    Pass("defer-row-scale", "move per-row scales (RMSNorm's 1/rms) into the next gemm's epilogue",
         defer_row_scale.run, requires=("canonical",), ensures=("row-scales-deferred",)),
    Pass("split-reductions", "whole-row/column reductions -> per-tile partials + combine kernels",
         split_reductions.run, requires=("row-scales-deferred",), ensures=("tile-local-gemms",)),
    Pass("cleanup", "simplify + cse + dce on the final kernels",
         lambda p: dce.run(cse.run(simplify.run(p))), ensures=("canonical", "no-duplicates", "no-dead-values")),
]

__doc__ += "\n".join(f"  {i + 1}. {p.name:<18} {p.summary}" for i, p in enumerate(PASSES))


def pass_names() -> list[str]:
    return [p.name for p in PASSES]


def run_all(program, stop_after: str | None = None) -> list[tuple[str, object]]:
    """Run the passes in order; returns [(pass name, program after it)], stopping after `stop_after`."""
    stages = []
    done: set[str] = set()
    for p in PASSES:
        missing = [r for r in p.requires if r not in done]
        assert not missing, f"pass {p.name} needs {missing}"   # the order above guarantees it
        program = p.run(program)
        done.update(p.ensures)
        stages.append((p.name, program))
        if p.name == stop_after:
            break
    return stages
