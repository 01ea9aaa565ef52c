"""What a code-generation node implementation is, and the pieces of a kernel description it adds to.

An implementation is a class with a `matches(builder, item)` test and an `emit(builder, item)` that
adds its visitor node(s) to the builder and returns the index of the node carrying the result.
Leaves compute a value (the accumulator, a tensor load, a scalar); stores perform a Store (an extra
output tile, per-tile partials); roots perform the one store that goes through the collective as D.
A node that stock CUTLASS lacks names its C++ header under templates/nodes/ in `header`; the
header's text is printed into the generated source (so the kernel cache key covers it).
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import dtypes


@dataclass
class Node:
    impl: str                 # the implementation class that made it
    type: str                 # C++ type of the visitor node
    args: str                 # C++ initializer of its Arguments
    inputs: list[int]
    comment: str


@dataclass
class Pointer:
    """One entry of the launch's pointer array."""
    role: str            # A | B | D | aux_load | aux_store | row | col | row_partial | col_partial
    tensor: str
    dtype: dtypes.DType
    note: str = ""


@dataclass
class Scalar:
    """One float of the launch's scalar array: a runtime scalar input, or a dimension's size."""
    name: str
    dim: object = None   # a Dim when it is a size


class NodeImpl:
    role = "leaf"                 # leaf | store | root
    covers = ""                   # what it handles, in words: the E702 hint lists these
    header: str | None = None     # custom node header (templates/nodes/...) it needs

    @classmethod
    def matches(cls, b, item) -> bool:
        raise NotImplementedError

    @classmethod
    def emit(cls, b, item) -> int:
        raise NotImplementedError

    @classmethod
    def claims(cls, b, item) -> list:
        """Roots: the other stores this node performs itself (e.g. a block scale's scales)."""
        return []

    @classmethod
    def parts(cls, j: int, v) -> tuple[str, ...]:
        """Leaves: the C expressions of v's columns at pair k inside a functor whose input j is this
        node's result (a leaf of the accumulator's width gives the two columns of the pair)."""
        return (f"in{j}[2 * k]", f"in{j}[2 * k + 1]")
