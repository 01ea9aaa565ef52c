"""The fused kernels against the program's own unfused torch form (epic/runtime/unfused.py), eager and
compiled, on the benchmark's workloads: GPU ms (triton do_bench, L2 flushed) and host us per call.

  python bench/unfused.py [--rows 8192,64] [--work resid_norm,qk_norm,...] [--out unfused.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench as b  # noqa: E402
import epic  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8192,64")
    ap.add_argument("--work", default="resid_norm,qk_norm,bias_gelu,prenorm_mlp")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "unfused.json"))
    args = ap.parse_args()
    results = []
    for name in args.work.split(","):
        path, make = b.WORK[name]
        for m in (int(r) for r in args.rows.split(",")):
            gemm, _, inputs = make(m)
            prog = epic.compile(os.path.join(b.ROOT, path))
            rec = {"work": name, "M": m, "gemm_ms": b.bench(gemm), "fused_ms": b.bench(lambda: prog(**inputs)),
                   "fused_host_us": b.host_us(lambda: prog(**inputs))}
            for form, compiled in (("eager", False), ("compiled", True)):
                try:
                    t0 = time.time()
                    prog.unfused(compiled=compiled, **inputs)
                    if compiled:
                        rec["compile_s"] = round(time.time() - t0, 1)
                    rec[f"{form}_ms"] = b.bench(lambda: prog.unfused(compiled=compiled, **inputs))
                    rec[f"{form}_host_us"] = b.host_us(lambda: prog.unfused(compiled=compiled, **inputs), n=50)
                except Exception as e:  # noqa: BLE001 -- record why a form does not run
                    rec[f"{form}_error"] = str(e).splitlines()[0][:200]
            results.append(rec)
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{'work':<14}{'M':>6}{'fused':>8}{'eager':>8}{'compiled':>10}   (ratios to the bare GEMM; host us fused/eager/compiled)")
    for r in results:
        g = r["gemm_ms"]
        ratio = lambda k: f"{r[k] / g:.3f}" if k in r else "-"  # noqa: E731
        print(f"{r['work']:<14}{r['M']:>6}{ratio('fused_ms'):>8}{ratio('eager_ms'):>8}{ratio('compiled_ms'):>10}   "
              f"{r['fused_host_us']:.0f}/{r.get('eager_host_us', 0):.0f}/{r.get('compiled_host_us', 0):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
