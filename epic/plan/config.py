"""Kernel configuration (tile, cluster, schedule) of each gemm: a documented heuristic by size,
overridable in the file (`gemm g(...) with tile=128x128x64, schedule=pingpong`) and per call.

Heuristic (chosen from H200 measurements: docs/PERFORMANCE.md, "Tuning"):
  M <= 256     pingpong 64x64x64, cluster 1x1      decode: 64x64 tiles put 64 CTAs on N = 4096 where
                                                   64x128 puts 32, on 132 SMs;
                                                   1x128 blocks: cluster 1x2, the two CTAs share
                                                   each block (not a 64x128 tile); N over 8192:
                                                   64x128, half the waves (SMALL_M_WIDE);
                                                   M <= 64 and at least 96 tiles: K = 128;
                                                   M <= 32, a gemm storing its accumulator
                                                   alone (plain, or the tail's) whose 32-wide
                                                   tiles fit one round (N <= 4224):
                                                   64x32x128, cluster 1x2 (SHORT_ACC);
                                                   a row statistic with N <= 8192, or
                                                   1xB blocks from M = 65: combine=tail
                                                   (plan/tail.py, by_heuristic; the gemm
                                                   then plans without its blocks)
  otherwise    pingpong 128x128x64, cluster 2x1  prefill: the epilogue of one warp group overlaps
               (128x192 where 192-wide tiles     the other's mainloop (LARGE_M, WIDE_N below)
               leave at most 1% of N empty),
               swizzle 8 or less
  on an H100   cooperative 128x256x64 instead of  the pingpong 128x128 tile's slow mode there
  SXM          pingpong 128x128 from M = 4096 for (H100_COOPERATIVE below; plan/gpus.py)
               element-wise epilogues with one
               tile store (and 1xB block
               quantization's scales) and N a
               multiple of 256
The tile width is then narrowed if a 1xB block does not divide it. A file that fixes the tile but
not the schedule gets a schedule that accepts the tile. Unless the file or the call gives one, the
swizzle is the largest (up to 8) that adds no padding tiles to the grid, in whichever raster order
allows it (tile_grid.fitting_order).
"""
from __future__ import annotations

from dataclasses import replace

from ..diagnostics import error
from ..ir import operands
from ..ir import options as vocab
from ..ir import primitives as P
from ..shapes import Kind
from . import epilogue, gpus
from .backend import BACKENDS, prefers_vendor, vendor_form
from .kernel_config import KernelConfig, validate
from .tile_grid import SMS, fitting_order, rounds


def _backend(kernel, override: dict | None) -> str | None:
    """The backend the call (first) or the file asks for, None where neither does; a source that sets
    epic's kernel options (tile, schedule, ...) asks for "cutlass". A source that asks for the vendor's
    gemm may not set those options too: they would mean nothing (E216)."""
    chosen = None
    for source in (kernel.options, override or {}):
        others = sorted(k for k in source or {} if k != "backend" and k not in vocab.SEMANTIC_OPTIONS)
        if source and "backend" not in source and others:
            chosen = "cutlass"              # epic's kernel options ask for epic's kernel
        elif source and "backend" in source:
            chosen = source["backend"]
            if chosen != "cutlass" and others:
                raise error("E216", f"gemm '{kernel.name}': backend={chosen} takes none of epic's kernel options "
                            f"(given: {', '.join(others)})", getattr(kernel, "span", None),
                            f"drop {', '.join(others)}, or drop backend={chosen}")
    if chosen is not None and chosen not in BACKENDS:
        raise error("E216", f"gemm '{kernel.name}': unknown backend '{chosen}'", getattr(kernel, "span", None),
                    f"use {' or '.join(BACKENDS)}")
    return chosen


def block_sizes(kernel) -> set[int]:
    """The 1xB block sizes a gemm's epilogue reduces or stores, in the accumulator's columns (a block of
    a half-width value spans 2B of them): each must divide the tile width."""
    return {int(v.attrs["block"] / v.args[0].shape.width) for v in kernel.values if P.family(v.op) is P.Family.BLOCK} | \
           {int(v.shape.block / v.shape.width) for v in kernel.values if v.kind is Kind.BLOCK and v.shape.block}


