"""The configurations `epic tune` tries for one gemm, best guess first.

Everything CUTLASS's sm90 kernels accept that the plan accepts for this gemm (shared memory, block
sizes: epic.plan.config.choose decides, so a candidate is legal exactly when the plan would build
it), ranked by a cost model of the tile grid: the fraction of computed elements that are inside the
matrix (ragged edges), the fraction of the last wave's SMs that have work, and the tile's operand
reuse (a 128x256 tile loads 3/8 of the bytes per flop a 64x64 one does). Launch-time options
(swizzle, raster) do not change the built kernel; they are tried on the best tiles only, and so are
explicit epilogue tiles (wider subtiles: fewer epilogue iterations for more shared memory), and so is
the other K depth (64 or 128: the heuristic takes 128 only for decode grids of many tiles), and so is
tile_order=split_last where the last round of tiles would split along K (the plan never picks it). Where the
output tiles cannot fill half the SMs (decode), split-K is tried on cooperative 128-row tiles: the
split count that comes closest to one full wave. The vendor's gemm (cuBLAS) is a candidate of every
gemm it can run (plan/backend.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from ..diagnostics import EpicError
from ..ir import options as vocab
from ..plan import backend, tail
from ..plan import config as config_mod
from ..plan import tile_grid

SMS = tile_grid.SMS

TILES = {"pingpong": [(64, 64, 64), (64, 128, 64), (64, 256, 64), (128, 128, 64), (128, 192, 64)],
         "cooperative": [(128, 128, 64), (128, 192, 64), (128, 256, 64), (256, 128, 64)]}
CLUSTERS = [(1, 1), (2, 1), (1, 2)]
EPI_WIDTHS = (64, 128)      # explicit epilogue subtile widths tried on the heuristic's tile
RASTERS = vocab.RASTERS     # tile-scheduler raster orders tried on the best two tiles


def score(cfg: config_mod.KernelConfig, m: int, n: int) -> float:
    """Higher is better: useful fraction of the tile grid x last-wave occupancy x operand reuse."""
    tm, tn = cfg.tile_m, cfg.tile_n
    tiles = math.ceil(m / tm) * math.ceil(n / tn) * cfg.splits
    useful = m * n / (tiles * tm * tn)
    waves = math.ceil(tiles / SMS)
    occupancy = tiles / (waves * SMS)
    reuse = (tm * tn / (tm + tn)) / (128 * 256 / (128 + 256))
    return useful * occupancy * min(1.0, reuse) ** 0.5


def override(cfg: config_mod.KernelConfig) -> dict:
    """The per-gemm config dict (epic.compile's `config`) that makes the plan choose cfg."""
    if cfg.vendor:
        return {"backend": cfg.backend}
    out = {"schedule": cfg.schedule, "tile": tuple(cfg.tile), "cluster": tuple(cfg.cluster),
           "swizzle": cfg.swizzle, "raster": cfg.raster}
    if cfg.epi_tile:
        out["epi_tile"] = tuple(cfg.epi_tile)
    if cfg.aux_load != "tma":
        out["aux_load"] = cfg.aux_load
    if cfg.splits != 1:
        out["splits"] = cfg.splits
    out["combine"] = cfg.combine        # always: else the plan's heuristic could add combine=tail (plan/tail.py)
    if cfg.tile_order != "linear":
        out["tile_order"] = cfg.tile_order
    if cfg.load_hint != "evict_normal":
        out["load_hint"] = cfg.load_hint
    out["a_rows"] = cfg.a_rows          # always: the plan's heuristic takes a box for few rows
    return out


def candidates(kernel, tensors: dict, m: int, n: int, limit: int = 6,
               depth: int | None = None, gpu: str | None = None, program=None) -> list[config_mod.KernelConfig]:
    """Up to `limit` configurations of this gemm -- the heuristic's first; then one per (schedule,
    tile), best-ranked first, at the heuristic's cluster where legal; then the other clusters of the
    best tiles (the cost model cannot tell clusters apart) -- then the first two with swizzles 1 and 8
    (the heuristic's may lie between) and the other raster orders (along M, along N, CUTLASS's
    heuristic), the heuristic's tile with wider epilogue subtiles, and split-K where the tiles leave
    most SMs idle; and the heuristic's tile at the other K depth, and with tile_order=split_last where
    its last round of tiles splits (depth needed). gpu: the key of the GPU whose
    heuristic comes first (plan/gpus.py). program (the kernel's): where the plan's heuristic takes
    combine=tail (plan/tail.py), that configuration comes first, the rest with the combine kernel;
    where it does not but the gemm can take the tail, the tail's configuration comes last."""
    heuristic = config_mod.choose(kernel, m, None, tensors, n, depth, gpu)
    # epic's kernels around the heuristic's CUTLASS configuration, and the vendor's gemm where it can
    # run this gemm (first where the heuristic chose it)
    first = config_mod.choose(kernel, m, {"backend": "cutlass"}, tensors, n, gpu=gpu) if heuristic.vendor else heuristic
    vendor = [config_mod.choose(kernel, m, {"backend": b}, tensors, n) for b in vocab.BACKENDS
              if b != "cutlass" and isinstance(backend.vendor_form(kernel, tensors), backend.VendorForm)]
    groups: dict[tuple, list[config_mod.KernelConfig]] = {}
    for schedule, cluster in itertools.product(vocab.SCHEDULES, CLUSTERS):
        for tile in TILES[schedule]:
            try:
                cfg = config_mod.choose(kernel, m, {"schedule": schedule, "tile": tile, "cluster": cluster},
                                        tensors, n)
            except EpicError:          # shared memory, a block wider than the tile, ...
                continue
            group = groups.setdefault((cfg.schedule, cfg.tile), [])
            if all(c.key() != cfg.key() for c in group):
                group.append(cfg)
    for group in groups.values():      # the heuristic's cluster first, then 1x1, 2x1, 1x2
        group.sort(key=lambda c: (c.cluster != first.cluster, CLUSTERS.index(c.cluster)))
    ranked = sorted(groups.values(), key=lambda g: (-score(g[0], m, n), g[0].key()))
    out = [first]
    for group in ranked + [g[1:] for g in ranked]:
        for cfg in group[:1] if group in ranked else group:
            if len(out) < limit and all(c.key() != cfg.key() for c in out):
                out.append(cfg)
    for cfg in out[:2]:                # launch-time options: the same built kernel, timed again
        others = [replace(cfg, swizzle=s) for s in (1, 8) if s != cfg.swizzle]
        others += [replace(cfg, raster=r) for r in RASTERS if r != cfg.raster]
        out += [o for o in others if o not in out]
    for width in EPI_WIDTHS:           # the heuristic's tile with a wider epilogue subtile
        epi = (128 if first.schedule == "cooperative" else 64, width)
        try:
            cfg = config_mod.choose(kernel, m, {**override(first), "epi_tile": epi}, tensors)
        except EpicError:              # shared memory, a block the subtile would split, ...
            continue
        if all(c.key() != cfg.key() for c in out):
            out.append(cfg)
    other = (first.tile_m, first.tile_n, 128 if first.tile[2] == 64 else 64)   # the heuristic's tile, other K depth
    try:
        cfg = config_mod.choose(kernel, m, {**override(first), "tile": other}, tensors, n)
    except EpicError:                  # shared memory: deeper stages leave fewer of them
        cfg = None
    if cfg is not None and all(c.key() != cfg.key() for c in out):
        out.append(cfg)
    cfg = split_last(kernel, tensors, first, m, n, depth, gpu)
    if cfg is not None and all(c.key() != cfg.key() for c in out):
        out.append(cfg)
    out += split_k(kernel, tensors, m, n)
    if program is not None and not heuristic.vendor:
        planned = tail.by_heuristic(program, {kernel.name: first}, {kernel.name: m}, {kernel.name: n}, None,
                                    lambda k, o: config_mod.choose(k, m, o, tensors, n, depth, gpu))
        if planned[kernel.name] != first:
            out = [planned[kernel.name]] + out
        elif tail.refusal(program, kernel) is None and not first.split_k:
            # the tail where the heuristic does not take it (block statistics below 64 rows, N over
            # 8192, a gemm that stores no tile): timed, not assumed
            cfg = config_mod.choose(kernel, m, {"combine": "tail"}, tensors, n, depth, gpu)
            if all(c != cfg for c in out):
                out.append(cfg)
    return vendor + out if heuristic.vendor else out[:1] + vendor + out[1:]


def split_last(kernel, tensors: dict, first: config_mod.KernelConfig, m: int, n: int, depth: int | None,
               gpu: str | None = None) -> config_mod.KernelConfig | None:
    """The heuristic's configuration with tile_order=split_last, where its last round of tiles would
    split (tile_grid.last_round_split: more than one round, enough k-blocks, a grid the scratch holds):
    the CTAs that idle through that round share its k-blocks. None where nothing would split (decode
    grids of one round, the cooperative schedule, split-K, the vendor's gemm) or the depth is unknown."""
    if depth is None or first.vendor or first.tile_order != "linear":
        return None
    try:
        cfg = config_mod.choose(kernel, m, {**override(first), "tile_order": "split_last", "a_rows": 0},
                                tensors, n, depth, gpu)
    except EpicError:                  # an option split_last refuses (cooperative, split-K: options.py)
        return None
    return cfg if tile_grid.last_round_split(cfg, m, n, depth) else None


def split_k(kernel, tensors: dict, m: int, n: int) -> list[config_mod.KernelConfig]:
    """Split-K candidates where a cooperative 128-row tile grid fills less than half the SMs: per tile
    width, the largest split count that keeps the work units within one wave."""
    out = []
    for width in (64, 128, 256):
        tiles = math.ceil(m / 128) * math.ceil(n / width)
        fitting = [s for s in vocab.SPLITS if s > 1 and tiles * s <= SMS]     # none: over half the SMs busy
        if not fitting:
            continue
        try:                           # (splits > 1 makes the plan pick the cooperative schedule)
            out.append(config_mod.choose(kernel, m, {"tile": (128, width, 64), "cluster": (1, 1),
                                                     "splits": max(fitting)}, tensors))
        except EpicError:              # shared memory, a block wider than the tile, ...
            continue
    return out
