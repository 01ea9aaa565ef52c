"""One call of a workload's epic program and of its bare cuBLAS GEMM, for Nsight Compute:
    ncu --clock-control none --section SpeedOfLight -k regex:"device_kernel|nvjet|gemm" \
        python3 bench/ncu_one.py --work swiglu --m 8192"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import ROOT, WORK  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--work", default="swiglu")
ap.add_argument("--m", type=int, default=8192)
args = ap.parse_args()
path, make = WORK[args.work]
gemm, _, inputs = make(args.m)
prog = epic.compile(os.path.join(ROOT, path))
prog(**inputs)
gemm()
torch.cuda.synchronize()
