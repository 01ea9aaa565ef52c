"""A gemm's kernel configuration (schedule, tile, cluster, tile order, ...): what each field means, the
name of the kernel it builds (`key`), and which combinations are legal (`problems`, `validate`: E216).
Choosing one is plan/config.py's job."""
from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import error
from ..ir import options as vocab
from .backend import BACKENDS

SCHEDULES, AUX_LOADS, RASTERS = vocab.SCHEDULES, vocab.AUX_LOADS, vocab.RASTERS


@dataclass(frozen=True)
class KernelConfig:
    schedule: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int] = (1, 1)
    # how the epilogue reads extra [M, N] tiles: "tma" stages them through shared memory (what the
    # collective builder sizes), "direct" loads registers straight from global memory and leaves the
    # shared memory to the mainloop's pipeline
    aux_load: str = "tma"
    epi_tile: tuple[int, int] | None = None   # epilogue subtile (None: CUTLASS's EpilogueTileAuto)
    # persistent tile scheduler: swizzle of the tile order (1, 2, 4, 8) and raster direction
    # ("heuristic", "m", "n"). Launch-time arguments: they do not change the built kernel.
    swizzle: int = 1
    raster: str = "heuristic"
    # split-K (cooperative only): each output tile's K loop divided among this many CTAs, whose
    # partial accumulators are added in a fixed order before the epilogue runs once, on the last.
    # The number is a launch argument; splits > 1 builds the kernel with CUTLASS's stream-K scheduler.
    splits: int = 1
    # a row statistic's combine kernel: launched after the gemm ("kernel"), folded into the gemm's
    # epilogue ("fold": the last CTA of each row block merges its partials; no second launch), or the
    # whole epilogue moved after the gemm ("tail": the gemm stores its accumulator, plan/tail.py)
    combine: str = "kernel"
    # which library runs the gemm (plan/backend.py): "cublas" uses none of the fields above
    backend: str = "cutlass"
    # "tiles": the kernel records each warp group's phases of each tile (a diagnostic build,
    # templates/nodes/epic_nodes/tile_trace.hpp)
    trace: str = "off"
    # the persistent scheduler's tile order: "linear" (CUTLASS's), "serpentine" (every odd group of
    # the swizzle walked backwards; templates/nodes/epic_nodes/serpentine_tile_scheduler.hpp) or
    # "dynamic" (CUTLASS's order, each tile to the cluster that asks first; dynamic_tile_scheduler.hpp)
    # or "split_last" (CUTLASS's order, the last round's tiles split along K; split_last_round.hpp)
    tile_order: str = "linear"
    # the L2 policy of the mainloop's TMA loads: "evict_normal" (CUTLASS's) or "none" (no policy operand;
    # templates/nodes/epic_nodes/unhinted_loads_mainloop.hpp)
    load_hint: str = "evict_normal"
    # the rows of A each mainloop load reads (8, 16, 32; 0: the tile's M): a kernel for calls of at most
    # that many rows (templates/nodes/epic_nodes/short_a_mainloop.hpp)
    a_rows: int = 0

    @property
    def vendor(self) -> bool:
        return self.backend != "cutlass"

    @property
    def raster_code(self) -> int:
        return RASTERS.index(self.raster)

    @property
    def tile_m(self) -> int:
        return self.tile[0]

    @property
    def tile_n(self) -> int:
        return self.tile[1]

    def __str__(self) -> str:
        if self.vendor:
            return f"{self.backend} (the vendor's gemm, through torch.mm)"
        return (f"{self.schedule} {'x'.join(map(str, self.tile))} cluster {self.cluster[0]}x{self.cluster[1]}"
                + (f" aux_load={self.aux_load}" if self.aux_load != "tma" else "")
                + (f" epilogue {self.epi_tile[0]}x{self.epi_tile[1]}" if self.epi_tile else "")
                + (f" swizzle {self.swizzle}" if self.swizzle != 1 else "")
                + (f" raster {self.raster}" if self.raster != "heuristic" else "")
                + (f" splits {self.splits}" if self.splits != 1 else "")
                + (f" combine={self.combine}" if self.combine != "kernel" else "")
                + (f" trace={self.trace}" if self.trace != "off" else "")
                + (f" tile_order={self.tile_order}" if self.tile_order != "linear" else "")
                + (f" load_hint={self.load_hint}" if self.load_hint != "evict_normal" else "")
                + (f" a_rows={self.a_rows}" if self.a_rows else ""))

    def key(self) -> str:
        """Names the built kernel: only what changes the code (not swizzle/raster/the split count)."""
        if self.vendor:
            return self.backend
        return (f"{self.schedule[:4]}_{'x'.join(map(str, self.tile))}_c{self.cluster[0]}x{self.cluster[1]}"
                + (f"_{self.aux_load}" if self.aux_load != "tma" else "")
                + (f"_e{self.epi_tile[0]}x{self.epi_tile[1]}" if self.epi_tile else "")
                + ("_splitk" if self.split_k else "")
                + (f"_{self.combine}" if self.combine != "kernel" else "")
                + (f"_{self.trace}" if self.trace != "off" else "")
                + ("_serp" if self.tile_order == "serpentine" else "")
                + ("_dyn" if self.tile_order == "dynamic" else "")
                + ("_splitlast" if self.tile_order == "split_last" else "")
                + ("_nohint" if self.load_hint == "none" else "")
                + (f"_a{self.a_rows}" if self.a_rows else ""))

    @property
    def split_k(self) -> bool:
        return self.splits > 1


