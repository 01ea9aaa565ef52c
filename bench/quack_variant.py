"""Renamed copies of the installed QuACK, each with one change that makes its sm90 gemm more like epic's,
to time beside QuACK itself in one process (bench/quack_variants_ab.py).

Two differences between the two kernels' SASS were not measured by any run
(bench/results/2026-12-05-cpu-sass-epic-quack.txt):
  policy   QuACK passes cache policy 0 to its TMA loads; CUTLASS's mainloop, and so epic's, passes
           EVICT_NORMAL (0x1000000000000000). The change gives QuACK's A and B loads that policy.
  linear   QuACK walks every second group of tiles backwards (serpentine); CUTLASS's order, and so
           epic's, does not. The change turns the serpentine off.
A copy is a package of its own name: every `quack` import, its torch ops' namespace and its
compile-cache fingerprint renamed, so that it loads beside QuACK.

  python bench/quack_variant.py --into /tmp/qv --name quack_ev --change policy
  python bench/quack_variant.py --into /tmp/qv --name quack_lin --change linear    # PYTHONPATH=/tmp/qv:...
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
from pathlib import Path

EVICT_NORMAL = 0x1000000000000000          # CUTLASS's TMA::CacheHintSm90::EVICT_NORMAL


def renames(name: str) -> list[tuple[re.Pattern, str]]:
    """(pattern, replacement) over every .py file of a copy named `name`."""
    return [
        (re.compile(r"\bquack\."), f"{name}."),                                   # quack.x in imports and code
        (re.compile(r"^(\s*)from quack import", re.M), rf"\1from {name} import"),
        (re.compile(r"^(\s*)import quack as", re.M), rf"\1import {name} as"),
        (re.compile(r"^(\s*)import quack$", re.M), rf"\1import {name} as quack"),
        (re.compile(r"quack::"), f"{name}::"),                                    # torch.library op names
        (re.compile(r'^PACKAGE_NAME = "quack"$', re.M), f'PACKAGE_NAME = "{name}"'),
        (re.compile(r'module == "quack"'), f'module == "{name}"'),
    ]

# the A and B loads of the sm90 gemm's producer (quack-kernels 0.6.5's gemm_sm90.py)
LOADS = [
    ("                            dst_tensor=sA,\n                            tma_multicast=a_tma_multicast,\n"
     "                        )\n                    else:\n"),
    "                        dst_tensor=sB,\n                        tma_multicast=b_tma_multicast,\n",
]


# the serpentine of the static scheduler (class TileScheduler, before the subclasses that have their own)
SERPENTINE = "        if group_id % 2 == 1:  # serpentine order\n"
LINEAR = "        if const_expr(False):  # serpentine order: off (bench/quack_variant.py)\n"


def _with_policy(text: str) -> str:
    for load in LOADS:
        if text.count(load) != 1:
            raise ValueError("gemm_sm90.py does not have the A and B loads of quack-kernels 0.6.5")
        indent = load.split("tma_multicast")[0].rsplit("\n", 1)[-1]
        line = next(s for s in load.splitlines(keepends=True) if "tma_multicast" in s)
        policy = f"{indent}cache_policy=cutlass.Int64({EVICT_NORMAL:#x}),\n"
        text = text.replace(load, load.replace(line, line + policy))
    return text


def _linear(text: str) -> str:
    head, sep, tail = text.partition("class TriangularTileScheduler")
    if head.count(SERPENTINE) != 1 or "const_expr" not in head:
        raise ValueError("tile_scheduler.py does not have the serpentine of quack-kernels 0.6.5")
    return head.replace(SERPENTINE, LINEAR) + sep + tail


# change -> (file of the package it edits, the edit)
CHANGES = {"policy": ("gemm_sm90.py", _with_policy), "linear": ("tile_scheduler.py", _linear)}


def make(source: Path, into: Path, name: str, changes: list[str]) -> Path:
    """Write the copy `name` with `changes` under `into`; returns its folder."""
    if not re.fullmatch(r"quack_[a-z0-9_]+", name):
        raise ValueError(f"a copy's name is quack_ and letters, digits or _ (not {name!r})")
    unknown = [c for c in changes if c not in CHANGES]
    if unknown or not changes:
        raise ValueError(f"changes are {', '.join(CHANGES)} (given: {', '.join(changes) or 'none'})")
    edits = {CHANGES[c][0]: [] for c in changes}
    for c in changes:
        edits[CHANGES[c][0]].append(CHANGES[c][1])
    dst = into / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(source, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for f in dst.rglob("*.py"):
        text = f.read_text()
        for pattern, repl in renames(name):
            text = pattern.sub(repl, text)
        for edit in edits.get(f.name, []) if f.parent == dst else []:
            text = edit(text)
        f.write_text(text)
    left = [str(f.relative_to(dst)) for f in dst.rglob("*.py")
            if re.search(r"^\s*(from quack[. ]|import quack\b)", f.read_text(), re.M)]
    if left:
        raise ValueError(f"imports of quack left in {', '.join(left)}")
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--into", required=True, help="folder to write the package into (put it on PYTHONPATH)")
    ap.add_argument("--name", required=True, help="the copy's package name, e.g. quack_ev")
    ap.add_argument("--change", required=True, help=f"comma-separated: {', '.join(CHANGES)}")
    args = ap.parse_args(argv)
    spec = importlib.util.find_spec("quack")
    if spec is None or not spec.submodule_search_locations:
        print("quack_variant: QuACK is not importable (install it as ../shared/anchors/peer_interleaved.py's "
              "header says)", file=sys.stderr)
        return 2
    try:
        print(make(Path(list(spec.submodule_search_locations)[0]), Path(args.into), args.name,
                   [c for c in args.change.split(",") if c]))
    except ValueError as exc:
        print(f"quack_variant: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
