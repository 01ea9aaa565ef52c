#!/usr/bin/env python3
"""Build every kernel the training runs need, in one parallel nvcc run (no GPU needed):
tests/test_gpu_grad.py's and test_gpu_autograd.py's, bench/train_step.py's and bench/train_llama.py's (its default model).

    EPIC_CACHE_DIR=/tmp/epic-cache python bench/prebuild_training.py [--missing]

--missing: only list the kernels not in the cache yet (a count, then their names).
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT       # not bench/ itself: bench/bench.py would shadow the folder


def units() -> list:
    from bench import train_llama, train_step
    from epic.integrations import programs
    from tests import test_gpu_autograd, test_gpu_grad
    out = list(test_gpu_grad.units()) + list(test_gpu_autograd.units()) + list(train_step.units())
    args = train_llama.parse_args([])
    cfg = train_llama.config(args)
    rows = args.batch * args.seq
    dims = dict(M=rows, E=cfg.hidden_size, D=cfg.hidden_size, F=cfg.intermediate_size, V=cfg.vocab_size)
    for f in (programs.decoder_mlp(float(cfg.rms_norm_eps), "never"), programs.lm_head_loss("never", None, "fused")):
        for prog, counts in train_llama._launches(f, rows, None):
            for m in counts:
                sizes = {k: v for k, v in {**dims, "M": m}.items() if k in prog.program.dims}
                out += [u for _, u in prog.units(sizes)]
    return list({(u.name, u.source): u for u in out}.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--missing", action="store_true")
    args = ap.parse_args()
    from epic.runtime import build
    todo = units()
    missing = [u for u in todo if not build.library_path(u).exists()]
    print(f"{len(todo)} kernels, {len(missing)} not built")
    if args.missing:
        for u in missing:
            print(" ", u.name)
        return 0
    build.build_all(missing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
