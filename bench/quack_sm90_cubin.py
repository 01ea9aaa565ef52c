"""QuACK's default sm90 GEMM kernel compiled for sm_90a on a machine without a GPU, for reading its SASS
beside epic's (`cuobjdump -sass` of both; docs/PERFORMANCE.md says what the comparison found).

QuACK compiles with the CUTLASS DSL, which needs no GPU to compile. On Python 3.11 or 3.12:

  python -m venv /tmp/qv && /tmp/qv/bin/pip install torch==2.13.0 nvidia-cutlass-dsl==4.8.1 \
      apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 triton einops numpy
  /tmp/qv/bin/pip install --no-deps quack-kernels==0.6.5
  /tmp/qv/bin/python bench/quack_sm90_cubin.py --out /tmp/quack-sass
  cuobjdump -sass /tmp/quack-sass/*.cubin > quack.sass        # cuobjdump from the CUDA toolkit

The kernel is the one `quack.gemm_interface` runs by default at bf16 on sm90 (its "untuned"
configuration in bench/results): pingpong 128x192 tiles, cluster 2x1, static persistent scheduler, no
epilogue inputs. `_compile_gemm` is QuACK's own compile entry (fake tensors, no launch); its
positional arguments are those of quack-kernels 0.6.5.
"""
from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the .ptx and .cubin")
    ap.add_argument("--tile", default="128x192", help="tile M x N (default 128x192)")
    ap.add_argument("--cluster", default="2x1", help="cluster M x N (default 2x1)")
    ap.add_argument("--cooperative", action="store_true", help="cooperative instead of pingpong")
    args = ap.parse_args(argv)
    try:
        tile = tuple(int(v) for v in args.tile.split("x"))
        cluster = tuple(int(v) for v in args.cluster.split("x")) + (1,)
        if len(tile) != 2 or len(cluster) != 3:
            raise ValueError
    except ValueError:
        ap.error("--tile and --cluster take two numbers joined by x, e.g. 128x192")
    # read by the DSL (set before it is imported): the target, and which artifacts to keep where
    os.environ.update(CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=os.path.abspath(args.out))
    try:
        from cutlass import BFloat16
        import quack.gemm as qgemm
    except ImportError as exc:
        print(f"quack_sm90_cubin: {exc}; install QuACK and the CUTLASS DSL as this file's header says",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    compile_gemm = getattr(qgemm._compile_gemm, "__wrapped__", qgemm._compile_gemm)   # past its jit cache
    compile_gemm(
        BFloat16, BFloat16, BFloat16, None,       # a, b, d, c dtypes (no C)
        "k", "k", "n", "n",                       # majors of a, b, d, c
        tile, cluster,
        not args.cooperative,                     # pingpong
        True, False,                              # persistent, not dynamic persistent (sm90's default)
        None, None, 0,                            # no row or column vector
        0, 0, False,                              # alpha, beta modes; add_to_output
        None, False, False, False, False, False,  # concat layout, varlen m/k, gather A, tma gather, batch permute
        (9, 0), 0, 0, None,                       # device capacity, rounding, stochastic-rounding seed, warps
    )
    kept = sorted(f for f in os.listdir(args.out) if f.endswith((".cubin", ".ptx")))
    for name in kept:
        print(os.path.join(args.out, name))
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