# ---------------------------------------------------------------- shared memory
# An sm90 kernel's shared memory holds the mainloop's pipeline stages and the epilogue's buffers;
# CUTLASS gives the mainloop what the epilogue leaves and fails to compile below 2 stages (E217).
# The epilogue's share, as CUTLASS's sm90 builder sizes it (epilogue/collective/builders/
# sm90_builder.inl): D and every aux store take StagesD = min(subtiles, 2) subtiles, every aux load
# StagesC = min(subtiles, 4). Each epilogue node's pattern declares what it stages (plan/epilogue.py);
# the estimate is their sum over the kernel's nodes. The plan only picks configurations that leave 2 stages.
SMEM_BYTES = 232448          # the H100/H200 per-block limit (227 KiB)
SMEM_RESERVE = 4096          # barriers, the tile scheduler, reduction scratch, row/column vectors
VOID_D_BYTES = 2             # a void D with no aux element registered: code generation names bf16


def _epilogue_tile(cfg: KernelConfig, narrow_d: bool) -> tuple[int, int]:
    if cfg.epi_tile:
        return cfg.epi_tile
    m = 128 if cfg.schedule == "cooperative" else 64
    return (m, 64 if narrow_d and cfg.tile_n % 64 == 0 else 32)    # CUTLASS's EpilogueTileAuto


