"""Proof on the oracle: the rewritten program computes what the source program computes.

`equivalence` runs both through the reference interpreter in exact float64 (per-tile partials
with the plan's tile sizes) and returns the relative error of every output. `compare_report`
measures, with every stored value rounded to its dtype as kernels do, how far the source form and
the rewritten form each land from exact float64 (the seed article claims deferring RMSNorm's
row scale is at least as accurate).
"""
from __future__ import annotations

import torch

from .. import reference
from .planner import make_plan


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    denom = want.norm().item()
    diff = (got - want).norm().item()
    return diff / denom if denom > 0 else diff


def equivalence(analysis, inputs, sizes, tiles=None) -> dict[str, float]:
    if tiles is None:
        tiles = make_plan(analysis.program, sizes).tiles()
    want = reference.run(analysis.source_program, inputs, exact=True, sizes=sizes)
    got = reference.run(analysis.program, inputs, exact=True, sizes=sizes, tiles=tiles)
    return {name: rel_error(got[name], want[name]) for name in want}


def rounding_errors(analysis, inputs, sizes) -> dict[str, tuple[float, float]]:
    """name -> (error of the source form, error of the rewritten form), both against exact float64."""
    tiles = make_plan(analysis.program, sizes).tiles()
    exact = reference.run(analysis.source_program, inputs, exact=True, sizes=sizes)
    source = reference.run(analysis.source_program, inputs, exact=False, sizes=sizes)
    rewritten = reference.run(analysis.program, inputs, exact=False, sizes=sizes, tiles=tiles)
    return {n: (rel_error(source[n], exact[n]), rel_error(rewritten[n], exact[n])) for n in exact}


def compare_report(analysis, inputs, sizes) -> str:
    eq = equivalence(analysis, inputs, sizes)
    rounded = rounding_errors(analysis, inputs, sizes)
    lines = ["", "rewritten plan vs source program (relative error, ||got - want|| / ||want||):",
             f"  {'output':<12} {'exact f64':>12} {'source, dtype-rounded':>24} {'rewritten, dtype-rounded':>26}"]
    for name in eq:
        src, rew = rounded[name]
        lines.append(f"  {name:<12} {eq[name]:>12.2e} {src:>24.3e} {rew:>26.3e}")
    return "\n".join(lines)
