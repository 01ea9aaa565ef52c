"""The plan: the ordered kernels of a rewritten program at given sizes, with every buffer's shape,
dtype, bytes, and which kernel writes and reads it.

The plan is the single source of truth for buffers: the shape of each one here is what the runtime
allocates (and hands to the kernels), what the byte ledger counts and what the reference
interpreter's per-tile partials look like (epic/layouts.py has the layout rules)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dtypes, layouts, sizes as sizes_mod
from ..checks import layout
from ..diagnostics import EpicError
from ..ir import primitives as P
from ..ir.core import Program, Tensor
from ..shapes import Kind
from . import config as config_mod, tail


DERIVED_WRITER = "the runtime, from weights"      # who writes a derived tensor (not a kernel)


@dataclass
class Buffer:
    name: str
    role: str                   # input | scalar | out | tmp | buffer | partial | derived
    dtype: dtypes.DType         # the element type of the program
    shape: tuple[int, ...]      # as allocated (per-tile partials and packed int4 differ from the math)
    torch_dtype: str            # torch dtype the caller passes or receives
    nbytes: int
    layout: str                 # how the elements lie, in words
    writer: str | None = None
    readers: list[str] = field(default_factory=list)


@dataclass
class Step:
    kernel: object
    config: config_mod.KernelConfig | None
    reads: list[str]
    writes: list[str]


@dataclass
class Plan:
    program: Program
    sizes: dict[str, int]
    steps: list[Step]
    buffers: dict[str, Buffer]
    configs: dict[str, config_mod.KernelConfig]
    # buffers that lie in another's memory: a tile the gemm stores for the row combine kernel to finish
    # -> the tile that kernel finishes from it, element by element in place (in_place below)
    aliases: dict[str, str] = field(default_factory=dict)
    gpu: str | None = None       # the key of the GPU whose heuristic chose the tiles (plan/gpus.py)

    def storage(self, name: str) -> str:
        """The buffer whose memory holds `name`."""
        return self.aliases.get(name, name)

    def tiles(self) -> dict[str, tuple[int, int]]:
        """(tile M, tile N) of each gemm, for the reference interpreter's per-tile partials."""
        return {k: (c.tile_m, c.tile_n) for k, c in self.configs.items()}

    def allocations(self) -> list[Buffer]:
        """What a call allocates: everything a kernel writes, but for buffers in another's memory."""
        return [b for b in self.buffers.values()
                if b.role in ("out", "tmp", "buffer", "partial") and b.name not in self.aliases]


def buffer_of(t: Tensor, sizes: dict[str, int], configs: dict) -> Buffer:
    dims = tuple(sizes_mod.evaluate(d, sizes) for d in t.dims)
    if t.tiles_axis:
        cfg = configs[t.producer]
        rows, width = dims
        axis = "row" if t.tiles_axis == "n" else "col"
        shape = layouts.partial_shape(axis, rows, width, cfg.tile_m, cfg.tile_n)
        what = f"per-tile {'row' if axis == 'row' else 'column'} partials, tile-major, padded to the tile"
        return Buffer(t.name, t.role, t.dtype, shape, "float32", _nbytes(shape, 32), what, t.producer)
    if t.dtype in dtypes.PACKED:
        shape = layouts.packed_int4_shape(*dims)
        return Buffer(t.name, t.role, t.dtype, shape, "uint8", _nbytes(shape, 8),
                      f"{'int4' if t.dtype is dtypes.I4 else t.dtype} packed two per byte, low nibble = even column",
                      t.producer)
    if t.role == "derived":
        vectors, matrix = t.derived
        return Buffer(t.name, t.role, t.dtype, dims, "float32", _nbytes(dims, 32),
                      f"({' * '.join(vectors) or 'ones'}) @ {matrix}, computed once per weight tensor "
                      "(again when one changes)", DERIVED_WRITER)
    kind = "row-major" if t.layout == "row" else "K-major (column-major [K, N])"
    return Buffer(t.name, t.role, t.dtype, dims, t.dtype.torch_name, _nbytes(dims, t.dtype.bits),
                  kind if dims else "scalar", t.producer)


def _nbytes(shape: tuple[int, ...], bits: int) -> int:
    n = 1
    for d in shape:
        n *= d
    return (n * bits + 7) // 8


