"""The primitive operations of the IR: names, arity and category.

Everything else (silu, gelu, rmsnorm, swiglu, rope, row_pick, ...) is defined in the language
itself, in epic/prelude.epi. What each primitive *means* is defined once, by the reference
interpreter (epic/reference.py); codegen maps each to C++.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpInfo:
    name: str
    arity: int
    category: str   # source | unary | binary | compare | select | cast | pair | reduce | block | store


_TABLE: dict[str, OpInfo] = {}


def _add(category: str, arity: int, *names: str) -> None:
    for n in names:
        _TABLE[n] = OpInfo(n, arity, category)


# Sources: the accumulator, tensor loads, literals, runtime sizes, coordinates.
_add("source", 0, "acc", "load", "const", "dim", "row_index", "col_index")
_add("unary", 1, "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "round", "powi")
_add("binary", 2, "add", "sub", "mul", "div", "min", "max")
_add("compare", 2, "eq", "ne", "lt", "le", "gt", "ge")
_add("select", 3, "select")
_add("cast", 1, "cast")
# Pairwise maps over adjacent output columns (2k, 2k+1).
_add("pair", 1, "even", "odd")
_add("pair", 2, "interleave")
# Reductions over a whole row (-> column vector) or column (-> row vector); attrs: axis, fn.
_add("reduce", 1, "reduce")
# Reductions over 1xB blocks of a row (tile-local when B divides the tile width); attrs: fn, block.
_add("block", 1, "block_reduce")

REDUCE_FNS = ("sum", "max", "min", "mean", "lse")
BLOCK_FNS = ("sum", "max", "min")

# Function names as users write them -> (op, attrs)
UNARY_FUNCS = {"abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sin", "cos", "round"}
BINARY_FUNCS = {"min", "max"}
REDUCE_FUNCS = {f"{axis}_{fn}": (axis, fn) for axis in ("row", "col") for fn in REDUCE_FNS}
BLOCK_FUNCS = {f"block_{fn}": fn for fn in BLOCK_FNS}
PAIR_FUNCS = {"even": 1, "odd": 1, "interleave": 2}


def info(op: str) -> OpInfo:
    return _TABLE[op]


def category(op: str) -> str:
    return _TABLE[op].category


BUILTIN_NAMES = (set(UNARY_FUNCS) | BINARY_FUNCS | set(REDUCE_FUNCS) | set(BLOCK_FUNCS)
                 | set(PAIR_FUNCS) | {"select"})
RESERVED = {"acc", "row", "col", "in", "out", "tmp", "def", "gemm", "with", "use", "return"}
