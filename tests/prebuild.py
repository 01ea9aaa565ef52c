"""Build, on a CPU machine, every kernel the GPU tests and the benchmark need, into the cache
($EPIC_CACHE_DIR): `EPIC_CACHE_DIR=.epic-cache python -m tests.prebuild [--all] [--shard K/N] [PROGRAM ...]`
(programs as tests/gpu_cases.py names them: only theirs; --all: the derived-backward and autograd
tests' kernels too, in the same parallel batch, so no core idles between three batches' tails; --shard:
the K-th of N fixed parts of the kernels, so a CPU machine can build some while the device builds the
rest; --pack FILE: also write those kernels' cache entries to FILE, an xz tar named relative to the
cache folder, to carry to the other machine and unpack into its cache with `tar xJf FILE -C DIR`).
The device run then carries .epic-cache and builds nothing (docs/GPU.md)."""
import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import epic
from epic.codegen import emit
from epic.runtime import build

from .gpu_cases import (CLUSTER_1X2_CASE, DYNAMIC_CASES, SPLIT_LAST_CASES, H100_TILE, H100_TILE_CASES, LOAD_HINT_CASES, MANY_ROWS_SIZES,
                        PROGRAMS, SERPENTINE_CASES, SHORT_A_CASES, SIZES, SPLIT_BLOCK_CASES, SPLIT_BLOCKS, SPLIT_CASES, TAIL_SIZES, cluster_1x2_config, fold_config, folds,
                        gemm_options, groups_rows, own_size_cases, path, split_k_config, tail_config)

# the benchmark's identity epilogue, at its square shape (bench/prebuild.py builds the rest)
EXTRA = {"bench/programs/plain.epi": lambda m, n, k: dict(M=m, K=4096, N=4096)}
ROWS = (64, 8192)


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"{text!r}: write K/N with 1 <= K <= N, e.g. 1/3")
    return int(k), int(n)


def in_shard(unit, shard: tuple[int, int]) -> bool:
    """Whether a kernel is in part K of N: by a hash of its name and source, so a part keeps its
    kernels when others are added."""
    k, n = shard
    digest = hashlib.sha256((unit.name + "\0" + unit.source).encode()).digest()
    return int.from_bytes(digest[:8], "big") % n == k - 1


def all_units(only: list[str], training: bool) -> list:
    """Every kernel unit the GPU tests run (only: these programs'; training: the derived-backward and
    autograd tests' too), duplicates included."""
    units = []
    table = {**PROGRAMS, **EXTRA}
    # (program, sizes, variant); each case at its own sizes: the tile width depends on N
    cases = [(name, table[name](*size), None) for name in PROGRAMS for size in SIZES] + \
        [(name, table[name](*size), "many_rows") for name in PROGRAMS for size in MANY_ROWS_SIZES] + \
        [(name, table[name](m, 0, 0), None) for name in EXTRA for m in ROWS] + \
        [(name, table[name](*size), "split") for name, size in SPLIT_CASES] + \
        [(CLUSTER_1X2_CASE[0], table[CLUSTER_1X2_CASE[0]](*CLUSTER_1X2_CASE[1]), "cluster")] + \
        [(name, table[name](*size), "fold") for name in PROGRAMS for size in SIZES] + \
        [(name, table[name](*size), "tail") for name in PROGRAMS for size in TAIL_SIZES] + \
        [(name, table[name](*size), ("options", {"tile_order": "serpentine", **extra}))
         for name, size, extra in SERPENTINE_CASES] + \
        [(name, table[name](*size), ("options", {"tile_order": "dynamic", **extra}))
         for name, size, extra in DYNAMIC_CASES] + \
        [(name, table[name](*size), ("options", {"tile_order": "linear", **extra}))
         for name, size, extra in DYNAMIC_CASES] + \
        [(name, table[name](*size), ("options", {"tile_order": "split_last", **extra}))
         for name, size, extra in SPLIT_LAST_CASES] + \
        [(name, table[name](*size), ("options", H100_TILE)) for name, size in H100_TILE_CASES] + \
        [(name, table[name](*size), ("options", SPLIT_BLOCKS)) for name, size in SPLIT_BLOCK_CASES] + \
        [(name, table[name](*size), ("options", {"load_hint": "none", **extra}))
         for name, size, extra in LOAD_HINT_CASES] + \
        [(name, table[name](*size), ("options", {"load_hint": "evict_normal", **extra}))
         for name, size, extra in LOAD_HINT_CASES] + \
        [(name, table[name](*size), ("options", extra) if extra else None) for name, size, extra in SHORT_A_CASES] + \
        [(name, table[name](*size), ("options", {**extra, "a_rows": 0})) for name, size, extra in SHORT_A_CASES] + \
        [(name, sizes, None) for name, sizes in own_size_cases()]        # tests with sizes of their own
    programs = {}
    for name, sizes, variant in cases:
        if only and name not in only:
            continue
        if name not in programs:
            programs[name] = epic.compile(path(name))
        prog = programs[name]
        if (variant == "fold" and not folds(prog.program)) or (variant == "many_rows" and not groups_rows(prog.program)) \
                or (variant == "tail" and not tail_config(prog.program)):
            continue
        if isinstance(variant, tuple):
            overrides = gemm_options(prog.program, variant[1])
        else:
            overrides = ({"split": split_k_config, "fold": fold_config, "cluster": cluster_1x2_config,
                          "tail": tail_config}[variant](prog.program)
                         if variant not in (None, "many_rows") else None)
        # the device may be an H100 or an H200: both heuristics' kernels
        units += [u for _, u in emit.units_for_gpus(prog.program, sizes["M"], overrides, sizes)]
    if not only or "bench/programs/plain.epi" in only:
        from . import test_gpu_tile_trace
        units += test_gpu_tile_trace.units()
    from . import test_gpu_tile_widths
    units += test_gpu_tile_widths.units(only)
    if training:
        from . import test_gpu_autograd, test_gpu_grad, test_gpu_vendor_gemm
        units += test_gpu_grad.units() + test_gpu_autograd.units() + test_gpu_vendor_gemm.units()
    return units


