"""Prints a results JSON of bench/interleaved.py or ../shared/anchors/peer_interleaved.py as the
README's markdown table: one row per workload, a column per (rows, candidate), each cell the median
ratio to cuBLAS, the fastest candidate of a row and size in bold where there are several.

    python3 bench/readme_table.py bench/results/2026-12-05-h200-interleaved-all.json
    python3 bench/readme_table.py peers.json --candidates epic,quack,liger

So the table in the README and docs/PERFORMANCE.md is copied from the file its command wrote, not typed.
"""
import argparse
import json
import sys

# the README's names for bench.WORK's workloads, in the README's order
LABELS = {
    "xent": "LM head + cross entropy, no logits (V = 128256)",
    "fp8_quant": "fp8 1x128 block-scaled write-back",
    "swiglu": "gate/up + SwiGLU",
    "bias_gelu": "bias + GELU",
    "rope": "RoPE",
    "qk_norm": "Q projection + QK-norm + RoPE",
    "prenorm_half": "pre-norm first half (2 gemms + combine), vs its GEMMs",
    "prenorm_mlp": "whole pre-norm MLP block (3 gemms), vs its GEMMs",
    "resid_norm": "residual + RMSNorm pieces",
}
CONTROL = "cublas-again"          # cuBLAS timed again: quoted as a range, not a column


def table(results: list[dict], candidates: list[str] | None = None) -> str:
    """The markdown table of these results (bench/interleaved.py's or peer_interleaved.py's `results`)."""
    rows = sorted({r["M"] for r in results}, reverse=True)
    found = [c for r in results for c in r["ratios"] if c != CONTROL]
    names = candidates or list(dict.fromkeys(found))
    cols = [(m, c) for m in rows for c in names]
    one_candidate = len(names) == 1
    head = ["workload"] + [f"M = {m}" if one_candidate else f"M = {m}: {c}" for m, c in cols]
    by = {(r["work"], r["M"]): r["ratios"] for r in results}
    order = [w for w in LABELS if any(w == r["work"] for r in results)] + \
        list(dict.fromkeys(r["work"] for r in results if r["work"] not in LABELS))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in order:
        cells = []
        for m, c in cols:
            ratios = by.get((w, m), {})
            if c not in ratios:
                cells.append("")
                continue
            med = ratios[c]["median"]
            best = min(ratios[o]["median"] for o in names if o in ratios)
            text = f"{med:.3f}"
            cells.append(f"**{text}**" if not one_candidate and med == best and len(
                [o for o in names if o in ratios]) > 1 else text)
        lines.append("| " + " | ".join([LABELS.get(w, w)] + cells) + " |")
    return "\n".join(lines)


def control_range(results: list[dict]) -> str:
    """cuBLAS timed again as a candidate: the range of its medians, to quote beside the table."""
    meds = [r["ratios"][CONTROL]["median"] for r in results if CONTROL in r["ratios"]]
    return f"the control {min(meds):.3f}-{max(meds):.3f}" if meds else "no control in this file"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/readme_table.py", description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a JSON file written by --out")
    ap.add_argument("--candidates", default="", help="these candidates' columns, in this order (default: every "
                    "candidate but the control)")
    args = ap.parse_args(argv)
    try:
        with open(args.results) as f:
            data = json.load(f)
        results = data["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.results}: not a results file of bench/interleaved.py ({e})", file=sys.stderr)
        return 2
    names = [c for c in args.candidates.split(",") if c] or None
    print(table(results, names))
    command = data.get("command") or data.get("meta", {}).get("command") or "command not recorded"
    print(f"\n({control_range(results)}; {command})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
