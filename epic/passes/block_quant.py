"""Block quantization as an op: a quantizing store of x divided by its 1xB block scale becomes
block_quant(x, s), an internal op that code generation matches (one node quantizes and stores the
scales), whatever the spelling.

The scale is s = max(block_amax(x, B), floor) / qmax (the prelude's fp8_e4m3_scale, int8_block_scale,
int4_group_scale write block_max(abs(x), B) for the amax, either order of max's operands works). A
stored value is recognised by its algebra, not its tree: it is a product of x, literals and one
m = max(amax, floor) with exponent -1, so x / s, x * (1 / s), x * (qmax / m), x / m * qmax and
qmax * x / m are all block_quant(x, s) with qmax the product of the literals (a cast to the stored
dtype around it changes nothing: the store rounds the same way). Any other value in the
kernel that is the same scale in another spelling (the scales the program stores) becomes s too, so
the node writes them.

Only stores code generation quantizes are rewritten (fp8 and integer tiles of the accumulator's width,
fp8/int8 of half its width), with a positive floor and qmax (an all-zero block must not divide 0 by
0). A kernel that stores a block value other than such a scale is left as it is: the generic block
statistic node (BlockReduceScale) is what handles it. In real numbers the result is the same value;
in floating point the spellings differ by a rounding, as the hoist-block-scale pass's do.
"""
from __future__ import annotations

import math
from fractions import Fraction

from .. import dtypes
from ..ir import primitives as P
from ..ir.core import Store, Value, const, topo_order
from ..shapes import Kind
from .hoist_block_scale import block_dependent
from .patterns import C, Op, V
from .rewrite import copy_with, make

QUANT_TYPES = (dtypes.E4M3, dtypes.E5M2, dtypes.I8)   # stored a byte per value (as D, or a byte per pair)
PACKED_TYPES = (dtypes.I4,)                           # packed two per byte, the accumulator's width only


def _fn(name: str):
    return lambda v: v.attrs["fn"] == name


def _floored_amax():
    x = V("x")
    amaxes = (Op("block_reduce", Op("abs", x), bind="r", where=_fn("max")),
              Op("block_reduce", x, bind="r", where=_fn("amax")))
    return [form for amax in amaxes
            for form in (Op("max", amax, C(bind="floor")), Op("max", C(bind="floor"), amax))]


_FLOORED = _floored_amax()   # m = max(block amax of |x|, floor), either order


def _floored(v: Value):
    """(x, block, floor) when v = max(block amax of x, floor), else None."""
    for pattern in _FLOORED:
        binds: dict = {}
        if pattern.match(v, binds):
            return binds["x"], binds["r"].attrs["block"], float(binds["floor"].attrs["value"])
    return None


def _literal(v: Value) -> Fraction | None:
    value = float(v.attrs["value"]) if P.is_literal(v) else math.nan
    return Fraction(value) if math.isfinite(value) else None


def _factors(v: Value, atom: Value | None = None) -> tuple[Fraction, dict[int, list]] | None:
    """v = coef * prod(f ** e) through products and quotients, not looking into atom: (coef,
    {id: [factor, e]}), or None when a literal is zero or not finite. Walks without recursion (a long
    product is not deep)."""
    coef, out, stack = Fraction(1), {}, [(v, 1)]
    while stack:
        u, e = stack.pop()
        algebra = None if u is atom else P.prim(u.op).algebra
        if algebra == "product":
            stack += [(a, e) for a in u.args]
        elif algebra == "quotient":
            stack += [(u.args[0], e), (u.args[1], -e)]
        elif P.is_literal(u):
            c = _literal(u)
            if not c:
                return None
            coef = coef * c if e > 0 else coef / c
        else:
            out.setdefault(u.id, [u, 0])[1] += e
    return coef, {i: fe for i, fe in out.items() if fe[1]}


