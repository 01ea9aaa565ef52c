"""Where a persistent gemm's time goes between tiles: each warp group's phases of each tile, timed inside
the kernel (kernel option trace=tiles, templates/nodes/epic_nodes/tile_trace.hpp), summarized over all
tiles and CTAs, in SM clock cycles.

  python bench/tile_trace.py --work plain_gate_up_k1024 --rows 8192 [--config ping_128x192x64_c2x1] [--out t.json]

Every gemm of the work's program is built with trace=tiles (and --config, bench.py's spelling, where
given), run a few times, then once more with its trace buffer cleared first; the summary is of that
run, whose outputs are checked against the untraced program's, bit for bit (exit 1 where they differ). Per tile of a consumer warp group (pingpong: the two take turns, the CTA's tiles alternate):
  turn wait   from the end of its previous tile's epilogue to its turn on the tensor cores (mma entered)
  data        from its turn to its first k-block's operands being in shared memory
  issue       from then until every k-block is issued; per k-block also, against the tensor cores' peak
              (4096 bf16 flops per cycle per SM: 768 cycles for a 128x192x64 k-block)
  drain       until every k-block has retired
  epi wait    until its epilogue's turn; epilogue: until its stores are issued; store tail: until they
              have read shared memory
  handoff     from one warp group's mma() returning to the other's mma() entered, tile after tile (pingpong)
  tensor idle per tile: the CTA's span minus the union of its [data, drain] intervals, over its tiles
  producer lead  from the producer starting a tile's loads to that tile's turn on the tensor cores
  last tile's epilogue  the epilogue of each CTA's last tile, the one no later tile hides;
  after the last k-block  from that tile's k-blocks retiring to its stores' end: what the CTA adds
              after its tensor cores are done (also in us and as a share of the span)
The producer's side of each tile, in the order it loads them:
  producer between tiles  from its last TMA load of one tile to entering the next's load(): the
              scheduler's next tile and the loop, run by one warp
  first stage wait  from entering load() to the tile's first stage being free (the consumers releasing
              it); near 0 means the stage was free already, and the producer, not the tensor cores, set
              when the tile's first operands could start
  first load to data  from that stage being free (its TMA load issued) to the consumer finding the
              operands in shared memory
Across CTAs (the GPU's global timer, in us): the kernel's span from the first CTA's first tile to the
last CTA's last epilogue, how far apart the CTAs finish, and the share of the span the average CTA sits
idle after its last tile (a static persistent kernel's last round, when the tiles do not fill it), and
the span a dynamic scheduler would have in a model: each tile to the CTA free first, each CTA at its own
measured time per tile.
The trace costs a few instructions per phase; time the traced kernel beside the untraced one
(bench/interleaved.py) before reading small differences into it.
"""
from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import math
import os
import re
import statistics
import sys

# the buffer's events (tile_trace.hpp)
MMA_BEGIN, DATA, ISSUED, RETIRED, EPI_BEGIN, EPI_STORED, EPI_END = range(7)
LOAD_BEGIN, LOAD_FREE, LOAD_END = range(3)
SMID, GLOBAL_NS, CLOCK, TILES0, TILES1, LOADS, LAST_NS, LAST_CLOCK = range(8)
PHASES = ("turn wait", "data", "issue", "drain", "epi wait", "epilogue", "store tail")
PEAK_FLOPS_PER_CYCLE = 4096     # dense bf16 per SM per cycle on Hopper (989 TFLOPS, 132 SMs, 1.83 GHz)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    if len(values) == 1:
        return (values[0],) * 3
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[1], q[2]


def phases(wg_tiles: list[list[int]]) -> dict[str, list[int]]:
    """Phase lengths of one warp group's tiles (each a list of the 7 event clocks; 0: not reached)."""
    out: dict[str, list[int]] = {p: [] for p in PHASES}
    spans = [(MMA_BEGIN, DATA, "data"), (DATA, ISSUED, "issue"), (ISSUED, RETIRED, "drain"),
             (RETIRED, EPI_BEGIN, "epi wait"), (EPI_BEGIN, EPI_STORED, "epilogue"), (EPI_STORED, EPI_END, "store tail")]
    previous_end = 0
    for ev in wg_tiles:
        if previous_end and ev[MMA_BEGIN]:
            out["turn wait"].append(ev[MMA_BEGIN] - previous_end)
        for a, b, name in spans:
            if ev[a] and ev[b]:
                out[name].append(ev[b] - ev[a])
        previous_end = ev[EPI_END] or ev[EPI_STORED]
    return out


