"""Decode tail probe: is residual + RMSNorm faster at M = 64 as a plain gemm followed by a kernel that
runs the whole epilogue (one CTA per row), than as epic's fused epilogue plus its row combine kernel?

    python bench/decode_tail_probe.py [--rows 64,1] [--rounds 150] [--out F]

The probe's tail kernels are hand-written for this one program (bench/decode_tail/tail_probe.cu, built
here with nvcc); `epic-tail` is the one epic generates with combine=tail. Candidates, each a CUDA-graph replay in bench/interleaved.py's
rounds (L2 flushed, rotating order, ratio to cuBLAS's `x @ wo` in the same round):
  epic             samples/residual_rmsnorm.epi as epic plans it (gemm epilogue + row combine kernel)
  epic-tail        the same with combine=tail: epic's generated tail kernel (epic/plan/tail.py)
  plainf32         epic's gemm storing its f32 accumulator alone (bench/programs/plain_f32.epi)
  tail-T[-early]   that gemm, then the tail kernel (T threads a row; early: z and gamma loaded before
                   the tail waits for the gemm), a programmatic dependent of the gemm
  tail-bf16-T      epic's plain gemm (accumulator rounded to bf16), then the tail (Liger's numerics)
  cublas+tail      cuBLAS's gemm, then the tail on its bf16 output (not a dependent)
  liger            cuBLAS's gemm, then Liger's fused add + RMSNorm (when liger_kernel imports)
Before timing, every candidate's outputs are compared with a float64 reference at ragged M too.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import epic  # noqa: E402
from bench import ROOT, WORK, graphed  # noqa: E402
from interleaved import quartiles, rounds, spread_notes  # noqa: E402

EPS = 1e-6


def build_tail() -> ctypes.CDLL:
    out = os.path.join(tempfile.gettempdir(), "epic_tail_probe.so")
    src = os.path.join(HERE, "decode_tail", "tail_probe.cu")
    subprocess.run(["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared",
                    "-Xcompiler", "-fPIC", "-o", out, src], check=True)
    lib = ctypes.CDLL(out)
    lib.tail_launch.restype = ctypes.c_int
    lib.tail_launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 5 + \
        [ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    return lib


def tail(lib, acc, z, gamma, threads, early, pdl):
    m, n = z.shape
    resid, hg = torch.empty_like(z), torch.empty_like(z)
    r = torch.empty(m, dtype=torch.float32, device=z.device)
    rc = lib.tail_launch(acc.data_ptr(), int(acc.dtype == torch.float32), threads, int(early), z.data_ptr(),
                         gamma.data_ptr(), resid.data_ptr(), hg.data_ptr(), r.data_ptr(), m, n, EPS,
                         torch.cuda.current_stream().cuda_stream, int(pdl))
    if rc != 0:
        raise RuntimeError(f"tail_launch returned {rc}")
    return {"resid": resid, "hg": hg, "r": r}


def reference(inputs):
    x, wo, z, g = (inputs[k].double() for k in ("x", "wo", "z", "gamma"))
    h = x @ wo + z
    return {"resid": h, "hg": h * g, "r": torch.rsqrt(h.pow(2).mean(-1) + EPS)}


def error(got: dict, want: dict) -> float:
    """The largest |difference| relative to each output's rms, over the three outputs."""
    worst = 0.0
    for k, w in want.items():
        d = (got[k].double() - w).abs().nan_to_num(float("inf")).max().item()
        worst = max(worst, d / (w.pow(2).mean().sqrt().item() or 1.0))
    return worst


def candidates(lib, m: int, liger, timed: bool = True):
    _, make = WORK["resid_norm"]
    gemm, _, inputs = make(m)
    x, wo, z, g = inputs["x"], inputs["wo"], inputs["z"], inputs["gamma"]
    fused = epic.compile(os.path.join(ROOT, "samples/residual_rmsnorm.epi"))
    plain32 = epic.compile(os.path.join(ROOT, "bench/programs/plain_f32.epi"))
    plain16 = epic.compile(os.path.join(ROOT, "bench/programs/plain.epi"))
    generated = epic.compile(os.path.join(ROOT, "samples/residual_rmsnorm.epi"), {"o_proj": {"combine": "tail"}})
    fns = {"epic": lambda: fused(**inputs), "epic-tail": lambda: generated(**inputs)}
    fns["plainf32"] = lambda: plain32(x=x, wo=wo)
    for threads in (256, 512):
        for early in (False, True):
            fns[f"tail-{threads}" + ("-early" if early else "")] = (
                lambda t=threads, e=early: tail(lib, plain32(x=x, wo=wo)["y"], z, g, t, e, True))
        fns[f"tail-bf16-{threads}"] = lambda t=threads: tail(lib, plain16(x=x, w=wo)["y"], z, g, t, True, True)
    fns["cublas+tail"] = lambda: tail(lib, x @ wo, z, g, 512, True, False)
    if liger is not None:
        mod = liger(wo.shape[1], eps=EPS).cuda()
        mod.weight = torch.nn.Parameter(g.clone(), requires_grad=False)
        def run_liger():
            with torch.no_grad():
                y, resid = mod(x @ wo, z)
            return {"resid": resid, "y": y}
        fns["liger"] = run_liger
    want = reference(inputs)
    errors = {}
    for label, fn in fns.items():
        if label == "plainf32":
            continue
        got = fn()
        torch.cuda.synchronize()
        if label == "liger":     # Liger writes y = resid * r * gamma, not hg and r
            ref = {"resid": want["resid"], "y": want["hg"] * want["r"][:, None]}
            errors[label] = error({k: got[k] for k in ref}, ref)
        else:
            errors[label] = error(got, want)
    if not timed:                  # a checked size only: no graphs to capture
        return [], errors
    cands = [("cublas", graphed(gemm)), ("cublas-again", graphed(gemm))]
    cands += [(label, graphed(fn)) for label, fn in fns.items()]
    return cands, errors


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="64,1")
    ap.add_argument("--check-rows", default="1,7,33,64,100")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--out")
    args = ap.parse_args()
    lib = build_tail()
    try:
        from liger_kernel.transformers import LigerFusedAddRMSNorm as liger
    except Exception as e:  # noqa: BLE001
        print(f"liger: not importable ({type(e).__name__}: {e})")
        liger = None
    results = {"command": "python bench/decode_tail_probe.py " + " ".join(sys.argv[1:]),
               "device": torch.cuda.get_device_name(), "checks": {}, "runs": []}
    for m in [int(v) for v in args.check_rows.split(",")]:
        _, errors = candidates(lib, m, liger, timed=False)
        results["checks"][m] = errors
        print(f"M={m}: max |error| / rms against float64: " +
              ", ".join(f"{k} {v:.2e}" for k, v in errors.items()), flush=True)
    for m in [int(v) for v in args.rows.split(",")]:
        cands, _ = candidates(lib, m, liger)
        times = rounds(cands, args.rounds)
        base = times["cublas"]
        ratios = {}
        for label, ts in times.items():
            q1, med, q3 = quartiles([t / b for t, b in zip(ts, base)])
            ratios[label] = {"median": med, "q1": q1, "q3": q3, "ms": statistics.median(ts)}
        results["runs"].append({"M": m, "cublas_ms": statistics.median(base), "ratios": ratios})
        print(f"M={m}: cuBLAS {statistics.median(base) * 1000:.2f} us")
        for label, r in ratios.items():
            print(f"  {label:16s} {r['median']:.3f} [{r['q1']:.3f}-{r['q3']:.3f}]  {r['ms'] * 1000:.2f} us", flush=True)
        for line in spread_notes(ratios):
            print(line)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