def _scaled(v: Value, exponent: int):
    """(x, block, floor, qmax) when v = x * qmax / m (exponent -1: a quantized value) or v = m / qmax
    (exponent +1 and no x: a scale), m = max(block amax of x, floor), floor and qmax positive."""
    found = _factors(v)
    floored = [f for f, _ in found[1].values() if _floored(f) is not None] if found else []
    if len(floored) != 1:
        return None
    m = floored[0]
    x, block, floor = _floored(m)
    coef, factors = _factors(v, atom=x)      # x's own products are its business
    wanted = {m.id: exponent} | ({x.id: 1} if exponent < 0 else {})
    if {i: e for i, (_, e) in factors.items()} != wanted or coef <= 0 or floor <= 0:
        return None
    qmax = coef if exponent < 0 else 1 / coef
    return x, block, floor, float(qmax)


def _quantizing(program, s: Store) -> bool:
    """A store code generation quantizes with the block-scale node (by its dtype and width)."""
    dtype, width = program.tensors[s.tensor].dtype, s.value.shape.width
    return s.value.kind is Kind.TILE and (dtype in QUANT_TYPES + PACKED_TYPES and width == 1
                                         or dtype in QUANT_TYPES and width == Fraction(1, 2))


def _stored(program, s: Store) -> Value:
    """The value a store rounds, under a cast to the store's own dtype (e4m3(q) stored as e4m3: the
    store rounds the same way)."""
    v = s.value
    return v.args[0] if P.family(v.op) is P.Family.CAST and v.dtype is program.tensors[s.tensor].dtype else v


def _quants(program, k) -> dict[int, tuple]:
    """id(store) -> (x, block, floor, qmax) for each quantizing store the pass rewrites in kernel k."""
    dep = block_dependent(k)
    found = {id(s): m for s in k.stores if _quantizing(program, s) and P.family(s.value.op) is not P.Family.BLOCK
             and (m := _scaled(_stored(program, s), -1)) is not None and m[0].id not in dep}
    keys = {(m[0].id,) + m[1:] for m in found.values()}
    for s in k.stores:      # block values stored: each must be one of the scales (the node writes them)
        if s.value.kind is Kind.BLOCK and _key(_scaled(s.value, 1)) not in keys:
            return {}
    return found


def _key(m) -> tuple | None:
    return None if m is None else (m[0].id,) + m[1:]


def _rewrite(program, k, quants: dict[int, tuple]):
    keys = {_key(m) for m in quants.values()}
    new: dict[int, Value] = {}
    scale: dict[tuple, Value] = {}      # key -> the one scale value (the first spelling in the kernel)
    for v in k.values:
        args = tuple(new[a.id] for a in v.args)
        out = copy_with(v, args)
        key = _key(_scaled(v, 1)) if v.kind is Kind.BLOCK else None
        if key in keys:
            out = scale.setdefault(key, out)
        new[v.id] = out
    stores = []
    for s in k.stores:
        m = quants.get(id(s))
        if m is None:
            stores.append(Store(s.tensor, new[s.value.id], s.span))
            continue
        x, block, floor, qmax = m
        key = _key(m)
        if key not in scale:            # x * (qmax / m) names no scale: build m / qmax
            m_value = next(f for f, _ in _factors(_stored(program, s), atom=x)[1].values() if _floored(f) is not None)
            scale[key] = make("div", (new[m_value.id], const(qmax, span=s.value.span)), like=m_value)
        q = make("block_quant", (new[x.id], scale[key]), {"block": block, "floor": floor, "qmax": qmax},
                 like=s.value, name=s.value.name)
        stores.append(Store(s.tensor, q, s.span))
    return k.with_values(topo_order([s.value for s in stores]), stores)


def run(program, trace=None):
    kernels = list(program.kernels)
    for i, k in enumerate(kernels):
        if k.kind != "gemm":
            continue
        quants = _quants(program, k)
        if quants:
            kernels[i] = _rewrite(program, k, quants)
            if trace is not None:
                trace += [f"{k.name}: '{s.tensor}' = block_quant (1x{quants[id(s)][1]} blocks, qmax "
                          f"{quants[id(s)][3]:g})" for s in k.stores if id(s) in quants]
    return program.replace_kernels(kernels, dict(program.tensors))


def unrecognised(program) -> list[str]:
    """The `block-quants-made` guarantee: no store is left that the pass would still rewrite."""
    return [f"kernel {k.name}: store {s.tensor} is still block quantization in elementary ops"
            for k in program.kernels if k.kind == "gemm" for s in k.stores if id(s) in _quants(program, k)]