def pack(libraries: list[Path], cache: Path, out: Path) -> int:
    """Writes the cache entries (folders) holding these libraries to `out`, an xz tar whose names are
    relative to `cache`; returns how many entries. Uses tar and xz on all cores where they are there
    (a few seconds on the device's 16), else Python's tarfile."""
    outside = [str(p) for p in libraries if not Path(p).parent.is_relative_to(cache)]
    if outside:
        raise SystemExit(f"--pack: not in the cache folder {cache} (a bundle?): {outside[0]}")
    entries = sorted({str(Path(p).parent.relative_to(cache)) for p in libraries})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("tar") and shutil.which("xz"):
        with open(out, "wb") as f:
            tar = subprocess.Popen(["tar", "cf", "-", "-C", str(cache), "--", *entries], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=f, check=False)
            tar.stdout.close()
            if tar.wait() != 0 or xz.returncode != 0:
                raise SystemExit(f"--pack: tar or xz failed writing {out}")
    else:
        with tarfile.open(out, "w:xz") as t:
            for e in entries:
                t.add(cache / e, arcname=e)
    return len(entries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.prebuild", description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", help="only these programs' kernels (paths as in tests/gpu_cases.py)")
    ap.add_argument("--all", action="store_true", help="also the derived-backward and autograd tests' kernels")
    ap.add_argument("--shard", type=_shard, default=(1, 1), metavar="K/N", help="build part K of N")
    ap.add_argument("--pack", type=Path, metavar="FILE", help="also write these kernels' cache entries (and the "
                    "compiled launcher's) to FILE, an xz tar relative to the cache folder")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    units = all_units(args.programs, args.all)
    unique = {u.name + str(hash(u.source)): u for u in units if in_shard(u, args.shard)}
    from epic.runtime import fastcall
    fastcall.start(warn=False)          # the compiled call path's launcher, beside nvcc
    libraries = build.build_all(list(unique.values()))
    for p in libraries:
        print(p)
    launcher = fastcall.library()
    print(launcher or f"no compiled call path: {fastcall.why_not()}")
    if args.pack:
        from epic.runtime import cache
        n = pack(libraries + ([launcher] if launcher else []), cache.cache_dir(), args.pack)
        print(f"packed {n} cache entries into {args.pack}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
