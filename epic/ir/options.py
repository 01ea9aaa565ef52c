"""The vocabulary of a gemm's kernel options (`gemm g(...) with tile=128x256x64, schedule=pingpong`)
and which values and combinations CUTLASS's sm90 kernels accept. The front end checks what a file
says (with its location); the plan checks the final configuration (file, call overrides and
heuristic together)."""
from __future__ import annotations

SCHEDULES = ("cooperative", "pingpong")
AUX_LOADS = ("tma", "direct")
RASTERS = ("heuristic", "m", "n")     # CUTLASS RasterOrderOptions: Heuristic, AlongM, AlongN
SWIZZLES = (1, 2, 4, 8)
# which library runs the gemm: epic's CUTLASS kernel, or the vendor's (epic/plan/backend.py)
BACKENDS = ("cutlass", "cublas")
# where a row statistic's per-tile partials are merged: a combine kernel launched after the gemm, or
# the gemm itself ("fold": the last CTA to finish a row of tiles merges that row block in tile order),
# or neither: "tail", the gemm stores its accumulator and one kernel after it runs the whole epilogue and
# the combine's math, one CTA per row (epic/plan/tail.py)
COMBINES = ("kernel", "fold", "tail")
# split-K: the K loop of every output tile divided among this many CTAs, reduced in a fixed order
# (CUTLASS's stream-K tile scheduler in its split-K mode, deterministic reduction)
SPLITS = (1, 2, 3, 4, 6, 8)
# trace=tiles: each warp group's phases of each tile, timed in the kernel (templates/nodes/epic_nodes/
# tile_trace.hpp, bench/tile_trace.py); a diagnostic build, never chosen by the heuristic or the tuner
TRACES = ("off", "tiles")
# the order a persistent kernel's CTAs take their tiles in: CUTLASS's (groups of `swizzle` clusters, each
# walked along the other dimension), or serpentine, every odd group walked backwards so that a group
# starts where the one before ended, on operands still in L2 (as QuACK's sm90 scheduler;
# templates/nodes/epic_nodes/serpentine_tile_scheduler.hpp); or dynamic, CUTLASS's order handed out at
# run time, each cluster taking the next tile from a counter when it needs one
# (templates/nodes/epic_nodes/dynamic_tile_scheduler.hpp); or split_last, CUTLASS's order with the last
# round of tiles split along K over every CTA, so that those with no tile left share its k-blocks
# (pingpong only; templates/nodes/epic_nodes/split_last_round.hpp). Built into the kernel.
TILE_ORDERS = ("linear", "serpentine", "dynamic", "split_last")
# the L2 cache policy the mainloop's TMA loads of A and B carry: CUTLASS's EVICT_NORMAL operand, or none
# (QuACK's sm90 loads: SASS `desc[URZ]`; templates/nodes/epic_nodes/unhinted_loads_mainloop.hpp).
# Built into the kernel.
LOAD_HINTS = ("evict_normal", "none")
# the rows of A each of the mainloop's TMA loads reads, where a call has fewer rows than the tile (decode):
# a box of 8, 16 or 32 rows into the top of the tile instead of the tile's M rows, most of them past M
# (templates/nodes/epic_nodes/short_a_mainloop.hpp); 0: the tile's M rows, as CUTLASS's mainloop. Built
# into the kernel, which then takes at most that many rows. The plan's choice for calls of at most 32 rows.
A_ROWS = (0, 8, 16, 32)
TILE_M = (64, 128, 256)
TILE_N = (32, 64, 128, 192, 256)
TILE_K = (64, 128)
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2))

# options written as sizes: name -> (allowed numbers of parts, example)
SIZE_OPTIONS = {"tile": ((2, 3), "128x128x64"), "cluster": ((2,), "2x1"), "epi_tile": ((2,), "128x64")}
# options chosen from a set: name -> the spellings
CHOICE_OPTIONS = {"backend": BACKENDS, "schedule": SCHEDULES, "aux_load": AUX_LOADS, "raster": RASTERS, "combine": COMBINES,
                  "swizzle": tuple(str(s) for s in SWIZZLES), "splits": tuple(str(s) for s in SPLITS),
                  "trace": TRACES, "tile_order": TILE_ORDERS,
                  "load_hint": LOAD_HINTS, "a_rows": tuple(str(r) for r in A_ROWS)}
INT_OPTIONS = ("swizzle", "splits", "a_rows")
# options that change what the program computes, not how fast: the file says them, a call cannot
# (b_major: the memory order of a B operand declared inline: K-major, the default, or N-major)
SEMANTIC_OPTIONS = {"accumulate": ("f32", "f16"), "b_major": ("k", "n")}
ALL_OPTIONS = (*SIZE_OPTIONS, *CHOICE_OPTIONS, *SEMANTIC_OPTIONS)


