"""A plan's gemm kernel -> a fully resolved description of its CUTLASS sm90 kernel (KernelSpec).

Every decision is made here, where it can be tested without nvcc; templates/gemm.cu.j2 only
prints the result. The epilogue is an Sm90TopologicalVisitor (a DAG) whose nodes are:

  leaves    Sm90AccFetch, Sm90AuxLoad (extra tiles, TMA), Sm90RowBroadcast, Sm90ColBroadcast,
            Sm90ScalarBroadcast (runtime scalars and dimension sizes)
  compute   one Sm90Compute per output (its functor recomputes the cheap element-wise work from the
            leaves; costly shared values -- exp, tanh, div, ... -- get a node of their own)
  sinks     Sm90AuxStore per extra output tile, Sm90ColReduction / Sm90RowReduction with
            FinalReduction=false per reduction (deterministic per-tile partials)
  root      the compute node of the output stored as D by the collective (last op); with no tile
            output D is void and the last op is a sink

The C ABI of the generated library: ptrs = [A, B, D, one pointer per node that has one, in node
order], sizes = [M, N, K], scalars = [one float per scalar node, in node order].
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dtypes
from ..ir.core import GemmKernel, Program, Value
from ..plan.config import KernelConfig
from ..shapes import Kind
from . import functor as fn

D_TYPES = (dtypes.BF16, dtypes.F16, dtypes.F32, dtypes.E4M3, dtypes.E5M2, dtypes.I8)
REDUCE_OPS = {"sum": "cutlass::plus", "mean": "cutlass::plus", "max": "cutlass::maximum",
              "min": "cutlass::minimum"}
IDENTITY = {"sum": "0.f", "mean": "0.f", "max": "-INFINITY", "min": "INFINITY"}


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


@dataclass
class Node:
    type: str            # C++ type of the visitor node
    args: str            # C++ initializer of its Arguments
    inputs: list[int]
    comment: str


@dataclass
class KernelSpec:
    name: str
    symbol: str
    config: KernelConfig
    element_a: str
    element_b: str
    align_a: int
    align_b: int
    element_d: str       # "void" when no output goes through the collective
    align_d: int
    aux_element: str     # sizes D's shared memory when D is void
    functors: list[str]
    nodes: list[Node]
    pointers: list[Pointer]
    scalars: list[Scalar]
    descriptors: list[tuple[str, str, str]] = field(default_factory=list)   # aux node smem helpers

    @property
    def schedule_types(self) -> tuple[str, str]:
        if self.config.schedule == "cooperative":
            return ("cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                    "cutlass::epilogue::TmaWarpSpecializedCooperative")
        return ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized")


def _cpp(dt: dtypes.DType) -> str:
    if dt.cutlass is None:
        raise fn.unsupported(f"{dt} tensors in an epilogue")
    return dt.cutlass


class _Builder:
    def __init__(self, program: Program, k: GemmKernel, cfg: KernelConfig):
        self.program, self.k, self.cfg = program, k, cfg
        self.nodes: list[Node] = []
        self.functors: list[str] = []
        self.pointers: list[Pointer] = []
        self.scalars: list[Scalar] = []
        self.leaf: dict[int, int] = {}        # IR value id -> node index
        self.descriptors: list[tuple[str, str, str]] = []   # (alias, helper, element)
        self.shared: set[int] = set()

    # ------------------------------------------------------------------ nodes
    def add(self, type_: str, args: str, inputs: list[int], comment: str) -> int:
        self.nodes.append(Node(type_, args, inputs, comment))
        return len(self.nodes) - 1

    def descriptor(self, kind: str, element: str) -> str:
        """A builder helper resolving an aux node's smem layout and copy atom (one per kind and type)."""
        alias = f"{'Load' if 'Load' in kind else 'Store'}Desc_{element.split('::')[-1]}"
        if alias not in {d[0] for d in self.descriptors}:
            self.descriptors.append((alias, kind, element))
        return alias

    def pointer(self, role: str, tensor: str, dtype: dtypes.DType, note: str = "") -> str:
        self.pointers.append(Pointer(role, tensor, dtype, note))
        return f"p[{len(self.pointers) - 1}]"

    def leaf_node(self, v: Value) -> int:
        if v.id in self.leaf:
            return self.leaf[v.id]
        if v.op == "acc":
            i = self.add("Sm90AccFetch", "{}", [], "acc")
        elif v.op == "dim" or (v.op == "load" and v.kind is Kind.SCALAR):
            name = v.attrs.get("tensor") or str(v.attrs["dim"])
            self.scalars.append(Scalar(name, v.attrs.get("dim")))
            i = self.add("Sm90ScalarBroadcast<float>", f"{{{{s[{len(self.scalars) - 1}]}}, {{nullptr}}, {{}}}}", [],
                         f"scalar {name}")
        elif v.op == "load":
            t = self.program.tensors[v.attrs["tensor"]]
            if v.shape.has_columns and v.shape.width != 1:
                raise fn.unsupported(f"'{t.name}' is {v.shape.width} times as wide as the accumulator; tiles and "
                                     "vectors of another width are not supported by code generation yet", v.span)
            el = _cpp(t.dtype)
            if v.kind is Kind.TILE:
                p = self.pointer("aux_load", t.name, t.dtype)
                d = self.descriptor("AuxLoadDescriptor", el)
                stages = f"{d}::Stages" if self.cfg.aux_load == "tma" else "0"   # 0: global -> registers
                i = self.add(f"Sm90AuxLoad<{stages}, typename {d}::EpilogueTile, {el}, StrideAux, "
                             f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpS2R>",
                             f"{{static_cast<{el} const*>({p}), {el}(0), sAux}}", [], f"load tile {t.name}")
            elif v.kind is Kind.ROW:
                p = self.pointer("row", t.name, t.dtype)
                i = self.add(f"Sm90RowBroadcast<0, TileShape, {el}, float, Stride<_0, _1, int64_t>>",
                             f"{{static_cast<{el} const*>({p}), {el}(0), {{}}}}", [], f"row vector {t.name}")
            elif v.kind is Kind.COL:
                p = self.pointer("col", t.name, t.dtype)
                i = self.add(f"Sm90ColBroadcast<0, TileShape, {el}, float, Stride<_1, _0, int64_t>>",
                             f"{{static_cast<{el} const*>({p}), {el}(0), {{}}}}", [], f"column vector {t.name}")
            else:
                raise fn.unsupported(f"loading a {v.shape.describe()} ('{t.name}')", v.span)
        elif v.op in ("row_index", "col_index"):
            raise fn.unsupported("the coordinates `row`/`col` (used by row_pick) need a custom visitor node, "
                                 "not supported by code generation yet", v.span)
        else:
            raise AssertionError(v.op)
        self.leaf[v.id] = i
        return i

    # ------------------------------------------------------------------ compute
    def compute(self, root: Value, store_dtype: dtypes.DType | None = None, element: str = "float") -> int:
        """A Compute node evaluating `root` from leaves (and shared nodes); returns its index.
        store_dtype: the node feeds a store of that dtype (fp8/int values are clamped to saturate);
        element: the node's output element type (the root node outputs ElementD directly)."""
        writer = fn.ExprWriter(pairwise=True, fast=store_dtype is not None and store_dtype.name in fn.FAST_STORES)
        inputs: list[int] = []

        def visit(v: Value) -> None:
            if v.id in writer.names:
                return
            if v.op in ("acc", "load", "dim", "row_index", "col_index") or (v.id in self.shared and v is not root):
                idx = self.leaf[v.id] if v.id in self.shared else self.leaf_node(v)
                if idx not in inputs:
                    inputs.append(idx)
                j = inputs.index(idx)
                writer.bind(v, (f"in{j}[2 * k]", f"in{j}[2 * k + 1]"))
                return
            if v.op in ("reduce", "block_reduce", "partial", "combine"):
                raise fn.unsupported(f"'{v.op}' inside an epilogue expression", v.span)
            for a in v.args:
                visit(a)
            writer.emit(v)

        visit(root)
        parts = writer.names[root.id]
        if len(parts) != 2:
            raise fn.unsupported("an output whose width differs from the accumulator's (swiglu, even/odd, "
                                 "interleave to another width) needs a width-changing store, not supported by "
                                 "code generation yet", root.span)
        if store_dtype is not None:
            parts = tuple(fn.store_expr(x, store_dtype) for x in parts)
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
        return self.add(f"Sm90Compute<{name}, {element}, float, RN>", "{}", inputs,
                        f"compute {root.name or 'value'}")

    # ------------------------------------------------------------------ whole kernel
    def build(self) -> KernelSpec:
        k, cfg = self.k, self.cfg
        a, b = self.program.tensors[k.a], self.program.tensors[k.b]
        for t in (a, b):
            if t.dtype not in dtypes.GEMM_OPERAND:
                raise fn.unsupported(f"GEMM operand {t.name} of type {t.dtype}")
        self.pointer("A", a.name, a.dtype, "[M, K] row-major")
        self.pointer("B", b.name, b.dtype, "[K, N] K-major (an nn.Linear weight [N, K], transposed)")
        self.pointer("D", "", dtypes.BF16, "")   # filled below
        tile_stores = [s for s in k.stores if s.value.op != "partial"]
        for s in k.stores:
            t = self.program.tensors[s.tensor]
            if s.value.op == "partial":
                if s.value.attrs["fn"] not in REDUCE_OPS:
                    raise fn.unsupported(f"the {s.value.attrs['fn']} reduction needs a stateful visitor node "
                                         "(online log-sum-exp), not supported by code generation yet", s.span)
            elif s.value.kind is Kind.BLOCK or any(v.op == "block_reduce" for v in _reach(s.value)):
                raise fn.unsupported(f"'{t.name}': 1xB block reductions (quantization scales) need a custom "
                                     "visitor node, not supported by code generation yet", s.span)
            elif t.dtype is dtypes.I4:
                raise fn.unsupported(f"'{t.name}': int4 packing needs a custom store, not supported by code "
                                     "generation yet", s.span)
            elif s.value.kind is not Kind.TILE:
                raise fn.unsupported(f"'{t.name}': a gemm stores tiles; vectors are stored by combine kernels", s.span)
        d_store = next((s for s in tile_stores if self.program.tensors[s.tensor].dtype in D_TYPES
                        and s.value.shape.width == 1), None)
        self.shared = self._shared_values([s.value for s in tile_stores] +
                                          [s.value.args[0] for s in k.stores if s.value.op == "partial"])
        for v in k.values:   # shared costly values become nodes of their own, in topological order
            if v.id in self.shared:
                self.leaf[v.id] = self.compute(v)
        for s in k.stores:
            if s is d_store:
                continue
            t = self.program.tensors[s.tensor]
            if s.value.op == "partial":
                src = self.compute(s.value.args[0])
                axis, fname = s.value.attrs["axis"], s.value.attrs["fn"]
                op = REDUCE_OPS[fname]
                p = self.pointer(f"{axis}_partial", t.name, dtypes.F32)
                if axis == "row":   # one value per row: reduce over N
                    self.add(f"Sm90ColReduction<{op}, {op}, {op}, 0, TileShape, float, float, RN, "
                             "Stride<_1, _0, int64_t>, 4, true, /*FinalReduction=*/false>",
                             f"{{{p}, {IDENTITY[fname]}, {{_1{{}}, _0{{}}, int64_t(0)}}}}", [src],
                             f"per-tile row {fname} -> {t.name}")
                else:
                    self.add(f"Sm90RowReduction<{op}, {op}, {op}, 0, TileShape, float, float, RN, "
                             "Stride<_0, _1, int64_t>, 4, true, /*FinalReduction=*/false>",
                             f"{{{p}, {IDENTITY[fname]}, {{_0{{}}, _1{{}}, int64_t(0)}}}}", [src],
                             f"per-tile column {fname} -> {t.name}")
            else:
                src = self.compute(s.value, t.dtype)
                el = _cpp(t.dtype)
                p = self.pointer("aux_store", t.name, t.dtype)
                d = self.descriptor("AuxStoreDescriptor", el)
                self.add(f"Sm90AuxStore<{d}::Stages, typename {d}::EpilogueTile, {el}, RN, StrideAux, "
                         f"typename {d}::SmemLayoutAtom, typename {d}::CopyOpR2S>",
                         f"{{static_cast<{el}*>({p}), sAux}}", [src], f"store tile {t.name}")
        if d_store is not None:
            t = self.program.tensors[d_store.tensor]
            self.pointers[2] = Pointer("D", t.name, t.dtype, "[M, N] row-major, stored by the collective")
            element_d, align_d = _cpp(t.dtype), 128 // t.dtype.bits
            self.compute(d_store.value, t.dtype, element_d)
        else:
            self.pointers[2] = Pointer("D", "", dtypes.BF16, "unused (no output through the collective)")
            element_d, align_d = "void", 8
        while len(self.nodes) < 3:
            # Sm90TopologicalVisitor keeps the first R-1 results in cute::repeat<R-1>(...), which is not
            # a tuple for R = 2 (nvcc: no instance of cute::get): pad with an unused accumulator fetch.
            self.nodes.insert(0, Node("Sm90AccFetch", "{}", [], "unused (the visitor needs 3 ops)"))
            for n in self.nodes[1:]:
                n.inputs = [i + 1 for i in n.inputs]
        aux = next((p.dtype for p in self.pointers if p.role == "aux_store"), dtypes.BF16)
        return KernelSpec(
            name=k.name, symbol=_symbol(k.name), config=cfg,
            element_a=_cpp(a.dtype), element_b=_cpp(b.dtype), align_a=128 // a.dtype.bits,
            align_b=128 // b.dtype.bits, element_d=element_d, align_d=align_d, aux_element=_cpp(aux),
            functors=self.functors, nodes=self.nodes, pointers=self.pointers, scalars=self.scalars,
            descriptors=self.descriptors)

    def _shared_values(self, roots: list[Value]) -> set[int]:
        """Costly values reached from two or more outputs: compute once, as a node of their own."""
        reach_count: dict[int, int] = {}
        for r in roots:
            for v in _reach(r):
                reach_count[v.id] = reach_count.get(v.id, 0) + 1
        return {v.id for v in self.k.values if reach_count.get(v.id, 0) >= 2 and fn.is_costly(v)
                and v.shape.has_columns and v.shape.width == 1 and v.id not in {r.id for r in roots}}


def _reach(root: Value) -> list[Value]:
    seen: dict[int, Value] = {}
    stack = [root]
    while stack:
        v = stack.pop()
        if v.id in seen:
            continue
        seen[v.id] = v
        stack.extend(v.args)
    return list(seen.values())


def _symbol(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def lower_gemm(program: Program, k: GemmKernel, cfg: KernelConfig) -> KernelSpec:
    return _Builder(program, k, cfg).build()
