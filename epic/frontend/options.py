"""A gemm's `with ...` options: each value parsed and checked where it is written, so that `epic
check` reports a bad tile or cluster at its location instead of a later build failing."""
from __future__ import annotations

from ..diagnostics import Span, error
from ..ir import options as vocab


def _listed(values) -> str:
    words = [str(v) if not isinstance(v, tuple) else "x".join(map(str, v)) for v in values]
    return ", ".join(words[:-1]) + " or " + words[-1]


# what a refused value of an option is told (else the choices); the lists come from epic/ir/options.py, so
# that they cannot drift from what it accepts
_HINTS = {"tile": (f"tiles are MxNxK with M in {'/'.join(map(str, vocab.TILE_M))}, N in "
                   f"{'/'.join(map(str, vocab.TILE_N))} (32 only for a gemm that stores its accumulator alone or "
                   f"takes combine=tail), K in {'/'.join(map(str, vocab.TILE_K))}, e.g. tile=128x256x64"),
          "cluster": f"clusters are {_listed(vocab.CLUSTERS)}",
          "epi_tile": "the epilogue tile is MxN dividing the CTA tile, e.g. epi_tile=128x64",
          "splits": f"splits is {_listed(vocab.SPLITS)} (split-K, cooperative schedule only), e.g. splits=4",
          "accumulate": "accumulate=f16 (f16 or fp8 operands) or accumulate=f32 (the default)",
          "b_major": "b_major=n: the inline B operand [K, N] is row-major (N contiguous: pass a weight W [K, N] "
                     "as it is); b_major=k (the default): K contiguous (pass an nn.Linear weight [N, K] as W.t())"}


def parse(options: dict[str, tuple[str, Span]], gemm_span: Span) -> dict:
    out = {key: parse_value(key, text, span) for key, (text, span) in options.items()}
    if "epi_tile" in out and "tile" not in out:
        raise error("E215", "epi_tile needs tile: the epilogue tile must divide the CTA tile, which without "
                    "`tile=` depends on the row count and the epilogue's shared memory", options["epi_tile"][1],
                    "fix both, e.g. with tile=128x256x64, epi_tile=128x64")
    if "tile" in out and ("schedule" in out or "epi_tile" in out) or out.get("splits", 1) > 1:
        tile = out.get("tile", (128, 128, 64))
        default = "cooperative" if tile[0] >= 128 or out.get("splits", 1) > 1 else "pingpong"
        schedule = out.get("schedule", default)
        problems = vocab.combination_problems(schedule, tile, out.get("epi_tile"), out.get("splits", 1))
        if problems:
            where = options.get("schedule", options.get("epi_tile", options.get("tile", options.get("splits"))))[1]
            raise error("E216", "; ".join(problems), where,
                        "pick another tile or schedule (cooperative: tile M 128/256; pingpong: 64/128; "
                        "splits > 1: cooperative)")
    return out


def parse_value(key: str, text: str, span: Span | None):
    """One option's value from its spelling (128x256x64, pingpong, 8), checked on its own."""
    if key in vocab.SIZE_OPTIONS:
        counts, example = vocab.SIZE_OPTIONS[key]
        parts = text.split("x")
        if len(parts) not in counts or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts):
            raise error("E215", f"{key} must look like {example}, got '{text}'", span, _HINTS.get(key))
        value = tuple(int(p) for p in parts) + ((64,) if key == "tile" and len(parts) == 2 else ())
    elif key in vocab.CHOICE_OPTIONS or key in vocab.SEMANTIC_OPTIONS:
        choices = vocab.CHOICE_OPTIONS.get(key) or vocab.SEMANTIC_OPTIONS[key]
        if text not in choices:
            raise error("E215", f"{key} must be one of {', '.join(choices)}, got '{text}'", span,
                        _HINTS.get(key) or f"write {key}={choices[0]}; the choices are {', '.join(choices)}")
        value = int(text) if key in vocab.INT_OPTIONS else text
    else:
        raise error("E215", f"unknown gemm option '{key}'", span, "options: " + ", ".join(vocab.ALL_OPTIONS))
    problem = vocab.value_problem(key, value)
    if problem:
        raise error("E215", problem, span, _HINTS.get(key))
    return value


def check_config(config, gemms: dict[str, Span | None]) -> dict[str, dict]:
    """The per-gemm overrides of epic.compile(path, config={"g": {"tile": (128, 128, 64)}}), checked
    like the file's options and normalized (tuples of ints, swizzle and splits ints): an unknown gemm or option,
    or a value of the wrong type or range, is an E215 (the combination is checked when the plan is made)."""
    if config is None:
        return {}
    example = 'config={"g": {"tile": (128, 128, 64), "schedule": "cooperative"}}'
    if not isinstance(config, dict):
        raise error("E215", f"config must be a dict of gemm name -> options, got {type(config).__name__}", None,
                    example)
    out: dict[str, dict] = {}
    for name, opts in config.items():
        if name not in gemms:
            raise error("E215", f"config names no gemm of the program: {name!r}", None,
                        "its gemms are " + ", ".join(gemms))
        if not isinstance(opts, dict):
            raise error("E215", f"config[{name!r}] must be a dict of options, got {type(opts).__name__}", gemms[name],
                        example)
        out[name] = {}
        for key, value in opts.items():
            if key in vocab.SEMANTIC_OPTIONS:
                raise error("E215", f"config[{name!r}] sets {key!r}, which changes what the gemm computes, not how "
                            "fast", gemms[name], f"write it in the file: gemm {name}(...) with {key}=...")
            if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                text = "x".join(map(str, value))
            elif isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
                text = str(value)
            else:
                text = repr(value)
            out[name][key] = parse_value(str(key), text, gemms[name])
    return out
