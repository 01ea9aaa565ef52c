"""One launch each of cuBLAS, epic and QuACK on the same operands, inside a profiler range, for
Nsight Compute to compare kernel by kernel (issue 25: why the same tile and cluster run slower in
epic's kernel than in QuACK's at N = 14336).

  ncu --profile-from-start off --clock-control none --set full -o $OUT/gemms \\
      python bench/ncu_compare.py --work plain_ffn --rows 8192
  ncu --import $OUT/gemms.ncu-rep --page details --csv > $OUT/gemms.csv
  python bench/ncu_diff.py $OUT/gemms.csv --labels cublas,epic,quack --compare epic,quack --min 0.01
  ncu --import $OUT/gemms.ncu-rep --page source --csv --print-source sass > $OUT/gemms-sass.csv
  python bench/ncu_source.py $OUT/gemms-sass.csv --labels cublas,epic,quack     # where warps wait

Every candidate runs a few times before the range (builds, JIT, autotuning stay outside); in the
range each runs once, in the order cuBLAS, epic, QuACK. QuACK is optional (import it via
PYTHONPATH as ../shared/anchors/peer_interleaved.py's header says); its default configuration
(pingpong 128x192, cluster 2x1) is used, as in the interleaved harness.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ROOT, WORK, nodes_from, parse_config  # noqa: E402


def quack_fn(name: str, inputs: dict):
    try:
        from quack.gemm_interface import gemm, gemm_act
    except ImportError as e:
        print(f"QuACK not importable ({e}): cuBLAS and epic only", flush=True)
        return None
    x = inputs["x"]
    if name.startswith("plain"):
        return lambda: gemm(x, inputs["w"], tuned=False)
    if name == "bias_gelu":
        b = inputs["bias"].float()
        return lambda: gemm_act(x, inputs["w"], bias=b, activation="gelu_tanh_approx", store_preact=False,
                                tuned=False)[1]
    if name == "swiglu":
        return lambda: gemm_act(x, inputs["wgu"], activation="swiglu", store_preact=False, tuned=False)[1]
    print(f"no QuACK form for {name}", flush=True)
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="plain_ffn")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--config", default="", help="epic's configuration (bench.py's names), else its default")
    ap.add_argument("--nodes-from", default=None, help="also epic generated with the custom node headers in this "
                    "directory (bench.py's nodes_from), profiled after epic")
    args = ap.parse_args()
    path, make = WORK[args.work]
    gemm, _, inputs = make(args.rows)
    prog = epic.compile(os.path.join(ROOT, path))
    if args.config:
        cfg = parse_config(args.config)
        prog = epic.compile(os.path.join(ROOT, path), {k.name: cfg for k in prog.program.kernels if k.kind == "gemm"})
    runs = [("cublas", gemm), ("epic", lambda: prog(**inputs))]
    if args.nodes_from:
        with nodes_from(args.nodes_from):
            other = epic.compile(os.path.join(ROOT, path))
            other(**inputs)         # generates (and loads) its kernels with those headers
        runs.append(("epic-nodes", lambda: other(**inputs)))
    q = quack_fn(args.work, inputs)
    if q is not None:
        runs.append(("quack", q))
    for _, fn in runs:           # builds, JIT compiles and first-call work outside the range
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    print("profiled, in order:", ", ".join(label for label, _ in runs), flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in runs:
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
