"""A row statistic's combine kernel folded into its gemm (config combine=fold): the last CTA to
finish a row of tiles merges that row block's per-tile partials in tile order and runs the combine
kernel's vector math, so the plan's two launches become one. The C++ is
templates/nodes/epic_nodes/row_fold.hpp; the merge and the math are the combine kernel's own code
(codegen/combine.py, lowered with folded=True), printed into the gemm as a struct.

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


def add_fold(b, tail: CombineSpec) -> None:
    """Append the fold node to builder b."""
    tm = b.cfg.tile_m
    counters = b.scratch_pointer("counters", f"(sizes[0] + {tm} - 1) / {tm} * 4",
                                 "null: the library's own per-stream row block counters")
    ptrs = [b.pointer(p.role, p.tensor, p.dtype, f"folded combine '{tail.name}'") for p in tail.pointers]
    scalars = [b.scalar(s.name, s.dim) for s in tail.scalars]
    lines = [f"// the combine kernel '{comment(tail.name)}', folded: run by the last CTA of each row block",
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
    b.add(RowFold, f"epic_nodes::Sm90RowFold<TileShape, {TAIL}>",
          f"{{static_cast<int*>({counters}), {{{', '.join(ptrs)}}}, {{{', '.join(scalars)}}}}}", [root],
          _comment(tail))


def _comment(tail: CombineSpec) -> str:
    """What the node does, naming its tensors and scalars: the comment on its line of the DAG."""
    reads = ", ".join(p.tensor for p in tail.pointers if p.role != "out")
    writes = ", ".join(p.tensor for p in tail.pointers if p.role == "out")
    scalars = f" ({', '.join(s.name for s in tail.scalars)})" if tail.scalars else ""
    return f"folded combine: {reads} -> {writes}{scalars}"