def problems(cfg: KernelConfig) -> list[str]:
    if cfg.backend not in BACKENDS:
        return [f"backend must be one of {', '.join(BACKENDS)}"]
    out = [p for p in (vocab.value_problem("tile", cfg.tile), vocab.value_problem("cluster", cfg.cluster),
                       vocab.value_problem("swizzle", cfg.swizzle), vocab.value_problem("splits", cfg.splits),
                       vocab.value_problem("epi_tile", cfg.epi_tile) if cfg.epi_tile else None) if p]
    if cfg.schedule not in SCHEDULES:
        out.append(f"unknown schedule '{cfg.schedule}' (use {' or '.join(SCHEDULES)})")
    if cfg.aux_load not in AUX_LOADS:
        out.append(f"aux_load must be one of {', '.join(AUX_LOADS)}")
    if cfg.raster not in RASTERS:
        out.append(f"raster must be one of {', '.join(RASTERS)}")
    if cfg.combine not in vocab.COMBINES:
        out.append(f"combine must be one of {', '.join(vocab.COMBINES)}")
    if cfg.trace not in vocab.TRACES:
        out.append(f"trace must be one of {', '.join(vocab.TRACES)}")
    if cfg.tile_order not in vocab.TILE_ORDERS:
        out.append(f"tile_order must be one of {', '.join(vocab.TILE_ORDERS)}")
    if cfg.load_hint not in vocab.LOAD_HINTS:
        out.append(f"load_hint must be one of {', '.join(vocab.LOAD_HINTS)}")
    return out + vocab.combination_problems(cfg.schedule, cfg.tile, cfg.epi_tile, cfg.splits, cfg.combine,
                                            cfg.trace, cfg.tile_order, cfg.load_hint, cfg.a_rows, cfg.cluster)


def validate(cfg: KernelConfig, where: str = "", span=None) -> KernelConfig:
    found = problems(cfg)
    if found:
        raise error("E216", f"bad kernel configuration{' for ' + where if where else ''} ({cfg}): "
                    + "; ".join(found), span,
                    "change the gemm's `with` options or the call's config (cooperative: tile M 128/256; "
                    "pingpong: tile M 64/128; splits > 1: cooperative)")
    return cfg
