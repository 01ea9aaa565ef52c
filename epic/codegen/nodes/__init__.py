"""The registry of code-generation node implementations, and the one place that says a value or a
store has none (E702).

Each entry is one class (leaves.py, stores.py, and the custom nodes whose C++ lives under
templates/nodes/). The builder (codegen/evt.py) asks the registry, in order, which implementation
computes a value or performs a store; adding a kind of node is adding a class here.
"""
from __future__ import annotations

from ...diagnostics import Span, error
from .base import Node, NodeImpl, Pointer, Scalar
from .leaves import AccFetch, AuxLoad, ColBroadcast, RowBroadcast, ScalarBroadcast
from .custom import BlockReduceScale, BlockScaleD, BlockScaleHalfWidth, BlockScaleInt4, Coordinate, PackedInt4Store, PeriodicRowBroadcast, RowLsePartial
from .packed import DoubleWidthAux, DoubleWidthD, DoubleWidthLoad, HalfWidthAux, HalfWidthD
from .stores import AuxStore, ColPartial, DStore, E8m0Store, RowPartial

# a per-head vector before the stock row broadcast (which would read it as a whole row)
LEAVES: list[type[NodeImpl]] = [AccFetch, ScalarBroadcast, AuxLoad, PeriodicRowBroadcast, RowBroadcast, ColBroadcast,
                                DoubleWidthLoad, Coordinate]
# block-scaled stores first: the node must be the root (it rewrites the subtile D is stored from)
ROOTS: list[type[NodeImpl]] = [BlockScaleD, BlockScaleInt4, BlockScaleHalfWidth, BlockReduceScale, DStore, HalfWidthD, DoubleWidthD]
STORES: list[type[NodeImpl]] = [AuxStore, E8m0Store, HalfWidthAux, DoubleWidthAux, PackedInt4Store, RowPartial,
                                ColPartial, RowLsePartial]


def find(impls: list[type[NodeImpl]], b, item) -> type[NodeImpl] | None:
    return next((impl for impl in impls if impl.matches(b, item)), None)


def no_implementation(what: str, span: Span | None, impls: list[type[NodeImpl]]) -> Exception:
    """E702: code generation has no node for this; say what it is and what is supported."""
    return error("E702", f"{what} is not supported by code generation yet", span,
                 "supported: " + "; ".join(impl.covers for impl in impls if impl.covers))


__all__ = ["Node", "NodeImpl", "Pointer", "Scalar", "LEAVES", "ROOTS", "STORES", "find", "no_implementation"]
