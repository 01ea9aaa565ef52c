"""QuACK beside copies of it made more like epic's kernel (bench/quack_variant.py), in one interleaved run
of the peer harness: each QuACK candidate is timed once per round as itself (`quack`) and once per copy
(`quack-LABEL`). A copy that reads slower than `quack` has found (part of) QuACK's lead over epic at
M = 8192.

  python bench/quack_variant.py --into /tmp/qv --name quack_ev --change policy
  python bench/quack_variant.py --into /tmp/qv --name quack_lin --change linear
  PYTHONPATH=/tmp/qv:$PYTHONPATH python bench/quack_variants_ab.py --variant quack_ev:evn --variant quack_lin:lin \\
      --harness ../shared/anchors/peer_interleaved.py \\
      --proj . --work plain_gate_up_k1024,plain_gate_up,bias_gelu,swiglu --rows 8192 --rounds 150 --no-liger

--epic CONFIG[:LABEL] (repeatable) adds epic with that kernel configuration on every gemm (bench/bench.py's
spelling: `serp` is tile_order=serpentine), labelled epic-LABEL (the label defaults to CONFIG), to the same
rounds: the A/B from epic's side, e.g. `--variant quack_lin:lin --epic serp`.

--variant PACKAGE[:LABEL], --epic and --harness are this script's; every other argument goes to the harness.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

def with_variants(candidates, variants, epics=()):
    """The harness's quack_candidates(Q, ...) followed by the same candidates of each (label, namespace)
    in `variants`, labelled quack-LABEL, then one candidate per maker in `epics` (epic_candidate)."""
    def all_of_them(Q, name, inputs, graphed, notes):
        out = list(candidates(Q, name, inputs, graphed, notes))
        for tag, ns in variants:
            for label, fn, check in candidates(ns, name, inputs, graphed, notes):
                out.append((label.replace("quack", f"quack-{tag}", 1), fn, check))
        out += [make(name, inputs) for make in epics]
        return out
    return all_of_them


def epic_candidate(config: str, label: str):
    """A maker of the candidate epic-LABEL: the workload's program with `config` (bench.py's spelling) on
    every gemm, called on the harness's inputs; its check compares its first output with the default
    kernel's (the harness's `epic`)."""
    def make(name, inputs):
        built = []

        def fn():
            # compiled on the first call, which the harness makes inside its guard: a configuration the
            # program refuses is noted against this candidate instead of ending the run
            if not built:
                import epic
                bench = importlib.import_module("bench")       # the harness put the checkout's bench/ on sys.path
                path = os.path.join(bench.ROOT, bench.WORK[name][0])
                gemms = [k.name for k in epic.compile(path).program.kernels if k.kind == "gemm"]
                built.append(epic.compile(path, config={g: bench.parse_config(config) for g in gemms}))
            return built[0](**inputs)

        def check():
            out = fn()
            key = next(iter(out))
            return out[key], key
        return (f"epic-{label}", fn, check)
    return make


def variant_namespace(package: str):
    """The functions the harness calls on QuACK, from a renamed copy."""
    gi = importlib.import_module(f"{package}.gemm_interface")
    lce = importlib.import_module(f"{package}.linear_cross_entropy")
    lib = importlib.import_module(f"{package}.epilogue.library")
    rot = importlib.import_module(f"{package}.epilogue.rotary")
    return types.SimpleNamespace(gemm=gi.gemm, gemm_act=gi.gemm_act, gemm_rms=gi.gemm_rms,
                                 gemm_norm_act=gi.gemm_norm_act,
                                 chunked_linear_cross_entropy=lce.chunked_linear_cross_entropy,
                                 lse_target_epi=lib.lse_target_epi, rope_posfreq_epi=rot.rope_posfreq_epi,
                                 make_interleaved_inv_freq=rot.make_interleaved_inv_freq)


def _take(argv: list[str], flag: str) -> tuple[list[str], list[str]]:
    """(values of every `flag VALUE` in argv, argv without them)."""
    values, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return values, rest


def main(argv: list[str]) -> int:
    harness_paths, rest = _take(argv, "--harness")
    wanted, rest = _take(rest, "--variant")
    epic_configs, rest = _take(rest, "--epic")
    if len(harness_paths) != 1 or not (wanted or epic_configs):
        print("usage: quack_variants_ab.py --variant PACKAGE[:LABEL] [--variant ...] [--epic CONFIG[:LABEL] ...] "
              "--harness PATH/peer_interleaved.py "
              "[the harness's arguments]", file=sys.stderr)
        return 2
    epics = [epic_candidate(c.partition(":")[0], c.partition(":")[2] or c.partition(":")[0]) for c in epic_configs]
    path = harness_paths[0]
    try:
        variants = [(w.partition(":")[2] or w.partition(":")[0].removeprefix("quack_"),
                     variant_namespace(w.partition(":")[0])) for w in wanted]
    except ImportError as exc:
        print(f"quack_variants_ab: {exc}; make the copy with bench/quack_variant.py and put its folder on "
              "PYTHONPATH", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("peer_interleaved", path) if os.path.isfile(path) else None
    if spec is None:
        print(f"quack_variants_ab: no harness at {path}", file=sys.stderr)
        return 2
    harness = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = harness
    spec.loader.exec_module(harness)
    harness.quack_candidates = with_variants(harness.quack_candidates, variants, epics)
    sys.argv = [path] + rest
    return harness.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
