"""How buffers that are not plain [M, N] tensors are laid out in memory: the one rule that the plan
(sizes, byte ledger), the runtime (allocation), the reference interpreter and the kernels share."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def partial_shape(axis: str, rows: int, width: int, tile_m: int, tile_n: int) -> tuple:
    """Per-tile partials of a reduction, as the gemm writes them: tile-major, so the threads of a
    warp read consecutive floats when a combine kernel merges them.
      axis "row" (one value per row and column tile): [ceil(width / tile N), round_up(rows, tile M)]
      axis "col" (one value per column and row tile): [ceil(rows / tile M), round_up(width, tile N)]
    Padding rows/columns hold the reduction's identity."""
    if axis == "row":
        return (cdiv(width, tile_n), round_up(rows, tile_m))
    return (cdiv(rows, tile_m), round_up(width, tile_n))


def packed_int4_shape(rows: int, width: int) -> tuple:
    """An i4 output: two values per byte, low nibble = even column, so a uint8 [rows, width / 2]."""
    return (rows, width // 2)
