"""The node implementations of code generation, and the one place that says a value or a store has
none (E702).

Which node computes a value or performs a store is the plan's patterns' choice (plan/epilogue.py:
indexed by root op, the largest benefit wins); each pattern's emitter is the class here of the same
name, a subclass of it (leaves.py, stores.py, packed.py, and the custom nodes whose C++ lives under
templates/nodes/). Adding a kind of node is adding a pattern there and its emitter here.
"""
from __future__ import annotations

from ...diagnostics import Span, error
from ...plan import epilogue
from ...plan.epilogue import LEAVES, ROOTS, STORES
from .base import Node, NodeImpl, Pointer, Scalar
from .leaves import AccFetch, AuxLoad, ColBroadcast, HalfWidthLoad, RowBroadcast, ScalarBroadcast
from .custom import BlockReduceScale, BlockScaleD, BlockScaleHalfWidth, BlockScaleInt4, Coordinate, PackedInt4Store, PeriodicRowBroadcast, RowLsePartial
from .packed import DoubleWidthAux, DoubleWidthD, DoubleWidthLoad, HalfWidthAux, HalfWidthD, HalfWidthPairD
from .stores import AuxStore, ColPartial, DStore, E8m0Store, RowPartial

# each pattern's emitter: the pattern is the emitter's first base
EMITTERS: dict[type, type[NodeImpl]] = {impl.__mro__[1]: impl for impl in (
    AccFetch, ScalarBroadcast, AuxLoad, PeriodicRowBroadcast, RowBroadcast, ColBroadcast, DoubleWidthLoad, Coordinate,
    HalfWidthLoad, BlockScaleD, BlockScaleInt4, BlockScaleHalfWidth, BlockReduceScale, DStore, HalfWidthD, HalfWidthPairD,
    DoubleWidthD,
    AuxStore, E8m0Store, HalfWidthAux, DoubleWidthAux, PackedInt4Store, RowPartial, ColPartial, RowLsePartial)}
assert set(EMITTERS) == set(LEAVES + ROOTS + STORES), "a pattern without an emitter, or the reverse"


def _emitter(pattern):
    return None if pattern is None else EMITTERS[pattern]


def leaf(b, v) -> type[NodeImpl] | None:
    """The leaf node computing value v, or None (the functor computes it)."""
    return _emitter(epilogue.leaf(b, v))


def store_nodes(b):
    """(root, stores) as epilogue.store_nodes, with emitters for patterns."""
    root, rest = epilogue.store_nodes(b)
    return (None if root is None else (_emitter(root[0]), root[1])), [(_emitter(p), s) for p, s in rest]


def no_implementation(what: str, span: Span | None, patterns: list) -> Exception:
    """E702: code generation has no node for this; say what it is and what is supported."""
    return error("E702", f"{what} is not supported by code generation yet", span,
                 "supported: " + "; ".join(p.covers for p in patterns if p.covers))


__all__ = ["Node", "NodeImpl", "Pointer", "Scalar", "LEAVES", "ROOTS", "STORES", "leaf", "store_nodes",
           "no_implementation"]
