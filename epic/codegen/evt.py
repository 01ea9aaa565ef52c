"""A plan's gemm kernel -> a fully resolved description of its CUTLASS sm90 kernel (KernelSpec).

Every decision is made here and in the node implementations (codegen/nodes/), where it can be
tested without nvcc; templates/gemm.cu.j2 only prints the result. The epilogue is an
Sm90TopologicalVisitor (a DAG) whose nodes are:

  leaves    the accumulator, extra tiles, row/column vectors, scalars (runtime scalars, sizes)
  compute   one Sm90Compute per output (its functor recomputes the cheap element-wise work from the
            leaves; costly shared values -- exp, tanh, div, ... -- get a node of their own)
  sinks     extra output tiles, deterministic per-tile partials of reductions
  root      the node whose results the collective stores as D (last); with no output through the
            collective, D is void and the last node is a sink

The C ABI of the generated library: ptrs = [A, B, D, one pointer per node that has one, in node
order], sizes = [M, N, K, swizzle, raster, splits], scalars = [one float per scalar node, in node order].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .. import dtypes
from ..ir import operands, primitives as P
from ..ir.core import GemmKernel, Program, Value
from ..plan.kernel_config import KernelConfig
from ..plan.tile_grid import SPLIT_MAX_CTAS
from ..shapes import Kind
from . import functor as fn
from .cxx import identifier
from .nodes import LEAVES, ROOTS, STORES, Node, Pointer, Scalar, leaf, no_implementation, store_nodes
from .nodes.fold import add_fold


@dataclass
class KernelSpec:
    name: str
    symbol: str
    config: KernelConfig
    element_a: str
    element_b: str
    align_a: int
    align_b: int
    element_acc: str     # the accumulator: float; int32_t for int8 x int8; cutlass::half_t (accumulate=f16)
    acc_name: str        # its epic name (f32, i32, f16)
    element_d: str       # "void" when no output goes through the collective
    align_d: int
    aux_element: str     # sizes D's shared memory when D is void
    functors: list[str]
    nodes: list[Node]
    pointers: list[Pointer]
    scalars: list[Scalar]
    descriptors: list[tuple[str, str, str]] = field(default_factory=list)   # aux node smem helpers
    headers: list[str] = field(default_factory=list)                        # custom node headers
    # (launch pointer index, C++ byte count from the sizes): zeroed per-stream scratch that the library
    # puts in that pointer slot (the caller passes null); a launch leaves it zeroed
    scratch: list[tuple[int, str]] = field(default_factory=list)
    # split blocks' exchange (a 1x2 cluster's CTAs each hold half of a 1xB block): the 64-bit words at
    # the start of shared memory that the mainloop's pipeline zeroes (pair_slots_mainloop.hpp); 0: none
    pair_words: int = 0
    # the operands' CUTLASS layouts and orders in words (epic/ir/operands.py)
    layout_a: str = operands.ROW_MAJOR
    layout_b: str = operands.COLUMN_MAJOR
    order_a: str = "[M, K] row-major"
    order_b: str = "[K, N] K-major"

    @property
    def tile_counter(self) -> str | None:
        """tile_order=dynamic: the C++ expression of the tile counter's launch pointer (scratch), else None."""
        return next((f"p[{i}]" for i, p in enumerate(self.pointers) if p.role == "tile_counter"), None)

    @property
    def split_scratch(self) -> tuple[str, str] | None:
        """tile_order=split_last: the C++ expressions of the partial slots' and counters' launch pointers."""
        roles = {p.role: f"p[{i}]" for i, p in enumerate(self.pointers)}
        return (roles["split_partials"], roles["split_counts"]) if "split_partials" in roles else None

    @property
    def schedule_types(self) -> tuple[str, str]:
        if self.config.schedule == "cooperative":
            return ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                    "cutlass::epilogue::TmaWarpSpecializedCooperative")
        return ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized")

    @property
    def tile_scheduler(self) -> str:
        """The kernel's tile scheduler: the stream-K one (in split-K mode) where the plan splits K, else
        CUTLASS's persistent one with a swizzle that pads only the dimension it groups
        (templates/nodes/epic_nodes/grouped_tile_scheduler.hpp), in serpentine order where asked
        (serpentine_tile_scheduler.hpp), or handing its tiles out at run time (dynamic_tile_scheduler.hpp)."""
        if self.config.split_k:
            return "cutlass::gemm::StreamKScheduler"
        if self.config.tile_order == "serpentine":
            return "epic_scheduler::SerpentinePersistentScheduler"
        if self.config.tile_order == "dynamic":
            return "epic_scheduler::DynamicPersistentScheduler"
        if self.config.tile_order == "split_last":
            return "epic_scheduler::SplitLastRoundPersistentScheduler"
        return "epic_scheduler::GroupedPersistentScheduler"

    @property
    def mainloop_carveout(self) -> str:
        """The shared memory the mainloop's stages leave to the rest (C++ bytes): the epilogue's, and the
        split blocks' exchange words, which the mainloop's pipeline storage holds."""
        epilogue = "static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))"
        return f"{epilogue} + {self.pair_words * 8}" if self.pair_words else epilogue

    @property
    def mainloop(self) -> str:
        """The mainloop collective: CUTLASS's (BuiltMainloop) as the split-K kernel takes it, else wrapped,
        innermost first, in the L2 prefetch of a programmatic dependent (l2_prefetch_mainloop.hpp), the
        producer without a cache policy where load_hint=none (unhinted_loads_mainloop.hpp) or the one of a
        short A box where a_rows is set (short_a_mainloop.hpp, with or without the policy) and the
        recorder of trace=tiles (tile_trace.hpp); a kernel whose epilogue exchanges split blocks' halves
        keeps their words in the pipeline's storage (pair_slots_mainloop.hpp)."""
        if self.config.split_k:
            return "BuiltMainloop"
        out = f"epic_mainloop::L2PrefetchMainloop<BuiltMainloop, {self.config.tile[1]}, {self.config.tile[2]}>"
        if self.config.a_rows:
            hinted = "true" if self.config.load_hint == "evict_normal" else "false"
            out = f"epic_mainloop::ShortA<{out}, {self.config.a_rows}, {hinted}>"
        elif self.config.load_hint == "none":
            out = f"epic_mainloop::UnhintedLoads<{out}>"
        if self.pair_words:
            out = f"epic_mainloop::PairSlots<{out}, {self.pair_words}>"
        if self.config.trace == "tiles":
            out = f"epic_trace::TracedMainloop<{out}>"
        return out

    @property
    def scheduler_headers(self) -> list[str]:
        """Node headers printed outside the kernel's namespace (a scheduler specializes CUTLASS's selector;
        the mainloop wrapper of a kernel that can be launched as a programmatic dependent)."""
        if self.config.split_k:
            return []
        return (["epic_nodes/grouped_tile_scheduler.hpp", "epic_nodes/l2_prefetch_mainloop.hpp"]
                + (["epic_nodes/tile_trace.hpp"] if self.config.trace == "tiles" else [])
                + (["epic_nodes/serpentine_tile_scheduler.hpp"] if self.config.tile_order == "serpentine" else [])
                + (["epic_nodes/dynamic_tile_scheduler.hpp"] if self.config.tile_order == "dynamic" else [])
                + (["epic_nodes/split_last_round.hpp"] if self.config.tile_order == "split_last" else [])
                + (["epic_nodes/short_a_mainloop.hpp"] if self.config.a_rows else
                   ["epic_nodes/unhinted_loads_mainloop.hpp"] if self.config.load_hint == "none" else [])
                + (["epic_nodes/pair_slots_mainloop.hpp"] if self.pair_words else []))


