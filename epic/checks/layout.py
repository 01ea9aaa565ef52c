"""Layout legality: which columns sit together in registers, and what TMA can move.

Some rules are decided by the program alone (a width-changed value cannot be reduced); others
depend on runtime sizes (pairwise maps need an even width; every global tensor's contiguous
dimension must be a multiple of 16 bytes for TMA). Those become Requirements: checked statically
when the dimension is a literal or provably a multiple, and again when sizes are known
(`epic ref/plan --shape`, and before a compiled program launches).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import dtypes, sizes as sizes_mod
from ..diagnostics import Diagnostic, Span
from ..ir import options as vocab
from ..ir import primitives as P
from ..ir.core import GemmKernel, Program
from ..shapes import Dim, Kind
from . import row_finish

TMA_BYTES = 16
MAX_TILE_N = 256


@dataclass(frozen=True)
class Requirement:
    dim: Dim            # must be a whole multiple of `multiple`
    multiple: int
    code: str
    span: Span | None
    what: str           # "the row length of z (bf16)" ...
    why: str

    def proven(self) -> bool | None:
        """True/False when decidable without sizes, None when it depends on them."""
        c = self.dim.coef
        if not self.dim.names:
            return c.denominator == 1 and int(c) % self.multiple == 0
        if c.denominator == 1 and int(c) % self.multiple == 0:
            return True
        return None

    def holds(self, sizes: dict[str, int]) -> bool:
        v = sizes_mod.exact(self.dim, sizes)
        return v.denominator == 1 and int(v) % self.multiple == 0

    def diagnostic(self, value: Fraction | None = None) -> Diagnostic:
        got = f" (it is {value})" if value is not None else ""
        rule = "a whole number" if self.multiple == 1 else f"a multiple of {self.multiple}"
        return Diagnostic(self.code, f"{self.what} = {self.dim}{got} must be {rule}: {self.why}",
                          self.span, _HINTS.get(self.code))


_HINTS = {
    "E401": "pairwise maps read columns 2k and 2k+1 together: use an even width",
    "E403": "pad the tensor's last dimension, e.g. to a multiple of 8 elements for 16-bit types",
    "E405": "int4 packs two adjacent columns per byte",
}


def requirements(program: Program) -> list[Requirement]:
    reqs: list[Requirement] = []
    for t in program.tensors.values():
        if t.block and len(t.dims) == 2:   # [M, N/B]: the blocks must tile the row exactly
            reqs.append(Requirement(t.dims[1], 1, "E404", t.span, f"the number of 1x{t.block} blocks of '{t.name}'",
                                    f"a block size must divide the row ({t.block} columns per block)"))
        # block values (quantization scales) and packed int4 tiles are written by the epilogue's own
        # stores, not by TMA: only tiles, operands and partials have the 16-byte rule
        if len(t.dims) != 2 or t.block or t.dtype is dtypes.I4:
            continue
        contiguous = t.dims[0] if t.layout == "kmajor" else t.dims[1]
        per16 = Fraction(TMA_BYTES * 8, t.dtype.bits)   # elements per 16 bytes
        reqs.append(Requirement(contiguous, int(per16), "E403", t.span,
                                f"the contiguous dimension of '{t.name}' ({t.dtype})",
                                "TMA moves rows in 16-byte units"))
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        pairs: dict[tuple, tuple] = {}      # one requirement per place and width (rope: even and odd)
        for v in k.values:
            if P.prim(v.op).pair_part is not None:
                width = k.n * v.args[0].shape.width
                _, _, ops = pairs.setdefault((str(v.span), str(width)), (v.span, width, []))
                if v.op not in ops:
                    ops.append(v.op)
        for span, width, ops in pairs.values():
            reqs.append(Requirement(width, 2, "E401", span, f"the width paired by {' and '.join(ops)}",
                                    "columns are paired (2k, 2k+1)"))
        for s in k.stores:
            t = program.tensors[s.tensor]
            if t.dtype is dtypes.I4:
                reqs.append(Requirement(t.dims[1], 2, "E405", s.span, f"the width of int4 output '{t.name}'",
                                        "two values share a byte"))
    return reqs


def check_static(program: Program) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for r in requirements(program):
        if r.proven() is False:
            out.append(r.diagnostic(r.dim.coef))
    for k in program.kernels:
        if k.kind == "gemm":
            out.extend(_width_changes(k))
            out.extend(_block_sizes(k))
    out.extend(_row_scales_read_otherwise(program))
    return _distinct(out)


def check_sizes(program: Program, sizes: dict[str, int]) -> list[Diagnostic]:
    out = []
    for r in requirements(program):
        if not r.holds(sizes):
            out.append(r.diagnostic(sizes_mod.exact(r.dim, sizes)))
    return _distinct(out)


def _distinct(diags: list[Diagnostic]) -> list[Diagnostic]:
    """One diagnostic per code, location and message: the pairwise maps a definition like rope
    expands into all point at the call, and saying the same thing eight times helps nobody."""
    seen, out = set(), []
    for d in diags:
        key = (d.code, str(d.span) if d.span else None, d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _width_changes(k: GemmKernel) -> list[Diagnostic]:
    """A value whose width differs from the accumulator's must end in a store: the per-tile partials
    of a reduction are laid out on the accumulator's columns."""
    out = []
    for v in k.values:
        if P.family(v.op) in (P.Family.REDUCE, P.Family.BLOCK):
            x = v.args[0]
            # a 1xB block of a half-width value is 1x2B of the accumulator's columns: tile-local too
            # (SwiGLU then block-scaled fp8: one value per column pair, samples/swiglu_fp8_quant.epi)
            half_block = P.family(v.op) is P.Family.BLOCK and x.shape.width == Fraction(1, 2)
            if x.shape.width != 1 and v.kind is not Kind.SCALAR and not half_block:   # a whole-tensor step reads a vector
                what = f"{v.attrs.get('axis', 'block')}_{v.attrs['fn']}"
                out.append(Diagnostic(
                    "E402", f"{what} reduces a value of width {x.shape.width} x N (after a pairwise map that "
                    "changes the width); a width-changing map must feed a store", v.span,
                    "store the narrowed value (tmp y: bf16 = ...) and reduce it in the gemm that reads it, "
                    "or reduce before the pairwise map"))
    return out