def smem_estimate(kernel, tensors: dict, cfg: KernelConfig) -> tuple[int, int]:
    """(epilogue bytes, bytes of one mainloop stage) of this gemm at this configuration."""
    nodes = epilogue.chosen(kernel, tensors)
    stores = [(p, ctx, s) for p, ctx, s in nodes if p.stage == "d"]    # in store order: the first decides the subtile
    d_bytes = void_d_bytes(nodes)
    # CUTLASS's automatic subtile follows D's element, a void D's being the DAG's ElementAux
    narrow = d_bytes <= 1 if d_bytes is not None else bool(stores) and stores[0][0].staged_bytes(*stores[0][1:]) <= 1
    em, en = _epilogue_tile(cfg, narrow)
    subtiles = (cfg.tile_m // em) * (cfg.tile_n // en)
    epi = epilogue.EpilogueTiling(em, en, min(subtiles, 2), min(subtiles, 4))
    total = sum(p.smem_bytes(ctx, item, epi) for p, ctx, item in nodes)
    total += 0 if d_bytes is None else em * en * epi.stages_d * d_bytes
    stage = (cfg.tile_m + cfg.tile_n) * cfg.tile[2] * tensors[kernel.a].dtype.bits // 8
    return int(total), stage


def void_d_bytes(nodes) -> float | None:
    """Bytes per element of D's staging buffer when no node writes D (None when one does): CUTLASS
    still stages StagesD subtiles of a void D, of the DAG's ElementAux, which code generation sets to
    the first aux element it registers -- the aux stores' in store order, then the root's -- or bf16."""
    if any(p.writes_d for p, _, _ in nodes):
        return None
    in_order = sorted(nodes, key=lambda n: n[0].role == "root")       # stable: the root emits last
    return next((b for p, ctx, item in in_order if (b := p.aux_bytes(ctx, item)) is not None), VOID_D_BYTES)


def fits(kernel, tensors: dict, cfg: KernelConfig) -> bool:
    epi, stage = smem_estimate(kernel, tensors, cfg)
    return epi + 2 * stage <= SMEM_BYTES - SMEM_RESERVE


# What large M tries, best first, until one fits in shared memory (the order was measured on the H200
# with bench/interleaved.py: docs/PERFORMANCE.md, "Tuning"). Pingpong overlaps one warp group's
# epilogue with the other's mainloop; the cooperative schedule runs the epilogue after the mainloop
# on both, where it adds to the time.
LARGE_M = [KernelConfig("pingpong", (128, 128, 64), (2, 1), swizzle=8),
           KernelConfig("cooperative", (128, 128, 64), (2, 1), swizzle=8),
           KernelConfig("cooperative", (128, 64, 64), (2, 1), swizzle=8),
           KernelConfig("pingpong", (64, 64, 64), (1, 1), swizzle=8)]
SMALL_M = [KernelConfig("pingpong", (64, 64, 64), (1, 1))]
# Decode with N over WIDE: 64x128 (bench/results/2026-12-01-h200-interleaved-wide-fold-64.json, M = 64,
# against 64x64): cross entropy (N = 128256) 0.950 / 1.004, gate/up identity (28672) 1.002 / 1.023,
# SwiGLU 1.013 / 1.025. A row of 64x64 tiles fills one wave of 132 SMs up to about N = 8192; at
# N = 14336 it is 1.7 waves, 64x128 tiles one. There (bias + GELU, three runs) the two are level
# after the harness's write flush (1.011-1.019 each) and 64x128 is ahead after a read flush, the L2
# a decode step finds (1.002-1.020 against 1.041-1.057; 2026-12-03-h200-interleaved-decode-tiles-64.log).
SMALL_M_WIDE = [KernelConfig("pingpong", (64, 128, 64), (1, 1))]
# Decode of at most SHORT_A rows (a short box of A), a gemm that stores its accumulator alone (a plain
# gemm, or the gemm of a decode tail, which stores its f32 accumulator for the tail kernel) whose 32-wide
# tiles fit one round on the SMs (N up to 4224 on 132): 64x32x128 tiles on 1x2 clusters, twice the CTAs
# of 64x64 (128 on N = 4096) and half the k-blocks. On an H100 at N = 4096, against 64x64x64
# (bench/results/2026-12-07-h100-short-acc-tiles.log): plain 0.892 / 0.918 at M = 1, 0.895 / 0.926 at
# 16, 0.966 / 0.998 at 32; residual + RMSNorm (tail) 0.969 / 0.997, 0.970 / 0.997, 1.058 / 1.084. At
# N = 6144 (192 tiles: two rounds) they were slower: plain 0.998-1.022 against 0.954-0.989. At M = 64
# (no short box) level: plain 0.987 / 0.991, residual + RMSNorm 1.088 / 1.095, so the rule stops at
# SHORT_A. (fp8 1x128 with the tail on these tiles read 0.994-1.103 against 1.015-1.112 for its blocks
# in the gemm's epilogue at M = 1-32, QK-norm + RoPE 1.004-1.129 against 1.015-1.120: not taken.) A tile
# 32 wide runs only such gemms (E216 otherwise): the forms checked on a GPU (64x32 tiles with bias + GELU
# and RoPE epilogues read 1.088 and 1.125 against 1.013 and 1.058 at M = 64,
# bench/results/2026-12-01-h200-interleaved-tile-n32-64.json).
SHORT_ACC = [KernelConfig("pingpong", (64, 32, 128), (1, 2))]
# Tiles 192 wide where they cover N with at most 1% of empty columns (N = 6144, 14336, 28672, 128256):
# a wider tile reads each A tile fewer times; where a third of the last column of tiles would be empty
# (N = 4096) the empty part costs more (bench/results/2026-12-02-h200-interleaved-wide-tiles.json and
# 2026-12-01-h200-interleaved-configs.json).
WIDE_N = [KernelConfig("pingpong", (128, 192, 64), (2, 1), swizzle=8)]
# On an H100 (plan/gpus.py) the pingpong 128x128 tile at N = 4096 runs in two modes, about 0.99 and
# 1.15 of cuBLAS, and mostly the slow one; cooperative 128x256 is steady at 1.00-1.01 (four machines:
# docs/PERFORMANCE.md, "On an H100 the default tile at N = 4096 has a slow mode"). Back to back at
# M = 8192 the plain gemm 0.4066 against 0.4396 ms, the down gemm (K = 14336) 1.3786 against 1.5308
# (bench/results/2026-12-07-h100-n4096-coop.log). Not where the epilogue has a row statistic: residual +
# RMSNorm read level or slower with it (0.4587 against 0.4547 ms; on another machine 0.4555 against
# 0.4514, interleaved 1.160 against 1.147), and on the H200 the cooperative tile is slower (plain 1.012
# against 0.987: 2026-12-01-h200-interleaved-defaults.json). 1xB block quantization (a block statistic
# as the scale of a quantizing store, its scales a second store) takes it too: fp8 1x128 at M = 4096 /
# 8192, interleaved 1.028 / 1.042 against 1.157 / 1.135, back to back 0.2103 / 0.4217 against 0.2195 /
# 0.4324 ms (2026-12-07-h100-n4096-blocks-tiles.log, -stats-tiles.log). Not QK-norm + RoPE (a block
# statistic and a pair map): interleaved 1.142 / 1.129 against 1.171 / 1.111, back to back slower
# (0.2240 / 0.4472 against 0.2221 / 0.4368 ms).
H100_COOPERATIVE = [KernelConfig("cooperative", (128, 256, 64), (2, 1), swizzle=8)]
H100_COOPERATIVE_ROWS = 4096
ELEMENT_FAMILIES = (P.Family.SOURCE, P.Family.ELEMENTWISE, P.Family.COMPARE, P.Family.SELECT, P.Family.CAST)
# what an epilogue may compute and still take H100_COOPERATIVE: element-wise math and block statistics
H100_COOPERATIVE_FAMILIES = ELEMENT_FAMILIES + (P.Family.BLOCK,)
WIDE = 8192       # decode (M <= 256) takes 64x128 tiles above this N
# Decode gemms of at most 64 rows whose grid has at least DEEP_K_TILES tiles take K = 128 tiles (half
# the mainloop iterations, each loading twice as much). M = 64, two runs (L2 flushed by a read and by a write; bench/results/
# 2026-12-03-h200-interleaved-decode-k128.log), K = 64 / 128: with 96 tiles (N = 6144) RoPE 1.079 /
# 1.046 and 1.062 / 1.042, its plain gemm 1.022 / 0.997 and 1.017 / 1.004; with 112 and 224 (64x128
# tiles at N = 14336 and 28672) bias + GELU 1.025 / 1.015 and 1.019 / 1.009, SwiGLU 1.031 / 1.026 and
# 1.024 / 1.017; but with 64 (N = 4096) K = 128 was slower on every workload: plain 1.017 / 1.025 and
# 1.025 / 1.043, residual + RMSNorm 1.205 / 1.214, fp8 quant 1.160 / 1.183 (write flush). M = 65 to
# 256 keeps K = 64: not measured there.
DEEP_K_TILES = 96


def _wide(n: int | None) -> bool:
    return n is not None and n > 0 and 100 * (-n % 192) <= n


def split_block(cfg: KernelConfig, block: int) -> bool:
    """The configuration shares each 1 x block block between a 1x2 cluster's CTAs (vocab.shares_block)."""
    return vocab.shares_block(cfg.tile_n, cfg.cluster, cfg.schedule, cfg.splits, block)


def _with_blocks(cfg: KernelConfig, blocks, split: bool = False) -> KernelConfig:
    """The tile widened to every block that does not divide it; with split (decode), a block twice the
    tile's width is shared by a 1x2 cluster's two CTAs instead: twice the CTAs of a block-wide tile."""
    for b in sorted(blocks or ()):
        if cfg.tile_n % b == 0 or split_block(cfg, b):   # powers of two: only a wider block fails to divide
            continue
        if split and cfg.tile_n * 2 == b and tuple(cfg.cluster) == (1, 1):
            cfg = replace(cfg, cluster=(1, 2))
        else:
            cfg = replace(cfg, tile=(cfg.tile_m, b, cfg.tile[2]))
    return cfg


def heuristic(m: int, blocks: set[int] | None = None, kernel=None, tensors: dict | None = None,
              n: int | None = None, gpu: str | None = None, acc_only: bool = False) -> KernelConfig:
    """n: the gemm's N where the sizes are known (None: not a wide one); gpu: the key of the GPU the
    plan is for (plan/gpus.py); acc_only: the gemm stores its accumulator alone (stores_acc_only)."""
    large = WIDE_N + LARGE_M if _wide(n) else LARGE_M
    if gpu == gpus.H100 and _h100_cooperative(kernel, tensors, m, n):
        large = H100_COOPERATIVE + large
    small = SMALL_M_WIDE + SMALL_M if n is not None and n > WIDE else SMALL_M
    if acc_only and 0 < m <= SHORT_A and n is not None and n > 0 and rounds(SHORT_ACC[0], m, n).scheduled <= SMS:
        small = SHORT_ACC + small
    ladder = [_with_blocks(c, blocks, split=m <= 256) for c in (small if m <= 256 else large)]
    if m <= 64 and n is not None and n > 0:      # measured at M = 64 only (one row of tiles)
        ladder = [c for base in ladder for c in _deep_k(base, m, n)]
    if kernel is not None:
        for cfg in ladder:
            if fits(kernel, tensors, _block_epilogue(cfg, blocks)):
                return cfg
    return ladder[0]


def _h100_cooperative(kernel, tensors: dict | None, m: int, n: int | None) -> bool:
    """Where an H100 takes H100_COOPERATIVE: many rows, N a multiple of 256 that 192-wide tiles do not
    fit, and an epilogue that computes each element from its own (no row or column statistic, no pair
    map) and stores one tile; or 1xB block quantization: block statistics as the scales of a tile store
    of 8 bits or fewer, the scales a second store. (A block statistic that does not quantize, as
    QK-norm's head RMS, was not measured alone: it keeps the default.)"""
    if kernel is None or tensors is None or n is None or m < H100_COOPERATIVE_ROWS or n % 256 or _wide(n):
        return False
    tiles = [s for s in kernel.stores if s.value.kind is Kind.TILE]
    others = [s for s in kernel.stores if s.value.kind is not Kind.TILE]
    if len(tiles) != 1 or any(s.value.kind is not Kind.BLOCK for s in others):
        return False
    if not all(P.family(v.op) in H100_COOPERATIVE_FAMILIES for v in kernel.values):
        return False
    blockwise = any(P.family(v.op) is P.Family.BLOCK for v in kernel.values)
    return not blockwise or tensors[tiles[0].tensor].dtype.bits <= 8


def stores_acc_only(kernel, combine: str | None) -> bool:
    """The gemm's epilogue stores its accumulator and nothing else: one store of the accumulator (a plain
    gemm, a derived backward's dX or dW), or combine=tail (the gemm stores its f32 accumulator, and the
    tail kernel after it runs the epilogue)."""
    if combine == "tail":
        return True
    return len(kernel.stores) == 1 and P.is_accumulator(kernel.stores[0].value.op)


def _deep_k(cfg: KernelConfig, m: int, n: int) -> list[KernelConfig]:
    """A decode configuration, preceded by its K = 128 variant where its grid has DEEP_K_TILES tiles
    or more (the variant's deeper stages take more shared memory: the K = 64 one stays behind it)."""
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    deep = tiles >= DEEP_K_TILES and cfg.tile[2] == 64
    return ([replace(cfg, tile=(cfg.tile_m, cfg.tile_n, 128))] if deep else []) + [cfg]


def _tile_for(schedule: str, tile: tuple[int, int, int]) -> tuple[int, int, int]:
    """The heuristic's tile, or with M changed to one the schedule accepts (cooperative 128, pingpong 64)."""
    if not vocab.combination_problems(schedule, tile, None):
        return tile
    return ((128 if schedule == "cooperative" else 64),) + tuple(tile[1:])


def _schedule_for(tile: tuple[int, int, int], preferred: str) -> str:
    """The preferred schedule if it accepts the tile's M, else the other one."""
    if not vocab.combination_problems(preferred, tile, None):
        return preferred
    return next((s for s in vocab.SCHEDULES if not vocab.combination_problems(s, tile, None)), preferred)


def _block_epilogue(cfg: KernelConfig, blocks) -> KernelConfig:
    """A 1xB block must not span two epilogue subtiles (CUTLASS's automatic one is 32 columns wide):
    an epilogue tile as wide as the largest block (free for 8-bit outputs; tests/probes/README.md)."""
    if blocks and cfg.epi_tile is None:
        width = cfg.tile_n if any(split_block(cfg, b) for b in blocks) else max(max(blocks), 32)
        if cfg.tile_n % width == 0:
            return replace(cfg, epi_tile=(128 if cfg.schedule == "cooperative" else 64, width))
    return cfg


# Decode: a call with at most SHORT_A rows loads a box of A of the fewest rows of vocab.A_ROWS that hold
# them, not the tile's 64 (templates/nodes/epic_nodes/short_a_mainloop.hpp). The plain gemm with 64-row
# boxes took 22.7 us at M = 1 against 18.5 us at M = 64 (docs/PERFORMANCE.md, "Below 33 rows"); with the
# box it reads 0.920 of cuBLAS at M = 1 against 1.112 (H100, bench/results/2026-12-07-h100-short-a.log).
# Only the pingpong schedule's 64-row tiles, clusters 1x1 and 1x2: the forms checked on a GPU.
SHORT_A = 32


def short_a_rows(cfg: KernelConfig, m: int) -> int:
    """The heuristic's a_rows for a call of m rows on cfg (0: the tile's rows)."""
    if cfg.split_k or cfg.vendor or cfg.tile_order == "split_last" or not 0 < m <= SHORT_A:
        return 0          # (split_last: a decode call has one round of tiles, nothing to split)
    rows = next(r for r in vocab.A_ROWS if r and m <= r)
    return 0 if vocab.short_a_problems(rows, cfg.schedule, cfg.tile_m, cfg.cluster) else rows


def choose(kernel, m: int, override: dict | None, tensors: dict, n: int | None = None,
           depth: int | None = None, gpu: str | None = None) -> KernelConfig:
    """The configuration of one gemm: call-time override > options in the file > heuristic (the
    first configuration of its ladder whose shared memory leaves the mainloop 2 stages).
    n, depth: the gemm's N and K where the sizes are known (the heuristic takes wide tiles for some
    N, and the vendor's gemm for a vocabulary-sized dimension: plan/backend.py); gpu: the key of the GPU
    the plan is for (plan/gpus.py)."""
    backend = _backend(kernel, override)
    if backend is None and prefers_vendor(kernel, tensors, m, n, depth):
        backend = "cublas"
    if backend not in (None, "cutlass"):
        form = vendor_form(kernel, tensors)
        if isinstance(form, str):
            raise error("E216", f"gemm '{kernel.name}' cannot run on backend={backend}: {form}",
                        getattr(kernel, "span", None), "leave backend out (epic's own kernel fuses the epilogue)")
        return KernelConfig("pingpong", (128, 128, 64), backend=backend)
    # a gemm whose epilogue runs in a tail kernel stores its accumulator only: no blocks to fit
    combine = next((src["combine"] for src in (override or {}, kernel.options or {}) if "combine" in src), None)
    blocks = () if combine == "tail" else block_sizes(kernel)
    acc_only = stores_acc_only(kernel, combine)
    cfg = heuristic(m, blocks, kernel, tensors, n, gpu, acc_only)
    split_cluster = any(split_block(cfg, b) for b in blocks)   # the heuristic's 1x2 cluster shares blocks
    tile_fixed = False      # a tile the file or the call chose is kept (a bad combination is E216)
    schedule_fixed = False  # so is a schedule
    cluster_fixed = False
    swizzle_fixed = False   # and a swizzle (else the heuristic's is lowered where it would pad the grid)
    raster_fixed = False
    for source in (kernel.options, override or {}):
        source = {k: v for k, v in (source or {}).items() if k != "backend"}
        if source:
            cluster_fixed = cluster_fixed or "cluster" in source
            swizzle_fixed = swizzle_fixed or "swizzle" in source
            raster_fixed = raster_fixed or "raster" in source
            tile = tuple(source.get("tile", cfg.tile))
            tile_fixed = tile_fixed or "tile" in source
            splits = int(source.get("splits", cfg.splits))
            # split-K exists for the cooperative schedule only: asking for it picks that schedule
            preferred = "cooperative" if splits > 1 and not schedule_fixed else cfg.schedule
            schedule = source.get("schedule") or (_schedule_for(tile, preferred) if "tile" in source else preferred)
            schedule_fixed = schedule_fixed or "schedule" in source
            if schedule != cfg.schedule and not tile_fixed:
                tile = _tile_for(schedule, tile)
            epi = source.get("epi_tile", cfg.epi_tile)
            cfg = KernelConfig(schedule, tile, tuple(source.get("cluster", cfg.cluster)),
                               source.get("aux_load", cfg.aux_load), tuple(epi) if epi else None,
                               int(source.get("swizzle", cfg.swizzle)), source.get("raster", cfg.raster), splits,
                               source.get("combine", cfg.combine), trace=source.get("trace", cfg.trace),
                               tile_order=source.get("tile_order", cfg.tile_order),
                               load_hint=source.get("load_hint", cfg.load_hint),
                               a_rows=int(source.get("a_rows", cfg.a_rows)))
    if split_cluster and not cluster_fixed and not any(split_block(cfg, b) for b in blocks):
        cfg = replace(cfg, cluster=(1, 1))     # an override made the tile (or split-K) leave the blocks whole
    if not tile_fixed:
        cfg = _with_blocks(cfg, blocks)        # ... or made the tile narrower than a block: widen it
    cfg = _block_epilogue(cfg, blocks)
    a_k_major = operands.kernel_majors(kernel, tensors)[0] == "k"
    if not any("a_rows" in (src or {}) for src in (kernel.options, override)):
        cfg = replace(cfg, a_rows=short_a_rows(cfg, m) if a_k_major else 0)
    elif cfg.a_rows and not a_k_major:
        raise error("E216", f"gemm '{kernel.name}': a_rows={cfg.a_rows} loads the first rows of a K-major A "
                    "([M, K] row-major); this gemm's A is M-major", getattr(kernel, "span", None),
                    "leave a_rows out")
    if not swizzle_fixed and n is not None and m > 0 and n > 0:
        swizzle, raster = fitting_order(cfg, m, n, raster_fixed)
        cfg = replace(cfg, swizzle=swizzle, raster=raster)
    cfg = validate(cfg, f"gemm '{kernel.name}'", getattr(kernel, "span", None))
    if cfg.tile_n < 64 and not acc_only:
        raise error("E216", f"gemm '{kernel.name}' ({cfg}): a tile {cfg.tile_n} wide runs a gemm that stores its "
                    "accumulator alone (a plain gemm, or the gemm of combine=tail: the forms checked on a GPU); "
                    "this one's epilogue computes more", getattr(kernel, "span", None),
                    "choose a tile 64 or more wide, or leave the tile out")
    if cfg.a_rows and m > cfg.a_rows:
        raise error("E216", f"gemm '{kernel.name}' ({cfg}): a_rows={cfg.a_rows} reads {cfg.a_rows} rows of A per "
                    f"tile, and this call has {m} rows", getattr(kernel, "span", None),
                    f"leave a_rows out (the plan chooses it for calls of at most 32 rows), or give a_rows at least {m}")
    if not fits(kernel, tensors, cfg):
        epi, stage = smem_estimate(kernel, tensors, cfg)
        raise error("E217", f"gemm '{kernel.name}' ({cfg}): its epilogue needs about {epi // 1024} KiB of shared "
                    f"memory, which leaves the mainloop fewer than 2 pipeline stages of {stage // 1024} KiB",
                    kernel.span, "store fewer tiles in this gemm (split its outputs over two gemms), store them in "
                    "a narrower type, or choose a smaller tile or epilogue tile (with tile=..., epi_tile=...)")
    for b in blocks:
        split = split_block(cfg, b)
        if cfg.tile_n % b and not split:
            raise error("E404", f"gemm '{kernel.name}': block size {b} does not divide the tile width {cfg.tile_n}",
                        kernel.span, "pick a tile width that is a multiple of the block size, or half of it with "
                        "cluster=1x2 and the pingpong schedule (the cluster's two CTAs then share each block)")
        if split and cfg.epi_tile and cfg.epi_tile[1] != cfg.tile_n:
            raise error("E404", f"gemm '{kernel.name}': a block of {b} shared by a 1x2 cluster needs the epilogue "
                        f"tile as wide as the CTA tile ({cfg.tile_n}), not {cfg.epi_tile[1]}", kernel.span,
                        f"leave epi_tile out, or give it {cfg.tile_n} columns")
        if not split and cfg.epi_tile and cfg.epi_tile[1] % b:     # a block is reduced within one epilogue subtile
            raise error("E404", f"gemm '{kernel.name}': block size {b} does not divide the epilogue tile width "
                        f"{cfg.epi_tile[1]}", kernel.span,
                        f"pick an epilogue tile width that is a multiple of {b}, or leave epi_tile out")
    return cfg
