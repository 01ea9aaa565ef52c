"""The persistent tile grid of an sm90 kernel: which tiles its scheduler walks (padding to clusters and
swizzle groups, as templates/nodes/epic_nodes/grouped_tile_scheduler.hpp does), how many CTAs CUTLASS
launches for them, how they fill rounds of one tile per CTA, the swizzle and raster order that pad the
grid least, and what tile_order=split_last does with the last round. The plan (config.choose), the
ledger (`epic plan`) and the tuner's candidates read it; nothing here chooses a configuration."""
from __future__ import annotations

from dataclasses import dataclass

from .kernel_config import KernelConfig


def _log_swizzle(blocks_m: int, blocks_n: int, most: int) -> int:
    """CUTLASS's sm90 persistent scheduler's own reduction of the swizzle (get_log_swizzle_size)."""
    shortest = min(blocks_m, blocks_n)
    for log, need in ((3, 6), (2, 3), (1, 2)):
        if most >= 1 << log and shortest >= need:
            return log
    return 0


def _raster(cfg: KernelConfig, blocks_m: int, blocks_n: int, raster: str | None = None) -> str:
    """The raster order the scheduler runs: "heuristic" resolves as CUTLASS's does (along M where
    there are more columns of tiles than rows)."""
    raster = raster or cfg.raster
    if raster == "heuristic":
        return "m" if blocks_n > blocks_m else "n"
    return raster


