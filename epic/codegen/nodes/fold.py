"""A row statistic's combine kernel run by its gemm's own library: folded into the gemm (config
combine=fold: the last CTA to finish a row of tiles merges that row block's per-tile partials in tile
order and runs the combine kernel's vector math, so the plan's two launches become one), or as a
kernel that the gemm's library launches right after it (combine=signal: the gemm counts each finished
tile per row block, the tail kernel merges a row block as soon as its count is complete, without
waiting for the gemm's end). The C++ is templates/nodes/epic_nodes/row_fold.hpp and row_signal.hpp;
the merge and the math are the combine kernel's own code (codegen/combine.py, lowered with
folded=True), printed into the gemm as a struct.

Added last, around the epilogue's root (a pass-through with the root as its one child), so that its
hooks run after every node that writes partials. Its pointers and scalars are the combine kernel's,
appended to the gemm's; one more pointer, role "counters", is passed as null: the library substitutes
its own per-stream counters (epic_nodes/stream_scratch.hpp)."""
from __future__ import annotations

from ..combine import CombineSpec
from ..cxx import comment
from .base import NodeImpl

TAIL = "epic_fold_tail"


class RowFold(NodeImpl):
    role = "store"
    covers = "a row combine kernel folded into its gemm (combine=fold)"
    header = "epic_nodes/row_fold.hpp"


class RowSignal(NodeImpl):
    role = "store"
    covers = "a row combine kernel launched by its gemm's library, started by the gemm's tile counts (combine=signal)"
    header = "epic_nodes/row_signal.hpp"


def add_fold(b, tail: CombineSpec) -> None:
    """Append the fold node (combine=fold) or the signal node (combine=signal) to builder b; for the
    latter, b.signal_node is its index: the tail kernel takes that node's arguments."""
    signal = b.cfg.combine == "signal"
    tm = b.cfg.tile_m
    counters = b.scratch_pointer("counters", f"(sizes[0] + {tm} - 1) / {tm} * 4",
                                 "null: the library's own per-stream row block counters")
    ptrs = [b.pointer(p.role, p.tensor, p.dtype, f"folded combine '{tail.name}'") for p in tail.pointers]
    scalars = [b.scalar(s.name, s.dim) for s in tail.scalars]
    lines = [f"// the combine kernel '{comment(tail.name)}', " + ("run by a kernel of this library once a row block's tiles are counted"
                                                       if signal else "folded: run by the last CTA of each row block"),
             f"struct {TAIL} {{",
             "  static constexpr int FOLD_IN_FLIGHT = 32;    // partials each lane loads at once (one round trip for 64 tiles)",
             f"  static constexpr int kNumPtrs = {len(tail.pointers)};",
             f"  static constexpr int kNumScalars = {len(tail.scalars)};",
             "  template <int kLanes>",
             "  CUTLASS_DEVICE static void row(int m, int lane, int M, int tiles_n, long long rows_padded,",
             "                                 void* const* ptrs, const float* s) {"]
    lines += [f"    void* p{i} = ptrs[{i}];" for i in range(len(tail.pointers))]
    lines += ["    (void)s; (void)tiles_n; (void)rows_padded;"]
    lines += [f"    {line}" for line in tail.merge]
    lines += ["    if (lane != 0 || m >= M) return;     // rows past M merged (their lanes shuffle), store nothing"]
    lines += [f"    {line}" for line in tail.body]
    lines += ["  }", "};"]
    b.functors.append("\n".join(lines))
    root = len(b.nodes) - 1
    impl = RowSignal if signal else RowFold
    index = b.add(impl, f"epic_nodes::Sm90{impl.__name__}<TileShape, {TAIL}>",
                  f"{{static_cast<int*>({counters}), {{{', '.join(ptrs)}}}, {{{', '.join(scalars)}}}}}", [root],
                  _comment(tail, signal))
    if signal:
        b.signal_node = index


def _comment(tail: CombineSpec, signal: bool = False) -> str:
    """What the node does, naming its tensors and scalars: the comment on its line of the DAG."""
    reads = ", ".join(p.tensor for p in tail.pointers if p.role != "out")
    writes = ", ".join(p.tensor for p in tail.pointers if p.role == "out")
    scalars = f" ({', '.join(s.name for s in tail.scalars)})" if tail.scalars else ""
    return f"{'signalled' if signal else 'folded'} combine: {reads} -> {writes}{scalars}"