def value_problem(key: str, value) -> str | None:
    """What is wrong with one option's value on its own, or None."""
    if key == "tile":
        m, n, k = value
        bad = [f"M must be {_or(TILE_M)}" if m not in TILE_M else None,
               f"N must be {_or(TILE_N)}" if n not in TILE_N else None,
               f"K must be {_or(TILE_K)}" if k not in TILE_K else None]
        bad = [b for b in bad if b]
        return f"tile {m}x{n}x{k}: " + "; ".join(bad) if bad else None
    if key == "cluster" and tuple(value) not in CLUSTERS:
        return "cluster must be " + _or(["x".join(map(str, c)) for c in CLUSTERS])
    if key == "epi_tile":
        em, en = value
        if em not in (64, 128, 256) or en % 16 or not 16 <= en <= 256:
            return ("the epilogue tile must be 64, 128 or 256 rows by a multiple of 16 columns up to 256 "
                    f"(got {em}x{en})")
    if key == "swizzle" and int(value) not in SWIZZLES:
        return "swizzle must be " + _or(SWIZZLES)
    if key == "splits" and int(value) not in SPLITS:
        return "splits must be " + _or(SPLITS)
    return None


def combination_problems(schedule: str, tile: tuple[int, int, int], epi_tile: tuple[int, int] | None,
                         splits: int = 1, combine: str = "kernel", trace: str = "off",
                         tile_order: str = "linear", load_hint: str = "evict_normal", a_rows: int = 0,
                         cluster=(1, 1)) -> list[str]:
    """What CUTLASS's sm90 schedules refuse in a complete configuration (and what epic's own mainloops
    were not checked with)."""
    m, n, _ = tile
    out = []
    if a_rows not in A_ROWS:
        out.append("a_rows must be " + _or(A_ROWS))
    elif a_rows:
        out += short_a_problems(a_rows, schedule, m, cluster)
    if a_rows and splits > 1:
        out.append(f"a_rows={a_rows} changes the persistent kernels' mainloop; the split-K kernel "
                   f"(splits={splits}) keeps CUTLASS's")
    if trace != "off" and splits > 1:
        out.append(f"trace={trace} times the persistent kernels' tiles; the split-K kernel (splits={splits}) is "
                   "not traced")
    if tile_order != "linear" and splits > 1:
        out.append(f"tile_order={tile_order} orders the persistent scheduler's tiles; the split-K kernel "
                   f"(splits={splits}) has CUTLASS's stream-K scheduler, which keeps its own order")
    if load_hint != "evict_normal" and splits > 1:
        out.append(f"load_hint={load_hint} changes the persistent kernels' mainloop; the split-K kernel "
                   f"(splits={splits}) keeps CUTLASS's")
    if tile_order == "split_last" and schedule != "pingpong":
        out.append("tile_order=split_last needs the pingpong schedule (its kernel is CUTLASS's pingpong with "
                   "the last round's tiles split along K)")
    if tile_order == "split_last" and a_rows:
        out.append(f"tile_order=split_last keeps CUTLASS's loads of A; a_rows={a_rows} was not checked with it")
    if tile_order == "split_last" and trace != "off":
        out.append(f"trace={trace} records CUTLASS's kernel body; tile_order=split_last has epic's own")
    if splits > 1 and combine == "fold":
        out.append(f"combine=fold does not work with splits={splits} (the split-K scheduler's epilogue is not "
                   "the one that merges a row block); use combine=kernel")
    if splits > 1 and schedule != "cooperative":
        out.append(f"splits={splits} needs the cooperative schedule (CUTLASS's pingpong kernel has no split-K "
                   "tile scheduler)")
    if schedule == "cooperative" and m not in (128, 256):
        out.append("the cooperative schedule needs tile M = 128 or 256")
    if schedule == "pingpong" and m not in (64, 128):
        out.append("the pingpong schedule needs tile M = 64 or 128")
    if epi_tile is not None:
        em, en = epi_tile
        if m % em or n % en or em % (128 if schedule == "cooperative" else 64):
            out.append(f"the epilogue tile {em}x{en} must divide the CTA tile {m}x{n}, with M a multiple of "
                       f"{128 if schedule == 'cooperative' else 64} for the {schedule} schedule")
    return out


def short_a_problems(a_rows: int, schedule: str, tile_m: int, cluster) -> list[str]:
    """Why a short box of A (a_rows) does not run on this schedule, tile M and cluster: it runs on the
    forms checked on a GPU, the pingpong schedule's 64-row tiles with clusters 1x1 and 1x2."""
    out = []
    if schedule != "pingpong" or tile_m != 64:
        out.append(f"a_rows={a_rows} runs on the pingpong schedule's 64-row tiles (the form checked on a GPU), "
                   f"not on {schedule} {tile_m}-row tiles")
    if tuple(cluster)[0] != 1:
        out.append(f"a_rows={a_rows} runs with clusters 1x1 and 1x2 (a 2x1 cluster's second CTA would lie past "
                   "the call's rows)")
    return out


def shares_block(tile_n: int, cluster, schedule: str, splits: int, block: int) -> bool:
    """A 1 x block block split over the two CTAs of a 1x2 cluster (the tile half a block wide): each
    reduces its half and the two exchange them (templates/nodes/epic_nodes/detail.hpp,
    exchange_halves). Pingpong without split-K only: what was verified on the H200."""
    return tile_n * 2 == block and tuple(cluster) == (1, 2) and splits == 1 and schedule == "pingpong"


def _or(values) -> str:
    values = [str(v) for v in values]
    return ", ".join(values[:-1]) + " or " + values[-1] if len(values) > 1 else values[0]
