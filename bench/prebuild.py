"""Build every kernel bench/bench.py needs (default configurations for M = 64 and 8192, plus the
configurations given) into $EPIC_CACHE_DIR, on a CPU machine:
    EPIC_CACHE_DIR=.epic-cache python bench/prebuild.py [--configs coop_128x256x64_c2x1,...]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402
from epic.codegen import emit  # noqa: E402
from epic.diagnostics import EpicError  # noqa: E402
from epic.runtime import build, fastcall  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (DIMS, ROOT, WORK, allow_tile_widths, combine_rows, combine_rows_label, nodes_from,  # noqa: E402
                   combine_variant, gemm_overrides, parse_config, variant_list)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="")
    ap.add_argument("--work", default=",".join(WORK))
    ap.add_argument("--rows", default="8192,64")
    ap.add_argument("--tile-widths", default="", help="also tiles of these widths (bench.py's allow_tile_widths)")
    ap.add_argument("--nodes-from", default=None, help="also the default configurations generated with the custom "
                    "node headers in this directory (bench/interleaved.py's --nodes-from)")
    ap.add_argument("--combine-rows", default="", help="also the default configurations with the grouped combine "
                    "kernels at these rows per warp from the first row on, RxF: and F loads in flight per lane "
                    "(bench/interleaved.py's rowsR, rowsRxF labels)")
    ap.add_argument("--combine-variants", type=variant_list, default=[], help="also the default configurations with these "
                    "combine variants (bench/interleaved.py's unfused, unpicked labels)")
    args = ap.parse_args()
    if args.tile_widths:
        allow_tile_widths(args.tile_widths)
    units = {}
    for name in args.work.split(","):
        prog = epic.compile(os.path.join(ROOT, WORK[name][0]))
        for m in (int(r) for r in args.rows.split(",")):
            variants = [None] + [parse_config(c) for c in filter(None, args.configs.split(","))]
            for cfg in variants:
                overrides = gemm_overrides(prog.program, cfg) if cfg else None
                try:        # the device may be an H100 or an H200: both heuristics' kernels
                    built = emit.units_for_gpus(prog.program, m, overrides, DIMS[name](m))
                except EpicError as e:         # a configuration this program cannot take (bench.py records why)
                    print(f"skipped {name} M={m} {cfg}: {str(e).splitlines()[0]}")
                    continue
                for _, u in built:
                    units[(u.name, u.source)] = u
            variants = ([nodes_from(args.nodes_from)] if args.nodes_from else []) + \
                [combine_rows(*combine_rows_label(f"rows{r}")) for r in filter(None, args.combine_rows.split(","))] + \
                [combine_variant(v) for v in args.combine_variants]
            for variant in variants:
                with variant:       # compiled anew: a variant may change the passes (unpicked)
                    other = epic.compile(os.path.join(ROOT, WORK[name][0])).program
                    for _, u in emit.units_for_gpus(other, m, None, DIMS[name](m)):
                        units[(u.name, u.source)] = u
    fastcall.start(warn=False)          # the compiled call path's launcher, beside nvcc
    for p in build.build_all(list(units.values())):
        print(p)
    print(fastcall.library() or f"no compiled call path: {fastcall.why_not()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
