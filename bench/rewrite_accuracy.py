"""Is the deferred row scale at least as accurate? (issue: measure the seed article's claim)

For the pre-norm chain, run the source program and the rewritten plan through the reference
interpreter with every stored value rounded to its dtype (as kernels do), and compare both with
exact float64. Prints per-size medians over seeds; CPU only.
    python bench/rewrite_accuracy.py [--seeds 8]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from epic import pipeline, reference  # noqa: E402
from epic.plan import verify  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [("samples/prenorm_mlp.epi", "y", dict(M=64, D=512, F=384)),
         ("samples/prenorm_mlp.epi", "y", dict(M=64, D=2048, F=1024)),
         ("bench/programs/prenorm_half.epi", "gu", dict(M=64, D=512, F=384)),
         ("bench/programs/prenorm_half.epi", "gu", dict(M=64, D=2048, F=1024)),
         ("bench/programs/prenorm_half_f32.epi", "gu", dict(M=64, D=512, F=384)),
         ("bench/programs/prenorm_half_f32.epi", "gu", dict(M=64, D=2048, F=1024))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    print(f"{'program':<38}{'sizes':<24}{'output':<8}{'source err':>12}{'rewritten err':>15}{'rewritten better':>18}")
    for path, out, sizes in CASES:
        a = pipeline.analyze(os.path.join(ROOT, path))
        src, rew = [], []
        for seed in range(args.seeds):
            inputs = reference.random_inputs(a.source_program, sizes, seed)
            s, r = verify.rounding_errors(a, inputs, sizes)[out]
            src.append(s)
            rew.append(r)
        better = sum(r <= s for s, r in zip(src, rew))
        size = ",".join(f"{k}={v}" for k, v in sizes.items())
        print(f"{path:<38}{size:<24}{out:<8}{statistics.median(src):>12.4e}{statistics.median(rew):>15.4e}"
              f"{better:>12}/{len(src)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