def _row_scales_read_otherwise(program: Program) -> list[Diagnostic]:
    """A tile scaled by a whole-row statistic is stored unscaled, its scale moved into the gemms that
    read it as their A operand (the defer-row-scale pass): a gemm reading it transposed (`.T`) or as
    its B operand would multiply the unscaled tile. Refused here, before the pass."""
    from .locality import reductions_feeding
    out = []
    unscalable = row_finish.unscalable_reads(program)
    for i, k in enumerate(program.kernels):
        if k.kind != "gemm":
            continue
        dep = reductions_feeding(k)
        for s in k.stores:
            if (s.value.kind is not Kind.TILE or s.value.id not in dep or dep[s.value.id].attrs["axis"] != "row"
                    or row_finish.finished_after_row(k, s, program.tensors[s.tensor], dep, unscalable)):
                continue
            for c in program.kernels[i + 1:]:
                if c.kind != "gemm":
                    continue
                stat = f"{dep[s.value.id].attrs['axis']}_{dep[s.value.id].attrs['fn']}"
                how = "transposed (.T)" if c.a == s.tensor and c.a_t else \
                    "as its B operand" if c.b == s.tensor else None
                note = [(s.span, f"'{s.tensor}' is stored here")] if s.span else []
                if how:
                    out.append(Diagnostic(
                        "E502", f"gemm '{c.name}' reads '{s.tensor}' {how}, but '{s.tensor}' needs a whole-row "
                        f"statistic ({stat}), whose scale can move only into a gemm that reads it as its A "
                        "operand, untransposed", c.span,
                        "store the statistic (out r: f32[M] = ...) and the unscaled tile separately, and apply "
                        "the scale where the tile is read (as a column vector of the gemm that reads it)", note))
    return out


def _block_sizes(k: GemmKernel) -> list[Diagnostic]:
    out = []
    tile = k.options.get("tile")     # fixed in the file: a block must divide its width
    epi = k.options.get("epi_tile")  # and the epilogue subtile's: a block is reduced within one subtile

    def shared(tile_n: int, b: int) -> bool:   # options the file leaves out are the planner's to choose
        return vocab.shares_block(tile_n, k.options.get("cluster", ()), k.options.get("schedule", "pingpong"),
                                  int(k.options.get("splits", 1)), b)
    for v in k.values:
        if P.family(v.op) is P.Family.BLOCK:
            b = v.attrs["block"]
            if b & (b - 1) or not 8 <= b <= MAX_TILE_N:
                out.append(Diagnostic("E404", f"block size {b} must be a power of two between 8 and {MAX_TILE_N}",
                                      v.span, "a block must divide the tile width (64, 128 or 256 columns): "
                                      "use 32, 64 or 128"))
                continue
            b = int(b / v.args[0].shape.width)      # in the accumulator's columns (2B for a half-width value)
            size = f"block size {b}" if b == v.attrs["block"] else \
                f"a 1x{v.attrs['block']} block of a half-width value ({b} accumulator columns)"
            if b > MAX_TILE_N:
                out.append(Diagnostic("E404", f"a 1x{v.attrs['block']} block of a half-width value spans {b} "
                                      f"columns of the accumulator; a tile holds at most {MAX_TILE_N}", v.span,
                                      f"use a block of at most {MAX_TILE_N // 2} columns after a width-halving map"))
            elif tile and tile[1] % b and not shared(tile[1], b):
                out.append(Diagnostic("E404", f"{size} does not divide the tile width {tile[1]} of gemm "
                                      f"'{k.name}' (with tile={'x'.join(map(str, tile))})", v.span,
                                      f"pick a tile width that is a multiple of {b}, or a smaller block, or half "
                                      f"of {b} with cluster=1x2 and the pingpong schedule (the cluster's two CTAs "
                                      "then share each block)"))
            elif epi and tile and shared(tile[1], b) and epi[1] != tile[1]:
                out.append(Diagnostic("E404", f"a block of {b} shared by a 1x2 cluster needs the epilogue tile as wide "
                                      f"as the CTA tile ({tile[1]}) in gemm '{k.name}', not {epi[1]}", v.span,
                                      f"leave epi_tile out, or give it {tile[1]} columns"))
            elif epi and epi[1] % b and not (tile and shared(tile[1], b)):
                out.append(Diagnostic("E404", f"{size} does not divide the epilogue tile width {epi[1]} of "
                                      f"gemm '{k.name}' (with epi_tile={'x'.join(map(str, epi))}): a block must sit "
                                      "in one epilogue subtile", v.span,
                                      f"pick an epilogue tile width that is a multiple of {b}, or leave epi_tile out"))
    return out



