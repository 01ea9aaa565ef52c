"""Each candidate run back to back for a few seconds while nvidia-smi samples the SM clock and the
power draw: time per call, mean clock, mean power and cycles per call (time x clock). Separates an
epilogue that costs cycles from one that only costs power (a GEMM at these sizes runs at its power
limit, so the clock follows the work the SMs do). The interleaved harness (bench/interleaved.py)
alternates candidates call by call, which shares the power budget out between them; this measures
each under its own sustained load, where an epilogue's power shows (docs/PERFORMANCE.md, "Sustained
load").

  python bench/sustained.py --work plain_ffn,bias_gelu --rows 8192 [--configs pp_128x192x64_c2x1_s4]
                            [--nodes-from DIR] [--variants unpicked] [--peer-script PATH] [--seconds 3]
                            [--out sustained.json]

Candidates per workload: the bare cuBLAS GEMM, epic's default, epic with each --configs entry, and
with --nodes-from epic's default generated with those node headers (bench.py's nodes_from), with
--variants epic's default compiled with those variants (bench.py's COMBINE_VARIANTS: unfused,
unpicked; labelled epic-VARIANT). With
--peer-script ../shared/anchors/peer_interleaved.py, also that script's QuACK candidates (QuACK
installed as its header says), so that epic's and QuACK's epilogues are compared in cycles per call.
Kernels come from the cache (build them first with bench/prebuild.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import epic  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (COMBINE_VARIANTS, ROOT, WORK, combine_variant, graphed, nodes_from, parse_config,  # noqa: E402
                   variant_list)


class Sampler:
    """nvidia-smi polling every 20 ms in a child process; samples stamped on arrival."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "20"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                clock, power = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.monotonic(), clock, power))

    def between(self, t0: float, t1: float) -> tuple[float, float, int]:
        got = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not got:
            return float("nan"), float("nan"), 0
        return statistics.fmean(c for c, _ in got), statistics.fmean(p for _, p in got), len(got)

    def stop(self) -> None:
        self.proc.terminate()


def sustained(fn, seconds: float) -> tuple[float, float, float, int]:
    """(t0, t1, ms per call, calls): fn replayed until `seconds` have passed, after a 1 s settle."""
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        fn()
        torch.cuda.synchronize()
    calls, t0 = 0, time.monotonic()
    while True:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        calls += 10
        t1 = time.monotonic()
        if t1 - t0 >= seconds:
            return t0, t1, (t1 - t0) * 1e3 / calls, calls


def peer_candidates(script: str):
    """(name, inputs, graphed) -> [(label, fn)]: QuACK's candidates as the peer script builds them."""
    import importlib.util
    import types
    spec = importlib.util.spec_from_file_location("peer_interleaved", script)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    from quack.epilogue.library import lse_target_epi
    from quack.epilogue.rotary import make_interleaved_inv_freq, rope_posfreq_epi
    from quack.gemm_interface import gemm, gemm_act, gemm_norm_act, gemm_rms
    from quack.linear_cross_entropy import chunked_linear_cross_entropy
    q = types.SimpleNamespace(gemm=gemm, gemm_act=gemm_act, gemm_rms=gemm_rms, gemm_norm_act=gemm_norm_act,
                              chunked_linear_cross_entropy=chunked_linear_cross_entropy,
                              lse_target_epi=lse_target_epi, rope_posfreq_epi=rope_posfreq_epi,
                              make_interleaved_inv_freq=make_interleaved_inv_freq)

    def candidates(name, inputs, graphed):
        out = []
        for label, fn, _ in peer.quack_candidates(q, name, inputs, graphed, []):
            fn()                                    # QuACK's JIT, outside the timing
            try:
                out.append((label, graphed(fn)))
            except Exception:  # noqa: BLE001  (a peer that cannot be captured is timed as calls)
                torch.cuda.synchronize()
                out.append((label + "(call)", fn))
        return out
    return candidates


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="plain_ffn,bias_gelu")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--configs", default="", help="also epic with these configurations (bench.py's spelling)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--nodes-from", default=None, help="also epic generated with the custom node headers in this "
                    "directory (bench.py's nodes_from), labelled epic-nodes")
    ap.add_argument("--variants", type=variant_list, default=[], help="also epic's default with these variants (bench.py's "
                    f"COMBINE_VARIANTS: {', '.join(COMBINE_VARIANTS)}), labelled epic-VARIANT")
    ap.add_argument("--peer-script", default=None, help="also QuACK's candidates from this peer script "
                    "(../shared/anchors/peer_interleaved.py)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sustained.json"))
    args = ap.parse_args()
    peers = peer_candidates(args.peer_script) if args.peer_script else None
    print(torch.cuda.get_device_name(), time.strftime("%Y-%m-%d"), flush=True)
    sampler = Sampler()
    time.sleep(0.5)
    rows = []
    for name in args.work.split(","):
        path, make = WORK[name]
        gemm, _, inputs = make(args.rows)
        prog = epic.compile(os.path.join(ROOT, path))
        cands = [("cublas", graphed(gemm)), ("epic", graphed(lambda prog=prog: prog(**inputs)))]
        gemms = [k.name for k in prog.program.kernels if k.kind == "gemm"]
        if args.nodes_from:
            with nodes_from(args.nodes_from):
                pn = epic.compile(os.path.join(ROOT, path))
                cands.append(("epic-nodes", graphed(lambda pn=pn: pn(**inputs))))   # generated here
        for v in args.variants:
            with combine_variant(v):         # compiled and generated inside: a variant may change a pass
                pv = epic.compile(os.path.join(ROOT, path))
                cands.append((f"epic-{v}", graphed(lambda pv=pv: pv(**inputs))))
        for c in filter(None, args.configs.split(",")):
            pc = epic.compile(os.path.join(ROOT, path), {g: parse_config(c) for g in gemms})
            cands.append((f"epic-{c}", graphed(lambda pc=pc: pc(**inputs))))
        if peers:
            cands += peers(name, inputs, graphed)
        for label, fn in cands:
            t0, t1, ms, calls = sustained(fn, args.seconds)
            mhz, watts, n = sampler.between(t0, t1)
            rec = dict(work=name, m=args.rows, label=label, ms=ms, calls=calls, mhz=mhz, watts=watts,
                       samples=n, mcycles=ms * 1e-3 * mhz)
            rows.append(rec)
            print(f"{name:<14}{label:<34}{ms:9.4f} ms  {mhz:7.0f} MHz  {watts:6.0f} W  "
                  f"{rec['mcycles']:8.3f} Mcycles  ({calls} calls, {n} samples)", flush=True)
    sampler.stop()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
