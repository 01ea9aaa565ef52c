"""Time to first result: a fresh Python process (torch's and epic's imports included) calls one of the
benchmark's workloads in a loop, and this reports when its first result came, when its first fused
result came, and how the calls went in between. Modes, each in its own process:

  wait        an empty kernel cache, as by default: the first call waits for nvcc
  background  an empty kernel cache, EPIC_BUILD_IN_BACKGROUND=1: calls run the unfused torch form
              while the kernels build, then switch
  cached      the cache `wait` filled (kernels and the compiled launcher)
  bundle      an empty cache and EPIC_BUNDLE: the kernels `epic build --bundle` wrote from that cache
              (the launcher is not in a bundle: it builds in the background, calls do not wait for it)

  python3 bench/first_result.py [--work bias_gelu] [--rows 64] [--modes wait,background,cached,bundle]
                                [--seconds 240] [--after 30] [--out first_result.json]

A process stops `--after` calls after its first fused call, or at `--seconds`. Needs a GPU and nvcc.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ("wait", "background", "cached", "bundle")


def summarize(calls: list[tuple[float, float, bool]]) -> dict:
    """calls: (seconds from the process's start to the call's result, the call's own seconds, whether
    the call ran the fused kernels), in call order. What the report prints of them."""
    if not calls:
        return {"calls": 0}
    fused = [i for i, c in enumerate(calls) if c[2]]
    first_fused = fused[0] if fused else None
    steady = [c[1] for c in calls[first_fused + 1:]] if first_fused is not None else []
    unfused = [c[1] for c in calls if not c[2]]
    return {
        "calls": len(calls),
        "first_result_s": round(calls[0][0], 3),
        "first_call_s": round(calls[0][1], 3),
        "first_fused_result_s": round(calls[first_fused][0], 3) if first_fused is not None else None,
        "calls_before_fused": first_fused if first_fused is not None else len(calls),
        "unfused_call_ms": round(1e3 * statistics.median(unfused), 3) if unfused else None,
        "fused_call_ms": round(1e3 * statistics.median(steady), 3) if steady else None,
    }


def child(work: str, rows: int, seconds: float, after: int, t_spawn: float) -> None:
    """Runs in the fresh process: inputs, compile, then calls until `after` fused calls or `seconds`."""
    import torch
    sys.path[:0] = [HERE, ROOT]
    import bench as b
    import epic
    from epic.runtime import executable

    path, make = b.WORK[work]
    _, _, inputs = make(rows)
    torch.cuda.synchronize()
    t_inputs = time.time() - t_spawn
    prog = epic.compile(os.path.join(ROOT, path))
    calls, fused_calls = [], 0
    while True:
        t0 = time.time()
        prog(**inputs)
        torch.cuda.synchronize()
        t1 = time.time()
        fused = any(isinstance(v, executable.Executable) for v in prog._bound.values())
        calls.append((t1 - t_spawn, t1 - t0, fused))
        fused_calls += fused
        if fused_calls > after or t1 - t_spawn > seconds:
            break
        if not fused:
            time.sleep(0.005)        # a model between steps: do not spin the background build's core
    print(json.dumps({"inputs_ready_s": round(t_inputs, 3), **summarize(calls)}))


def run_mode(mode: str, args, caches: dict) -> dict:
    env = dict(os.environ)
    env.pop("EPIC_BUILD_IN_BACKGROUND", None)
    env.pop("EPIC_BUNDLE", None)
    env.pop("EPIC_NO_BUILD", None)
    if mode in ("wait", "background", "bundle"):
        env["EPIC_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"epic-first-{mode}-", dir=args.tmp)
    if mode == "wait":
        caches["warm"] = env["EPIC_CACHE_DIR"]
    elif mode == "cached":
        env["EPIC_CACHE_DIR"] = caches["warm"]
    if mode == "background":
        env["EPIC_BUILD_IN_BACKGROUND"] = "1"
    if mode == "bundle":
        env["EPIC_BUNDLE"] = caches["bundle"]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--work", args.work, "--rows", str(args.rows),
           "--seconds", str(args.seconds), "--after", str(args.after)]
    t_spawn = time.time()
    r = subprocess.run(cmd + ["--t-spawn", repr(t_spawn)], env=env, capture_output=True, text=True,
                       timeout=args.seconds + 120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"mode": mode, "error": (r.stderr or r.stdout).strip().splitlines()[-3:]}
    return {"mode": mode, **json.loads(lines[-1])}


def make_bundle(args, warm_cache: str) -> str:
    """`epic build --bundle` of the workload's program at its shape, from the warm cache (no nvcc runs)."""
    sys.path[:0] = [HERE, ROOT]
    import bench as b
    import epic
    path, make = b.WORK[args.work]
    _, _, inputs = make(args.rows)
    sizes = b._sizes(epic.compile(os.path.join(ROOT, path)), inputs)
    shape = ",".join(f"{k}={v}" for k, v in sizes.items())
    out = tempfile.mkdtemp(prefix="epic-first-bundle-", dir=args.tmp)
    env = {**os.environ, "EPIC_CACHE_DIR": warm_cache}
    subprocess.run([sys.executable, "-m", "cli.main", "build", os.path.join(ROOT, path), "--shape", shape,
                    "--bundle", out], env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    return out


def table(results: list[dict]) -> str:
    head = f"{'mode':<12}{'first result':>14}{'first fused':>13}{'calls before':>14}{'unfused call':>14}{'fused call':>12}"
    rows = [head]
    fmt = lambda v, unit: "-" if v is None else f"{v:.3f} {unit}"  # noqa: E731
    for r in results:
        if "error" in r:
            rows.append(f"{r['mode']:<12}error: {' | '.join(r['error'])}")
            continue
        rows.append(f"{r['mode']:<12}{fmt(r.get('first_result_s'), 's'):>14}{fmt(r.get('first_fused_result_s'), 's'):>13}"
                    f"{r.get('calls_before_fused', 0):>14}{fmt(r.get('unfused_call_ms'), 'ms'):>14}"
                    f"{fmt(r.get('fused_call_ms'), 'ms'):>12}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="bias_gelu")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--after", type=int, default=30, help="calls after the first fused one")
    ap.add_argument("--tmp", default=None, help="where the empty caches are made (default: the system's)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "first_result.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--t-spawn", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.work, args.rows, args.seconds, args.after, args.t_spawn or time.time())
        return 0
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or (("cached" in modes or "bundle" in modes) and "wait" not in modes):
        ap.error(f"modes: any of {', '.join(MODES)}; cached and bundle need wait (its cache)")
    caches, results = {}, []
    for mode in modes:
        if mode == "bundle":
            caches["bundle"] = make_bundle(args, caches["warm"])
        results.append(run_mode(mode, args, caches))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{args.work} at M = {args.rows}: seconds from the process's start (imports included)")
    print(table(results))
    with open(args.out, "w") as f:
        json.dump({"work": args.work, "rows": args.rows, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
