"""A renamed copy of the installed QuACK whose sm90 gemm asks TMA for CUTLASS's L2 policy, to time beside
QuACK itself in one process (bench/quack_policy_ab.py).

QuACK's sm90 mainloop passes cache policy 0 to its TMA loads; CUTLASS's, and so epic's, pass
EVICT_NORMAL (0x1000000000000000). It is one of the differences between the two kernels' SASS that no
run has measured (bench/results/2026-12-05-cpu-sass-epic-quack.txt). The copy is the package
`quack_ev`: every `quack` import, its torch ops' namespace and its compile-cache fingerprint renamed,
so both load side by side, and the A and B loads of its sm90 gemm given the policy.

  python bench/quack_variant.py --into /tmp/qev      # then PYTHONPATH=/tmp/qev:$PYTHONPATH
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
from pathlib import Path

NAME = "quack_ev"
EVICT_NORMAL = 0x1000000000000000          # CUTLASS's TMA::CacheHintSm90::EVICT_NORMAL

# (pattern, replacement) over every .py file of the copy
RENAMES = [
    (re.compile(r"\bquack\."), f"{NAME}."),                                   # quack.x in imports and code
    (re.compile(r"^(\s*)from quack import", re.M), rf"\1from {NAME} import"),
    (re.compile(r"^(\s*)import quack as", re.M), rf"\1import {NAME} as"),
    (re.compile(r"^(\s*)import quack$", re.M), rf"\1import {NAME} as quack"),
    (re.compile(r"quack::"), f"{NAME}::"),                                    # torch.library op names
    (re.compile(r'^PACKAGE_NAME = "quack"$', re.M), f'PACKAGE_NAME = "{NAME}"'),
    (re.compile(r'module == "quack"'), f'module == "{NAME}"'),
]

# the A and B loads of the sm90 gemm's producer (quack-kernels 0.6.5's gemm_sm90.py)
LOADS = [
    ("                            dst_tensor=sA,\n                            tma_multicast=a_tma_multicast,\n"
     "                        )\n                    else:\n"),
    "                        dst_tensor=sB,\n                        tma_multicast=b_tma_multicast,\n",
]


def _with_policy(text: str) -> str:
    for load in LOADS:
        if text.count(load) != 1:
            raise ValueError("gemm_sm90.py does not have the A and B loads of quack-kernels 0.6.5")
        indent = load.split("tma_multicast")[0].rsplit("\n", 1)[-1]
        line = next(s for s in load.splitlines(keepends=True) if "tma_multicast" in s)
        text = text.replace(load, load.replace(line, line + f"{indent}cache_policy=cutlass.Int64({EVICT_NORMAL:#x}),\n"))
    return text


def make(source: Path, into: Path) -> Path:
    """Write the variant package under `into`; returns its folder."""
    dst = into / NAME
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(source, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for f in dst.rglob("*.py"):
        text = f.read_text()
        for pattern, repl in RENAMES:
            text = pattern.sub(repl, text)
        if f.name == "gemm_sm90.py" and f.parent == dst:
            text = _with_policy(text)
        f.write_text(text)
    left = [str(f.relative_to(dst)) for f in dst.rglob("*.py")
            if re.search(r"^\s*(from quack[. ]|import quack\b)", f.read_text(), re.M)]
    if left:
        raise ValueError(f"imports of quack left in {', '.join(left)}")
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--into", required=True, help="folder to write the package into (put it on PYTHONPATH)")
    args = ap.parse_args(argv)
    spec = importlib.util.find_spec("quack")
    if spec is None or not spec.submodule_search_locations:
        print("quack_variant: QuACK is not importable (install it as ../shared/anchors/peer_interleaved.py's "
              "header says)", file=sys.stderr)
        return 2
    try:
        print(make(Path(list(spec.submodule_search_locations)[0]), Path(args.into)))
    except ValueError as exc:
        print(f"quack_variant: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