def cta_summary(wg: list[list[list[int]]], tiles: tuple[int, int], loads: list[list[int]] | None = None,
                pingpong: bool = True) -> dict:
    """One CTA: its warp groups' phases, the handoffs between them, the tensor cores' idle time and the
    producer's lead. wg[w][t] = the 7 event clocks of warp group w's t-th tile; tiles = tiles recorded per
    warp group; loads[p] = the producer's (begin, first stage free, end) clocks of the CTA's p-th tile, which pingpong's warp
    groups take in turn (warp group p % 2, its tile p // 2) and the cooperative schedule's share."""
    per = [phases(wg[w][:tiles[w]]) for w in (0, 1)]
    merged = {p: per[0][p] + per[1][p] for p in PHASES}
    # the CTA's tiles in the order they took the tensor cores
    turns = sorted((ev[MMA_BEGIN], ev) for w in (0, 1) for ev in wg[w][:tiles[w]] if ev[MMA_BEGIN])
    # pingpong's warp groups take turns; the cooperative schedule's work on one tile together
    handoffs = [b[MMA_BEGIN] - a[ISSUED] for (_, a), (_, b) in zip(turns, turns[1:]) if a[ISSUED]] if pingpong else []
    busy = sorted((ev[DATA], ev[RETIRED]) for _, ev in turns if ev[DATA] and ev[RETIRED])
    covered, end = 0, None
    for lo, hi in busy:
        if end is None or lo > end:
            covered += hi - lo
            end = hi
        elif hi > end:
            covered += hi - end
            end = hi
    span = (busy[-1][1] if busy else 0) - (busy[0][0] if busy else 0)
    idle = span - covered if busy else 0
    lead, to_data = [], []
    for p, load in enumerate(loads or []):
        w, t = (p % 2, p // 2) if pingpong else (0, p)
        if t < tiles[w] and load[LOAD_BEGIN] and wg[w][t][MMA_BEGIN]:
            lead.append(wg[w][t][MMA_BEGIN] - load[LOAD_BEGIN])
        if t < tiles[w] and load[LOAD_FREE] and wg[w][t][DATA]:
            to_data.append(wg[w][t][DATA] - load[LOAD_FREE])
    # the CTA's last tile: nothing of its own hides its epilogue (no next tile on the tensor cores)
    last = turns[-1][1] if turns else None
    last_epilogue = [last[EPI_STORED] - last[EPI_BEGIN]] if last and last[EPI_BEGIN] and last[EPI_STORED] else []
    last_end = (last[EPI_END] or last[EPI_STORED]) if last else 0
    after_tensor = [last_end - last[RETIRED]] if last and last[RETIRED] and last_end else []
    loaded = [v for v in (loads or []) if v[LOAD_BEGIN] and v[LOAD_FREE] and v[LOAD_END]]
    stage_wait = [v[LOAD_FREE] - v[LOAD_BEGIN] for v in loaded]
    between = [b[LOAD_BEGIN] - a[LOAD_END] for a, b in zip(loaded, loaded[1:])]
    return {"phases": merged, "handoffs": handoffs, "idle": idle, "tiles": len(turns), "lead": lead,
            "between": between, "stage wait": stage_wait, "to data": to_data, "last epilogue": last_epilogue,
            "after tensor": after_tensor}


def first_free_span(starts: list[float], periods: list[float], tiles: int) -> float:
    """A model of a dynamic scheduler: the span if each tile in turn went to the CTA free first, each
    CTA taking its own measured time per tile (its SM's pace) from its own first tile's start."""
    heap = [(s, c) for c, s in enumerate(starts)]
    heapq.heapify(heap)
    ends = list(starts)
    for _ in range(tiles):
        t, c = heapq.heappop(heap)
        ends[c] = t + periods[c]
        heapq.heappush(heap, (ends[c], c))
    return max(ends) - min(starts)


def across_ctas(cta, ctas: int) -> dict:
    """From each CTA's global-timer readings (its first tile, its last epilogue): the kernel's span, how
    far apart the CTAs finish, and the average share of the span a CTA sits idle after its last tile."""
    ran = [c for c in range(ctas) if (cta[c][TILES0] or cta[c][TILES1]) and cta[c][GLOBAL_NS] and cta[c][LAST_NS]]
    if not ran:
        return {}
    ends = [cta[c][LAST_NS] for c in ran]
    span = max(ends) - min(cta[c][GLOBAL_NS] for c in ran)
    tiles = [cta[c][TILES0] + cta[c][TILES1] for c in ran]
    # each SM's clock rate over the CTA's run: its clock64 and the global timer read together twice
    rates = [(cta[c][LAST_CLOCK] - cta[c][CLOCK]) / (cta[c][LAST_NS] - cta[c][GLOBAL_NS]) for c in ran
             if cta[c][LAST_NS] > cta[c][GLOBAL_NS]]
    starts = [cta[c][GLOBAL_NS] for c in ran]
    periods = [(e - b) / n for e, b, n in zip(ends, starts, tiles)]
    return {"span us": span / 1e3, "end spread us": (max(ends) - min(ends)) / 1e3,
            "first-free span us": first_free_span(starts, periods, sum(tiles)) / 1e3,
            "tail share": sum(max(ends) - e for e in ends) / len(ends) / span if span > 0 else 0.0,
            "tiles per CTA": (min(tiles), max(tiles)), "clock GHz": statistics.median(rates) if rates else None}


def summarize(wg, cta, ctas: int, k_blocks: int | None = None, cycles_per_block: float | None = None,
              loads=None, pingpong: bool = True) -> dict:
    """All CTAs: each phase's quartiles over every tile, handoffs, idle tensor time per tile, the
    producer's lead (loads[c][p]: the producer's clocks of CTA c's p-th tile)."""
    phase_values: dict[str, list[int]] = {p: [] for p in PHASES}
    handoffs: list[int] = []
    lead: list[int] = []
    # per-CTA lists pooled over CTAs: the producer's side and each CTA's last tile
    pooled = {"between": [], "stage wait": [], "to data": [], "last epilogue": [], "after tensor": []}
    idle_per_tile: list[float] = []
    tiles = 0
    for c in range(ctas):
        t = (int(cta[c][TILES0]), int(cta[c][TILES1]))
        if t == (0, 0):
            continue
        s = cta_summary(wg[c], t, loads[c][:int(cta[c][LOADS])] if loads else None, pingpong)
        for p in PHASES:
            phase_values[p] += s["phases"][p]
        handoffs += s["handoffs"]
        lead += s["lead"]
        for key in pooled:
            pooled[key] += s[key]
        if s["tiles"]:
            idle_per_tile.append(s["idle"] / s["tiles"])
        tiles += s["tiles"]
    out = {"ctas": sum(1 for c in range(ctas) if cta[c][TILES0] or cta[c][TILES1]), "tiles": tiles,
           "across CTAs": across_ctas(cta, ctas),
           "phases": {p: quartiles(v) for p, v in phase_values.items()}, "handoff": quartiles(handoffs),
           "idle per tile": quartiles(idle_per_tile), "producer lead": quartiles(lead),
           "producer between tiles": quartiles(pooled["between"]),
           "first stage wait": quartiles(pooled["stage wait"]),
           "first load to data": quartiles(pooled["to data"]),
           "last tile's epilogue": quartiles(pooled["last epilogue"]),
           "after the last k-block": quartiles(pooled["after tensor"])}
    if k_blocks:
        issue = [v / k_blocks for v in phase_values["issue"]]
        out["issue per k-block"] = quartiles(issue)
        if cycles_per_block:
            out["ideal per k-block"] = cycles_per_block
    return out


def report(name: str, s: dict) -> list[str]:
    lines = [f"{name}: {s['ctas']} CTAs, {s['tiles']} tiles; cycles, median [quartiles]"]
    rows = [*((p, s["phases"][p]) for p in PHASES), ("handoff", s["handoff"]), ("idle per tile", s["idle per tile"]),
            ("producer lead", s["producer lead"]), ("producer between tiles", s["producer between tiles"]),
            ("first stage wait", s["first stage wait"]), ("first load to data", s["first load to data"]),
            ("last tile's epilogue", s["last tile's epilogue"]), ("after the last k-block", s["after the last k-block"])]
    if "issue per k-block" in s:
        rows.append(("issue per k-block", s["issue per k-block"]))
    for label, (q1, mid, q3) in rows:
        lines.append(f"  {label:22s} {mid:10.0f} [{q1:.0f}-{q3:.0f}]")
    if "ideal per k-block" in s:
        lines.append(f"  {'peak per k-block':22s} {s['ideal per k-block']:10.0f}")
    a = s.get("across CTAs")
    if a:
        lines.append(f"  across CTAs: span {a['span us']:.1f} us, ends {a['end spread us']:.1f} us apart, "
                     f"idle after the last tile {a['tail share']:.1%} of the span on average, "
                     f"{a['tiles per CTA'][0]}-{a['tiles per CTA'][1]} tiles per CTA"
                     + (f", SM clock {a['clock GHz']:.2f} GHz" if a.get("clock GHz") else ""))
        lines.append(f"  the same tiles each given to the CTA free first, at each CTA's own pace per tile (a model of "
                     f"a dynamic scheduler): span {a['first-free span us']:.1f} us")
        tail = s["after the last k-block"][1]
        if a.get("clock GHz") and a["span us"] > 0 and not math.isnan(tail):     # nan: no CTA's last tile retired
            lines.append(f"  after a CTA's last k-block (median): {tail / a['clock GHz'] / 1e3:.1f} us, "
                         f"{tail / a['clock GHz'] / 1e3 / a['span us']:.1%} of the span")
    return lines


def read(lib) -> tuple[list, list, list, int]:
    """The trace buffer of a loaded trace=tiles library: (wg[c][w][t][e], loads[c][p][e], cta[c][word], CTAs)."""
    import numpy as np
    layout = (ctypes.c_int * 6)()
    lib.function("epic_trace_layout")(layout)
    ctas, tiles, events, load_events, words, size = list(layout)
    buf = np.zeros(size // 8, dtype=np.uint64)
    rc = lib.function("epic_trace_read")(buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(size))
    if rc != 0:
        raise RuntimeError(f"epic_trace_read returned {rc}")
    n_wg = ctas * 2 * tiles * events
    n_load = ctas * 2 * tiles * load_events
    wg = buf[:n_wg].reshape(ctas, 2, tiles, events).astype(np.int64).tolist()
    loads = buf[n_wg:n_wg + n_load].reshape(ctas, 2 * tiles, load_events).astype(np.int64).tolist()
    cta = buf[n_wg + n_load:n_wg + n_load + ctas * words].reshape(ctas, words).astype(np.int64).tolist()
    return wg, loads, cta, ctas


def k_blocks_of(kernel: str, k: int | None) -> tuple[int | None, float | None]:
    """(k-blocks per tile, the tensor cores' peak cycles per k-block) from a kernel's name
    (NAME.ping_128x192x64_c2x1...) and the gemm's K; (None, None) where either is unknown."""
    m = re.search(r"_(\d+)x(\d+)x(\d+)_c", kernel)
    if not m or not k:
        return None, None
    tm, tn, tk = (int(v) for v in m.groups())
    return -(-k // tk), 2 * tm * tn * tk / PEAK_FLOPS_PER_CYCLE


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="a workload of bench/bench.py (e.g. plain_gate_up_k1024)")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--config", default="", help="bench.py's configuration spelling, e.g. ping_128x192x64_c2x1")
    ap.add_argument("--out", default="", help="write the summaries as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from bench import DIMS, ROOT, WORK, parse_config
    import epic
    from epic.runtime import loader
    if args.work not in WORK:
        print(f"tile_trace: unknown work {args.work!r} (bench.py's: {', '.join(WORK)})", file=sys.stderr)
        return 2
    path, make = WORK[args.work]
    _, _, inputs = make(args.rows)
    base = epic.compile(os.path.join(ROOT, path))
    gemms = [k.name for k in base.program.kernels if k.kind == "gemm"]
    override = {**(parse_config(args.config) if args.config else {}), "trace": "tiles"}
    prog = epic.compile(os.path.join(ROOT, path), {g: dict(override) for g in gemms})
    for _ in range(3):                      # builds, loads, first launches
        prog(**inputs)
    torch.cuda.synchronize()
    traced = [lib for lib in loader.loaded() if lib.function("epic_trace_read")]
    if not traced:
        print("tile_trace: no trace=tiles kernel was loaded", file=sys.stderr)
        return 1
    for lib in traced:
        if lib.function("epic_trace_clear")() != 0:
            print(f"tile_trace: could not clear the trace buffer of {lib.path}", file=sys.stderr)
            return 1
    traced_out = prog(**inputs)
    torch.cuda.synchronize()
    # the trace only reads clocks: the traced kernels' outputs are the untraced ones', bit for bit
    plain_out = base(**inputs)
    same = all(torch.equal(traced_out[n], plain_out[n]) for n in plain_out) if isinstance(plain_out, dict) else None
    print(f"outputs equal to the untraced kernels' bit for bit: {same}")
    dims = DIMS.get(args.work, lambda m: {})(args.rows)
    k = dims.get("K", dims.get("D")) if len(gemms) == 1 else None     # a k-block count only where one gemm
    summaries = {}
    for lib in traced:
        wg, loads, cta, ctas = read(lib)
        kernel = lib.path.stem                  # NAME.ping_128x192x64_c2x1_tiles: the name says the tile
        blocks, peak = k_blocks_of(kernel, k)
        summaries[kernel] = summarize(wg, cta, ctas, blocks, peak, loads, ".ping_" in kernel)
        print("\n".join(report(kernel, summaries[kernel])))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"work": args.work, "rows": args.rows, "config": args.config, "outputs_equal": same,
                       "summaries": summaries}, f, indent=1)
    return 0 if same is not False else 1


if __name__ == "__main__":
    sys.exit(main())