class Builder:
    """The kernel under construction; node implementations add to it."""

    def __init__(self, program: Program, k: GemmKernel, cfg: KernelConfig, tail=None):
        self.program, self.k, self.cfg, self.tail = program, k, cfg, tail
        self.tensors = program.tensors       # what node patterns match against (with k)
        self.nodes: list[Node] = []
        self.functors: list[str] = []
        self.pointers: list[Pointer] = []
        self.scalars: list[Scalar] = []
        self.leaf: dict[int, int] = {}        # IR value id -> node index
        self.descriptors: list[tuple[str, str, str]] = []   # (alias, helper, element)
        self.headers: list[str] = []
        self.shared: set[int] = set()
        self.element_d, self.align_d = "void", 8
        self.aux_elements: list[str] = []     # element types of the aux stores (size a void D's smem)
        self.scratch: list[tuple[int, str]] = []
        self.pair_words = 0

    def scratch_pointer(self, role: str, bytes_expr: str, note: str) -> str:
        """A launch pointer the caller passes as null and the library fills with zeroed per-stream
        scratch of bytes_expr bytes (C++ over sizes[0] = M, sizes[1] = N); its C++ expression."""
        expr = self.pointer(role, "", dtypes.I32, note)
        self.scratch.append((len(self.pointers) - 1, bytes_expr))
        if "epic_nodes/stream_scratch.hpp" not in self.headers:
            self.headers.append("epic_nodes/stream_scratch.hpp")
        return expr

    # ------------------------------------------------------------------ what node implementations call
    def add(self, impl, type_: str, args: str, inputs: list[int], comment: str) -> int:
        if impl.header and impl.header not in self.headers:
            self.headers.append(impl.header)
        self.nodes.append(Node(impl.__name__, type_, args, inputs, comment))
        return len(self.nodes) - 1

    def pointer(self, role: str, tensor: str, dtype: dtypes.DType, note: str = "") -> str:
        """A new launch pointer: its C++ expression."""
        self.pointers.append(Pointer(role, tensor, dtype, note))
        return f"p[{len(self.pointers) - 1}]"

    def scalar(self, name: str, dim=None) -> str:
        self.scalars.append(Scalar(name, dim))
        return f"s[{len(self.scalars) - 1}]"

    def descriptor(self, kind: str, element: str) -> str:
        """A builder helper resolving an aux node's smem layout and copy atom (one per kind and type)."""
        alias = f"{'Load' if 'Load' in kind else 'Store'}Desc_{element.split('::')[-1]}"
        if alias not in {d[0] for d in self.descriptors}:
            self.descriptors.append((alias, kind, element))
        return alias

    def set_d(self, t, element: str, bits: int, note: str) -> None:
        self.pointers[2] = Pointer("D", t.name, t.dtype, note)
        self.element_d, self.align_d = element, 128 // bits

    def value_node(self, v: Value) -> int:
        """The node computing a leaf value (made on first use)."""
        if v.id not in self.leaf:
            impl = leaf(self, v)
            if impl is None:
                raise no_implementation(f"reading {_describe(self.program, v)}", v.span, LEAVES)
            self.leaf[v.id] = impl.emit(self, v)
        return self.leaf[v.id]

    def compute(self, root: Value, store_dtype: dtypes.DType | None = None, element: str = "float",
                pack=None) -> int:
        """A Compute node evaluating `root` from leaves (and shared nodes); returns its index.
        store_dtype: the node feeds a store of that dtype (fp8/int values are clamped to saturate);
        element: the node's output element type (the root node outputs ElementD directly);
        pack: (root's C variables at pair k) -> the two output elements of the pair, for stores
        whose memory is a container of another width (codegen/nodes/packed.py)."""
        if store_dtype is None and element == "float" and pack is None:
            if root.id in self.leaf or leaf(self, root) is not None:
                return self.value_node(root)      # a leaf already is the node computing it
        writer = fn.ExprWriter(pairwise=True, fast=store_dtype in fn.FAST_STORES)
        inputs: list[int] = []
        stack = [root]
        seen: set[int] = set()
        while stack:                          # which values the functor computes, and its inputs
            v = stack.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            shared = v.id in self.shared and v is not root
            impl = None if shared else leaf(self, v)
            if shared or impl is not None:
                idx = self.leaf[v.id] if shared else self.value_node(v)
                if idx not in inputs:
                    inputs.append(idx)
                j = inputs.index(idx)
                writer.bind(v, impl.parts(j, v) if impl else (f"in{j}[2 * k]", f"in{j}[2 * k + 1]"))
                continue
            if P.family(v.op) not in fn.FUNCTOR_FAMILIES and not P.is_literal(v):
                # a block statistic is the business of the roots that scale by it: list them too
                impls = LEAVES + (ROOTS if P.family(v.op) is P.Family.BLOCK else [])
                raise no_implementation(f"{_describe(self.program, v)} inside an epilogue expression", v.span, impls)
            stack.extend(reversed(v.args))
        parts = writer.emit(root)
        if store_dtype is not None:
            parts = tuple(fn.store_expr(x, store_dtype) for x in parts)
        if pack is not None:
            parts = pack(parts)
        if len(parts) != 2:
            raise no_implementation("an output whose width differs from the accumulator's", root.span, ROOTS + STORES)
        name = f"epic_fn{len(self.functors)}"
        params = ", ".join(f"T const& in{j}" for j in range(len(inputs)))
        lines = [f"template <class T> struct {name} {{",
                 f"  CUTLASS_DEVICE T operator()({params}) const {{",
                 "    T out;",
                 "    CUTLASS_PRAGMA_UNROLL",
                 "    for (int k = 0; k < T::kElements / 2; ++k) {"]
        lines += [f"      {line}" for line in writer.lines]
        lines += [f"      out[2 * k] = {parts[0]};", f"      out[2 * k + 1] = {parts[1]};",
                  "    }", "    return out;", "  }", "};"]
        self.functors.append("\n".join(lines))
        return self.add(_Compute, f"Sm90Compute<{name}, {element}, float, RN>", "{}", inputs,
                        f"compute {root.name or 'value'}")

    # ------------------------------------------------------------------ whole kernel
    def build(self) -> KernelSpec:
        k, cfg = self.k, self.cfg
        a, b = self.program.tensors[k.a], self.program.tensors[k.b]
        order_a, order_b = operands.describe("A", a, k.a_t), operands.describe("B", b, k.b_t)
        self.pointer("A", a.name, a.dtype, order_a + " (read transposed)" * k.a_t)
        self.pointer("B", b.name, b.dtype, order_b + (" (read transposed)" if k.b_t else
                                                      " (an nn.Linear weight [N, K], transposed)" if b.layout == "kmajor"
                                                      else ""))
        self.pointer("D", "", dtypes.BF16, "unused (no output through the collective)")
        root, plans = store_nodes(self)       # the patterns with the largest benefit (plan/epilogue.py)
        for impl, s in plans:
            if impl is None:
                raise no_implementation(f"storing '{s.tensor}' ({_describe(self.program, s.value)}, "
                                        f"{self.program.tensors[s.tensor].dtype})", s.span, ROOTS + STORES)
        self.shared = self._shared_values([s.value for s in k.stores])
        for v in k.values:   # shared costly values become nodes of their own, in topological order
            if v.id in self.shared:
                self.leaf[v.id] = self.compute(v)
        for impl, s in plans:
            impl.emit(self, s)
        if root is not None:
            root[0].emit(self, root[1])
        while len(self.nodes) < 3:
            # Sm90TopologicalVisitor keeps the first R-1 results in cute::repeat<R-1>(...), which is not
            # a tuple for R = 2 (nvcc: no instance of cute::get): pad with an unused accumulator fetch.
            self.nodes.insert(0, Node("AccFetch", "Sm90AccFetch", "{}", [], "unused (the visitor needs 3 ops)"))
            for n in self.nodes[1:]:
                n.inputs = [i + 1 for i in n.inputs]
        if self.tail is not None:
            add_fold(self, self.tail)
        if cfg.tile_order == "dynamic":
            self.scratch_pointer("tile_counter", "4", "null: the library's own per-stream tile counter "
                                 "(tile_order=dynamic)")
        if cfg.tile_order == "split_last":
            # one tile of float accumulators per CTA (at most kSplitMaxCtas, split_last_round.hpp) and a
            # counter each; the accumulators' slots need not start at zero (each is written before it is read)
            tile_bytes = cfg.tile[0] * cfg.tile[1] * 4
            self.scratch_pointer("split_partials", str(SPLIT_MAX_CTAS * tile_bytes), "null: the library's own "
                                 "per-stream partial accumulators of the last round's split tiles (tile_order=split_last)")
            self.scratch_pointer("split_counts", str(SPLIT_MAX_CTAS * 4), "null: the library's own per-stream "
                                 "counters of the last round's split tiles (tile_order=split_last)")
        aux = self.aux_elements[0] if self.aux_elements else dtypes.BF16.cutlass
        return KernelSpec(
            name=k.name, symbol=identifier(k.name), config=cfg,
            element_acc=k.acc.cutlass, acc_name=k.acc.name,
            element_a=a.dtype.cutlass, element_b=b.dtype.cutlass, align_a=128 // a.dtype.bits,
            align_b=128 // b.dtype.bits, element_d=self.element_d, align_d=self.align_d, aux_element=aux,
            functors=self.functors, nodes=self.nodes, pointers=self.pointers, scalars=self.scalars,
            descriptors=self.descriptors, headers=self.headers, scratch=self.scratch, pair_words=self.pair_words,
            layout_a=operands.cutlass_layout("A", a, k.a_t), layout_b=operands.cutlass_layout("B", b, k.b_t),
            order_a=order_a, order_b=order_b)

    def _shared_values(self, roots: list[Value]) -> set[int]:
        """Costly values reached from two or more outputs: compute once, as a node of their own."""
        reach_count: dict[int, int] = {}
        for r in roots:
            start = r.args if P.family(r.op) is P.Family.PARTIAL else (r,)
            for v in _reach(start):
                reach_count[v.id] = reach_count.get(v.id, 0) + 1
        root_ids = {r.id for r in roots} | {a.id for r in roots if P.family(r.op) is P.Family.PARTIAL for a in r.args}
        return {v.id for v in self.k.values if reach_count.get(v.id, 0) >= 2 and fn.is_costly(v)
                and v.shape.has_columns and v.shape.width == 1 and v.id not in root_ids
                and v.kind is not Kind.BLOCK}   # block values are computed by the node that reduces them