def make_plan(program: Program, sizes: dict[str, int], overrides: dict[str, dict] | None = None,
              gpu: str | None = None) -> Plan:
    """The plan at these sizes for the GPU of key `gpu` (plan/gpus.py: the heuristic's tiles differ)."""
    sizes_mod.check_complete(program, sizes, others_too=True)
    sizes_mod.check_indexable(program, sizes)
    diags = layout.check_sizes(program, sizes)
    if diags:
        raise EpicError(diags)
    # each gemm's configuration for its own row count (a backward program's dW gemm has N rows)
    gemms = [k for k in program.kernels if k.kind == "gemm"]
    rows = {k.name: sizes_mod.evaluate(k.rows, sizes) for k in gemms}
    ns = {k.name: sizes_mod.evaluate(k.n, sizes) for k in gemms}
    configs = {k.name: config_mod.choose(k, rows[k.name], (overrides or {}).get(k.name), program.tensors,
                                         ns[k.name], sizes_mod.evaluate(k.k, sizes), gpu) for k in gemms}
    configs = tail.by_heuristic(program, configs, rows, ns, overrides, lambda k, override: config_mod.choose(
        k, rows[k.name], override, program.tensors, ns[k.name], sizes_mod.evaluate(k.k, sizes), gpu))
    program = tail.rewrite(program, configs)        # gemms with combine=tail: their tail kernels
    buffers = {t.name: buffer_of(t, sizes, configs) for t in program.tensors.values()}
    for t in program.tensors.values():
        if t.role == "derived":             # computed from weights before the kernels
            for r in dict.fromkeys((*t.derived[0], t.derived[1])):
                buffers[r].readers.append(t.name)
    steps = []
    for k in program.kernels:
        reads = [k.a, k.b] if k.kind == "gemm" else []
        reads += [v.attrs[P.prim(v.op).reads] for v in k.values      # runtime scalars are passed by value
                  if P.prim(v.op).reads and program.tensors[v.attrs[P.prim(v.op).reads]].role != "scalar"]
        reads += [v.attrs["pick"] for v in k.values if "pick" in v.attrs]   # the labels a combine picks by
        reads = list(dict.fromkeys(reads))
        writes = [s.tensor for s in k.stores]
        for r in reads:
            buffers[r].readers.append(k.name)
        steps.append(Step(k, configs.get(k.name), reads, writes))
    aliases = in_place(program, buffers)
    for pre, tile in aliases.items():
        buffers[pre].layout += f"; in {tile}'s memory (finished in place)"
    return Plan(program, sizes, steps, buffers, configs, aliases, gpu)


def overwrite_problem(plan: Plan, output: str, inp: str) -> str | None:
    """Why output `output` may not be written into input `inp`'s memory (None: it may). It may where
    the one kernel that reads `inp` is the gemm that stores `output`, which reads it as a tile at the
    position it stores (an epilogue load, e.g. acc + sum), never as an operand or with a period: each
    element is then read before the same thread's store overwrites it, and nothing reads it after."""
    b, o = plan.buffers[inp], plan.buffers[output]
    writer = next((s.kernel for s in plan.steps if output in s.writes), None)
    if writer is None or b.readers != [writer.name]:
        return f"'{inp}' is read by {', '.join(b.readers) or 'no kernel'}, not only by the kernel that stores '{output}'"
    if writer.kind != "gemm" or inp in (writer.a, writer.b):
        return f"kernel '{writer.name}' reads '{inp}' as a gemm operand or outside an epilogue"
    reads = [v for v in writer.values if P.prim(v.op).reads and v.attrs[P.prim(v.op).reads] == inp]
    if any(v.kind is not Kind.TILE or "period" in v.attrs for v in reads):
        return f"kernel '{writer.name}' reads '{inp}' other than as a tile at the position it stores"
    if (b.torch_dtype, b.shape) != (o.torch_dtype, o.shape):
        return f"'{inp}' ({b.torch_dtype}{list(b.shape)}) and '{output}' ({o.torch_dtype}{list(o.shape)}) differ"
    return None


def in_place(program: Program, buffers: dict[str, Buffer]) -> dict[str, str]:
    """Tiles a row combine kernel finishes in place (pre -> finished): where a gemm stores a tile that
    only the combine kernel after it reads, and that kernel stores a tile of the same dtype and shape
    that no kernel has read yet, the two share memory. The kernel's finish loop reads every tile of a
    row's columns before it stores them (codegen/combine.py), each element by the lane that stores it,
    so the finished value overwrites only what that lane has read (cross entropy's dlogits are
    written over the logits: one [M, V] buffer instead of two)."""
    out: dict[str, str] = {}
    for k in program.kernels:
        if k.kind != "combine" or k.axis != "row":
            continue
        finished = [s.tensor for s in k.stores if s.value.kind is Kind.TILE]
        for pre, b in buffers.items():
            if b.role != "buffer" or b.writer != k.source or b.readers != [k.name]:
                continue
            tile = next((t for t in finished if t not in out.values() and buffers[t].role in ("tmp", "buffer", "out")
                         and (buffers[t].torch_dtype, buffers[t].shape) == (b.torch_dtype, b.shape)
                         and buffers[t].writer == k.name), None)
            if tile is not None:
                out[pre] = tile
    return out


def folds(program: Program, configs: dict[str, config_mod.KernelConfig]) -> dict[str, str]:
    """The combine kernels that run inside their gemm -> that gemm: a row combine right after the gemm
    whose partials it merges, where the gemm's configuration says combine=fold. Any other combine
    kernel (a column or whole-tensor one, one after another kernel, or one that finishes quantized
    tile stores: a warp per row over the whole width) keeps its own launch."""
    out = {}
    for prev, k in zip(program.kernels, program.kernels[1:]):
        if (k.kind == "combine" and k.axis == "row" and prev.kind == "gemm" and k.source == prev.name
                and configs[prev.name].combine == "fold" and not any(s.value.kind is Kind.TILE for s in k.stores)):
            out[k.name] = prev.name
    return out
