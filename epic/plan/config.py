"""Kernel configuration (tile, cluster, schedule) of each gemm: a documented heuristic by size,
overridable in the file (`gemm g(...) with tile=128x128x64, schedule=pingpong`) and per call.

Heuristic (measured on the H200 with bench/bench.py; numbers in docs/PERFORMANCE.md):
  M <= 256     pingpong 64x64x64, cluster 1x1      decode: 64x64 tiles put 64 CTAs on N = 4096 where
                                                   64x128 puts 32 (1.25x vs 1.41x cuBLAS for
                                                   resid_norm at M = 64, 1.03x vs 1.17x plain)
  otherwise    cooperative 128x256x64, cluster 2x1 prefill: best of the sweep for every workload;
               tile scheduler swizzle 8      (identity epilogue at N = 14336: 1.07x -> 0.99x cuBLAS)
The tile width is then narrowed if a 1xB block does not divide it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..diagnostics import Diagnostic, EpicError

SCHEDULES = ("cooperative", "pingpong")


AUX_LOADS = ("tma", "direct")
RASTERS = ("heuristic", "m", "n")     # CUTLASS RasterOrderOptions: Heuristic, AlongM, AlongN


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
        return (f"{self.schedule} {'x'.join(map(str, self.tile))} cluster {self.cluster[0]}x{self.cluster[1]}"
                + (f" aux_load={self.aux_load}" if self.aux_load != "tma" else "")
                + (f" epilogue {self.epi_tile[0]}x{self.epi_tile[1]}" if self.epi_tile else "")
                + (f" swizzle {self.swizzle}" if self.swizzle != 1 else "")
                + (f" raster {self.raster}" if self.raster != "heuristic" else ""))

    def key(self) -> str:
        """Names the built kernel: only what changes the code (not swizzle/raster)."""
        return (f"{self.schedule[:4]}_{'x'.join(map(str, self.tile))}_c{self.cluster[0]}x{self.cluster[1]}"
                + (f"_{self.aux_load}" if self.aux_load != "tma" else "")
                + (f"_e{self.epi_tile[0]}x{self.epi_tile[1]}" if self.epi_tile else ""))


def validate(cfg: KernelConfig, where: str = "") -> KernelConfig:
    m, n, k = cfg.tile
    problems = []
    if cfg.schedule not in SCHEDULES:
        problems.append(f"unknown schedule '{cfg.schedule}' (use {' or '.join(SCHEDULES)})")
    if cfg.schedule == "cooperative" and m not in (128, 256):
        problems.append("the cooperative schedule needs tile M = 128 or 256")
    if cfg.schedule == "pingpong" and m not in (64, 128):
        problems.append("the pingpong schedule needs tile M = 64 or 128")
    if n not in (64, 128, 256):
        problems.append("tile N must be 64, 128 or 256")
    if k not in (64, 128):
        problems.append("tile K must be 64 or 128")
    if cfg.cluster not in ((1, 1), (2, 1), (1, 2), (2, 2)):
        problems.append("cluster must be 1x1, 2x1, 1x2 or 2x2")
    if cfg.aux_load not in AUX_LOADS:
        problems.append(f"aux_load must be one of {', '.join(AUX_LOADS)}")
    if cfg.swizzle not in (1, 2, 4, 8):
        problems.append("swizzle must be 1, 2, 4 or 8")
    if cfg.raster not in RASTERS:
        problems.append(f"raster must be one of {', '.join(RASTERS)}")
    if cfg.epi_tile is not None:
        em, en = cfg.epi_tile
        if m % em or n % en or en % 16 or em % (128 if cfg.schedule == "cooperative" else 64):
            problems.append("the epilogue tile must divide the CTA tile, with M a multiple of 64 (128 for the "
                            "cooperative schedule) and N a multiple of 16")
    if problems:
        raise EpicError(Diagnostic("E215", f"bad kernel configuration{' for ' + where if where else ''}: "
                                   + "; ".join(problems), None))
    return cfg


def heuristic(m: int, blocks: set[int] | None = None) -> KernelConfig:
    if m <= 256:
        cfg = KernelConfig("pingpong", (64, 64, 64), (1, 1))
    else:
        cfg = KernelConfig("cooperative", (128, 256, 64), (2, 1), swizzle=8)
    for b in blocks or ():
        if cfg.tile_n % b:   # powers of two: only a block wider than the tile fails to divide it
            cfg = KernelConfig(cfg.schedule, (cfg.tile_m, b, cfg.tile[2]), cfg.cluster)
    return cfg


def choose(kernel, m: int, override: dict | None = None) -> KernelConfig:
    """The configuration of one gemm: call-time override > options in the file > heuristic."""
    from ..checks.layout import block_sizes
    cfg = heuristic(m, block_sizes(kernel))
    for source in (kernel.options, override or {}):
        if source:
            epi = source.get("epi_tile", cfg.epi_tile)
            cfg = KernelConfig(source.get("schedule", cfg.schedule), tuple(source.get("tile", cfg.tile)),
                               tuple(source.get("cluster", cfg.cluster)), source.get("aux_load", cfg.aux_load),
                               tuple(epi) if epi else None, int(source.get("swizzle", cfg.swizzle)),
                               source.get("raster", cfg.raster))
    cfg = validate(cfg, f"gemm '{kernel.name}'")
    for b in block_sizes(kernel):
        if cfg.tile_n % b:
            raise EpicError(Diagnostic("E404", f"gemm '{kernel.name}': block size {b} does not divide the tile "
                                       f"width {cfg.tile_n}", kernel.span,
                                       "pick a tile width that is a multiple of the block size"))
    return cfg