class _Compute:
    """The node kind of element-wise functors (made by Builder.compute, not looked up)."""
    header = None


def _describe(program: Program, v: Value) -> str:
    what = v.shape.describe()
    w = v.shape.width
    if v.shape.has_columns and w != 1:
        what += ", half as wide as the accumulator" if w == Fraction(1, 2) else f", {w} times as wide as the accumulator"
    if P.prim(v.op).reads == "tensor":
        t = program.tensors[v.attrs["tensor"]]
        return f"'{t.name}' (a {t.dtype} {what})"
    name = f" '{v.name}'" if v.name else ""
    if P.family(v.op) in (P.Family.PARTIAL, P.Family.REDUCE):
        return f"per-tile partials of {v.attrs['axis']}_{v.attrs['fn']}{name}"
    if P.family(v.op) is P.Family.BLOCK and v.kind is Kind.TILE:      # an internal op: block_quant
        return f"{v.op}{name} (a tile divided by its 1x{v.attrs['block']} block scale)"
    if P.family(v.op) is P.Family.BLOCK:
        return f"block_{v.attrs['fn']}{name} (1x{v.attrs['block']} block reductions)"
    return f"{v.op}{name} (a {what})"


def _reach(starts) -> list[Value]:
    seen: dict[int, Value] = {}
    stack = list(starts)
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen[v.id] = v
        stack.extend(v.args)
    return list(seen.values())


def lower_gemm(program: Program, k: GemmKernel, cfg: KernelConfig, tail=None) -> KernelSpec:
    """tail: the CombineSpec (lowered folded) of a row combine kernel that runs inside this gemm."""
    return Builder(program, k, cfg, tail).build()