def padded_tiles(cfg: KernelConfig, m: int, n: int, swizzle: int, raster: str | None = None) -> int:
    """The tiles epic's persistent scheduler walks (templates/nodes/epic_nodes/grouped_tile_scheduler.hpp):
    each dimension's tile count rounded up to the cluster, and the dimension the swizzle groups (M when
    rastering along N, N along M) to swizzle x cluster; padding tiles are scheduled (and idle) like real
    ones. (CUTLASS's own scheduler rounds both dimensions to swizzle x cluster.)"""
    cm, cn = cfg.cluster
    bm, bn = -(-m // cfg.tile_m), -(-n // cfg.tile_n)
    bm, bn = -(-bm // cm) * cm, -(-bn // cn) * cn
    step = 1 << _log_swizzle(bm, bn, swizzle)
    if _raster(cfg, bm, bn, raster) == "n":
        bm = -(-bm // (step * cm)) * step * cm
    else:
        bn = -(-bn // (step * cn)) * step * cn
    return bm * bn


SMS = 132   # SMs of an H100 / H200 SXM: a persistent kernel runs one CTA per SM


@dataclass(frozen=True)
class Rounds:
    """How a gemm's tiles fill the persistent grid: `scheduled` tiles (the output's, times the split
    count, plus the scheduler's padding tiles) on `grid` CTAs, one tile per CTA per round. Every CTA
    whose share is a round short sits idle while the last round runs."""
    tiles: int
    scheduled: int
    grid: int

    @property
    def rounds(self) -> float:
        return self.scheduled / self.grid

    @property
    def last(self) -> int:
        """CTAs with a tile in the last round."""
        return self.scheduled - (-(-self.scheduled // self.grid) - 1) * self.grid

    @property
    def idle(self) -> float:
        """The share of the grid's tile slots (whole rounds x CTAs) with no output tile: the last round's
        empty slots and the padding tiles."""
        return 1 - self.tiles / (-(-self.scheduled // self.grid) * self.grid)

    def describe(self, sms: int = SMS) -> str:
        padding = self.scheduled - self.tiles
        pad = f" (with {padding:,} padding tiles)" if padding else ""
        if self.scheduled <= self.grid:
            return (f"{self.scheduled:,} tile{'s' if self.scheduled != 1 else ''}{pad}: one round on "
                    f"{self.scheduled} of {sms} SMs")
        return (f"{self.scheduled:,} tiles{pad} on {self.grid} CTAs: {self.rounds:.2f} rounds, the last with "
                f"{self.last} of {self.grid} busy (tile slots idle: {self.idle:.1%})")


# tile_order=split_last's kernel (templates/nodes/epic_nodes/split_last_round.hpp and last_round_plan.hpp):
# a cluster's share of the last round must be this many k-blocks, and its scratch holds this many CTAs
SPLIT_MIN_SHARE = 4
SPLIT_MAX_CTAS = 144


def last_round_split(cfg: KernelConfig, m: int, n: int, depth: int, sms: int = SMS) -> str | None:
    """What tile_order=split_last does with the last round of cfg's kernel at m x n x depth on `sms` SMs
    (the rule of last_round_plan.hpp's LastRoundPlan::make), in words; None where it splits nothing."""
    if cfg.tile_order != "split_last" or cfg.split_k or cfg.vendor:
        return None
    r = rounds(cfg, m, n, sms)
    cs = cfg.cluster[0] * cfg.cluster[1]
    left = (r.scheduled % r.grid) // cs
    k_blocks = -(-depth // cfg.tile[2])
    clusters = r.grid // cs
    if r.grid > SPLIT_MAX_CTAS or left == 0 or left * k_blocks < SPLIT_MIN_SHARE * clusters:
        return None
    share = left * k_blocks / clusters
    return (f"the last round's {left * cs} tiles split along K over all {r.grid} CTAs (tile_order=split_last): "
            f"{share:.1f} of a tile's {k_blocks} k-blocks each")


def rounds(cfg: KernelConfig, m: int, n: int, sms: int = SMS) -> Rounds:
    """The tile rounds of cfg's persistent kernel at m x n on `sms` SMs (split-K: one unit per split of
    a tile, CUTLASS's stream-K scheduler, padding not modelled)."""
    cm, cn = cfg.cluster
    real = -(-m // cfg.tile_m) * -(-n // cfg.tile_n) * cfg.splits
    if cfg.splits > 1:
        scheduled = real
    else:
        scheduled = padded_tiles(cfg, m, n, cfg.swizzle)
    grid = min(scheduled, persistent_ctas(sms, cm * cn))
    return Rounds(real, scheduled, grid)


def persistent_ctas(sms: int, cluster_size: int) -> int:
    """The CTAs CUTLASS's sm90 persistent scheduler launches for clusters of this size (its
    get_grid_shape without an occupancy query): GPCs of at most 18 SMs, each filled with whole clusters,
    so 132 SMs take 132 CTAs in clusters of 1 or 2 and 116 in clusters of 4."""
    if cluster_size == 1:
        return sms
    per_gpc = 18
    gpcs, residual = (1, 0) if sms < per_gpc else divmod(sms, per_gpc)
    ctas = gpcs * (per_gpc - per_gpc % cluster_size) + residual - residual % cluster_size
    return min(sms, ctas)


def fitting_order(cfg: KernelConfig, m: int, n: int, raster_fixed: bool = False) -> tuple[int, str]:
    """The largest swizzle up to the configuration's, and a raster order, that pad the tile grid no
    more than swizzle 1: a padding tile costs a wave slot like a real one, while a larger swizzle
    keeps a wave's operands in L2 (docs/PERFORMANCE.md, "Tile order"). The
    configuration's raster order first; unless the file or the call fixed it, the other where only
    that one groups a dimension the swizzle divides (N = 14336 on 128x192 tiles: 75 columns and 64 rows
    of tiles; along N with swizzle 8, grouping rows). So does the LM head + cross entropy (668 columns):
    its 1 GB B read 4 times instead of its 64 MB A 167 times with swizzle 4 along M, 3.5% faster under
    sustained load (docs/PERFORMANCE.md, "Tile order")."""
    if cfg.swizzle <= 1:
        return cfg.swizzle, cfg.raster
    least = padded_tiles(cfg, m, n, 1)
    rasters = [cfg.raster] if raster_fixed else [cfg.raster] + [r for r in ("m", "n") if r != cfg.raster]
    for s in (8, 4, 2):
        for r in rasters:
            if s <= cfg.swizzle and padded_tiles(cfg, m, n, s, r) == least:
                return s, r
    return 1, cfg.raster
