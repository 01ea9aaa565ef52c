"""QuACK beside its copy that gives TMA loads CUTLASS's L2 policy (bench/quack_variant.py), in one
interleaved run of the peer harness: each QuACK candidate is timed twice per round, as `quack` (its
policy 0) and `quack-evn` (EVICT_NORMAL, as epic's loads). If `quack-evn` reads slower than `quack`,
the policy is (part of) QuACK's lead at M = 8192.

  python bench/quack_variant.py --into /tmp/qev
  PYTHONPATH=/tmp/qev:$PYTHONPATH python bench/quack_policy_ab.py --harness ../shared/anchors/peer_interleaved.py \\
      --proj . --work plain_gate_up_k1024,plain_gate_up,bias_gelu,swiglu --rows 8192 --rounds 150 --no-liger

Every argument but --harness goes to the harness.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types

VARIANT = "quack_ev"


def doubled(candidates, variant):
    """The harness's quack_candidates(Q, ...) with the same candidates of the variant namespace appended,
    labelled quack-evn."""
    def both(Q, name, inputs, graphed, notes):
        out = list(candidates(Q, name, inputs, graphed, notes))
        for label, fn, check in candidates(variant, name, inputs, graphed, notes):
            out.append((label.replace("quack", "quack-evn", 1), fn, check))
        return out
    return both


def variant_namespace():
    """The functions the harness calls on QuACK, from the renamed copy."""
    gi = importlib.import_module(f"{VARIANT}.gemm_interface")
    lce = importlib.import_module(f"{VARIANT}.linear_cross_entropy")
    lib = importlib.import_module(f"{VARIANT}.epilogue.library")
    rot = importlib.import_module(f"{VARIANT}.epilogue.rotary")
    return types.SimpleNamespace(gemm=gi.gemm, gemm_act=gi.gemm_act, gemm_rms=gi.gemm_rms,
                                 gemm_norm_act=gi.gemm_norm_act,
                                 chunked_linear_cross_entropy=lce.chunked_linear_cross_entropy,
                                 lse_target_epi=lib.lse_target_epi, rope_posfreq_epi=rot.rope_posfreq_epi,
                                 make_interleaved_inv_freq=rot.make_interleaved_inv_freq)


def main(argv: list[str]) -> int:
    if "--harness" not in argv or argv.index("--harness") + 1 >= len(argv):
        print("usage: quack_policy_ab.py --harness PATH/peer_interleaved.py [the harness's arguments]",
              file=sys.stderr)
        return 2
    i = argv.index("--harness")
    path, rest = argv[i + 1], argv[:i] + argv[i + 2:]
    try:
        variant = variant_namespace()
    except ImportError as exc:
        print(f"quack_policy_ab: {exc}; make the copy with bench/quack_variant.py and put its folder on "
              "PYTHONPATH", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("peer_interleaved", path) if os.path.isfile(path) else None
    if spec is None:
        print(f"quack_policy_ab: no harness at {path}", file=sys.stderr)
        return 2
    harness = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = harness
    spec.loader.exec_module(harness)
    harness.quack_candidates = doubled(harness.quack_candidates, variant)
    sys.argv = [path] + rest
    return harness.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
