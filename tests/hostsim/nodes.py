"""The host emulation of each visitor node type, keyed by the type's name as the source prints it.

An entry says which host type (tests/hostsim/hostsim.hpp) emulates the node, given its template
arguments, and which launch pointer role each pointer field of its initializer must name (the ABI
check, abi.py). A node type without an entry, or with template arguments its emulation does not
cover, fails loudly (NoHostEmulation). Adding a node kind means: a host struct in hostsim.hpp that
mirrors its Arguments and implements the hooks it needs (begin, visit, reduce, end), calling the
node's own arithmetic (epic_nodes/arith.hpp) rather than a copy of it, and an entry here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .parse import NodeDecl


class NoHostEmulation(AssertionError):
    """The generated source uses something the host simulator cannot run (yet)."""


@dataclass(frozen=True)
class Emulation:
    host_type: Callable[[NodeDecl], str]     # the node -> its host emulation's C++ type
    # initializer field -> role of the pointer it names (a tuple: one of those roles)
    pointers: dict[int, str | tuple[str, ...]] = field(default_factory=dict)
    # initializer field that is a braced list of pointers -> the roles its elements may have
    pointer_lists: dict[int, tuple[str, ...]] = field(default_factory=dict)


def _require(node: NodeDecl, ok: bool, what: str) -> None:
    if not ok:
        raise NoHostEmulation(f"no host emulation for node type {node.name} with {what} (node {node.index}: "
                              f"{node.type})")


def _args(node: NodeDecl, count: int) -> list[str]:
    _require(node, len(node.args) >= count, f"fewer than {count} template arguments")
    return node.args


def _aux_load(node: NodeDecl) -> str:
    stages, _, element = _args(node, 3)[:3]
    return f"hostsim::AuxLoad<{element}, {'false' if stages.strip() == '0' else 'true'}>"


def _broadcast(host: str) -> Callable[[NodeDecl], str]:
    def make(node: NodeDecl) -> str:
        stages, _, element, compute = _args(node, 4)[:4]
        _require(node, stages == "0", f"Stages={stages}")
        return f"hostsim::{host}<{element}, {compute}>"
    return make


def _scalar(node: NodeDecl) -> str:
    element = _args(node, 1)[0]
    _require(node, len(node.args) <= 2, "a broadcast count or reduction")
    return f"hostsim::ScalarBroadcast<{element}>"


def _compute(node: NodeDecl) -> str:
    fn, out, compute, rounding = _args(node, 4)[:4]
    _require(node, rounding == "RN" or rounding.endswith("round_to_nearest"), f"rounding {rounding}")
    return f"hostsim::Compute<{fn}, {out}, {compute}>"


def _aux_store(node: NodeDecl) -> str:
    _, _, element, rounding = _args(node, 4)[:4]
    _require(node, rounding == "RN" or rounding.endswith("round_to_nearest"), f"rounding {rounding}")
    return f"hostsim::AuxStore<{element}>"


def _reduction(host: str) -> Callable[[NodeDecl], str]:
    """Sm90ColReduction / Sm90RowReduction<RegFn, ShuffleFn, GmemFn, Stages, CtaTile, ElementOutput,
    ElementCompute, Round, Stride, Alignment, EnableNullptr, FinalReduction, VisitCheckOOB>, unchecked
    as epic emits it (OutsideAs in front): every visited element is reduced, those outside the problem too."""
    def make(node: NodeDecl) -> str:
        a = _args(node, 12)
        reg, shuffle, gmem, stages, tile, _, compute = a[:7]
        _require(node, reg == shuffle == gmem, "different register, shuffle and global reductions")
        _require(node, stages == "0", f"Stages={stages}")
        _require(node, tile == "TileShape", f"a CTA tile other than TileShape ({tile})")
        _require(node, a[11] == "false", f"FinalReduction={a[11]} (only per-tile partials are emulated)")
        _require(node, len(a) == 13 and a[12] == "false", "VisitCheckOOB other than false")
        return f"hostsim::{host}<{reg}, {compute}>"
    return make


def _custom(host: str, count: int) -> Callable[[NodeDecl], str]:
    """A custom node whose host emulation takes the same template arguments."""
    def make(node: NodeDecl) -> str:
        args = _args(node, count)
        return f"hostsim::{host}" + (f"<{', '.join(args)}>" if args else "")
    return make


EMULATIONS: dict[str, Emulation] = {
    "Sm90AccFetch": Emulation(lambda node: "hostsim::AccFetch"),
    "Sm90AuxLoad": Emulation(_aux_load, {0: "aux_load"}),
    "Sm90RowBroadcast": Emulation(_broadcast("RowBroadcast"), {0: "row"}),
    "Sm90ColBroadcast": Emulation(_broadcast("ColBroadcast"), {0: "col"}),
    "Sm90ScalarBroadcast": Emulation(_scalar, {1: "scalar"}),      # a pointer: a stored statistic
    "Sm90Compute": Emulation(_compute),
    "Sm90AuxStore": Emulation(_aux_store, {0: "aux_store"}),
    "Sm90ColReduction": Emulation(_reduction("ColReduction"), {0: "row_partial"}),   # one partial per row
    "Sm90RowReduction": Emulation(_reduction("RowReduction"), {0: "col_partial"}),   # one partial per column
    # epic's own nodes (templates/nodes/epic_nodes/)
    "epic_nodes::Sm90Coordinate": Emulation(_custom("Coordinate", 1)),
    "epic_nodes::Sm90OutsideAs": Emulation(_custom("OutsideAs", 0)),
    "epic_nodes::Sm90PeriodicRowBroadcast": Emulation(_custom("PeriodicRowBroadcast", 1), {0: "row"}),
    "epic_nodes::Sm90RowLsePartial": Emulation(_custom("RowLsePartial", 1), {0: "row_partial"}),
    "epic_nodes::Sm90PackedInt4Store": Emulation(_custom("PackedInt4Store", 0), {0: "int4_store"}),
    # its second template argument (the subtile) only shapes the device's shared-memory staging
    "epic_nodes::Sm90HalfWidthPairStore": Emulation(lambda node: f"hostsim::HalfWidthPairStore<{_args(node, 2)[0]}>",
                                                    {0: "aux_store"}),
    "epic_nodes::Sm90BlockScale": Emulation(_custom("BlockScale", 5), {0: "block_scale", 3: ("int4_store", "byte_store")}),
    "epic_nodes::Sm90BlockReduceScale": Emulation(_custom("BlockReduceScale", 4), {0: "block_scale"}),
    # a folded row combine: its counters (null, the library's own), then the combine kernel's pointers
    "epic_nodes::Sm90RowFold": Emulation(_custom("RowFold", 2), {0: "counters"},
                                         {1: ("row_partial", "col", "out", "scalar")}),
}


def emulation(node: NodeDecl) -> Emulation:
    try:
        return EMULATIONS[node.name]
    except KeyError:
        raise NoHostEmulation(f"no host emulation for node type {node.name} (node {node.index}: {node.comment}); "
                              "add one to tests/hostsim/nodes.py and hostsim.hpp") from None
