"""What a code-generation node implementation is, and the pieces of a kernel description it adds to.

Which node computes a value or performs a store is decided by the patterns of plan/epilogue.py (the
root ops each matches, a benefit, the shared memory it stages: the plan needs them before code
generation). Each implementation here is its pattern's emitter: a subclass of the pattern (listed
first) with an `emit(builder, item)` that adds its visitor node(s) to the builder and returns the
index of the node carrying the result. A node that stock CUTLASS lacks names its C++ header under
templates/nodes/ in `header`; the header's text is printed into the generated source (so the kernel
cache key covers it).
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
    header: str | None = None     # custom node header (templates/nodes/...) it needs

    @classmethod
    def emit(cls, b, item) -> int:
        raise NotImplementedError

    @classmethod
    def parts(cls, j: int, v) -> tuple[str, ...]:
        """Leaves: the C expressions of v's columns at pair k inside a functor whose input j is this
        node's result (a leaf of the accumulator's width gives the two columns of the pair)."""
        return (f"in{j}[2 * k]", f"in{j}[2 * k + 1]")
