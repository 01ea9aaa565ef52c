"""A gemm's `with ...` options: each value parsed and checked where it is written, so that `epic
check` reports a bad tile or cluster at its location instead of a later build failing."""
from __future__ import annotations

from ..diagnostics import Span, error
from ..ir import options as vocab

_HINTS = {"tile": "tiles are MxNxK with M in 64/128/256, N in 64/128/192/256, K in 64/128, e.g. tile=128x256x64",
          "cluster": "clusters are 1x1, 2x1, 1x2 or 2x2",
          "epi_tile": "the epilogue tile is MxN dividing the CTA tile, e.g. epi_tile=128x64",
          "swizzle": "swizzle is 1, 2, 4 or 8"}


def parse(options: dict[str, tuple[str, Span]], gemm_span: Span) -> dict:
    out: dict = {}
    for key, (text, span) in options.items():
        if key in vocab.SIZE_OPTIONS:
            counts, example = vocab.SIZE_OPTIONS[key]
            parts = text.split("x")
            if len(parts) not in counts or not all(p.isdigit() and len(p) <= 4 for p in parts):
                raise error("E215", f"{key} must look like {example}, got '{text}'", span, _HINTS.get(key))
            value = tuple(int(p) for p in parts) + ((64,) if key == "tile" and len(parts) == 2 else ())
        elif key in vocab.CHOICE_OPTIONS:
            choices = vocab.CHOICE_OPTIONS[key]
            if text not in choices:
                raise error("E215", f"{key} must be one of {', '.join(choices)}, got '{text}'", span)
            value = int(text) if key == "swizzle" else text
        else:
            raise error("E215", f"unknown gemm option '{key}'", span, "options: " + ", ".join(vocab.ALL_OPTIONS))
        problem = vocab.value_problem(key, value)
        if problem:
            raise error("E215", problem, span, _HINTS.get(key))
        out[key] = value
    if "tile" in out and ("schedule" in out or "epi_tile" in out):
        schedule = out.get("schedule", "cooperative" if out["tile"][0] >= 128 else "pingpong")
        problems = vocab.combination_problems(schedule, out["tile"], out.get("epi_tile"))
        if problems:
            where = options.get("schedule", options.get("epi_tile", options["tile"]))[1]
            raise error("E216", "; ".join(problems), where,
                        "pick another tile or schedule (cooperative: tile M 128/256; pingpong: 64/128)")
    return out
