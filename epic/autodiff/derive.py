"""A program's backward, derived by reverse mode over its gemms (pattern D of the background article).

For each forward gemm k = (A @ B, epilogue f), last first:
  1. the cotangents of k's stored tensors (the caller's gradient of an output, plus what later gemms
     sent back: a gemm that read the tensor as its A operand, or an epilogue that loaded it) seed
  2. reverse mode through f (epilogue.backprop) in a gemm that recomputes A @ B, so every tile-local
     forward value is at hand (block statistics too: they are tile-local); the forward saves its row
     and column statistics instead (a few bytes per row). A backward row sum that a tile needs
     (RMSNorm's rowsum(dy * gamma * h)) ends one such gemm and starts the next ("stages"), as epic's
     locality rule requires. With the "save" policy, a gemm whose one stored tile only feeds the next
     gemm's A operand runs its backward epilogue in that gemm's dA gemm instead, on its accumulator
     saved by the forward (pattern D: SwiGLU's derivative where dy @ wd^T is computed);
  3. dacc, the cotangent of the accumulator, feeds two gemms: dA = dacc @ B^T and dB^T = dacc^T @ A
     (`.T` operands: no transpose copy), and the gradients of loaded tensors are stored or summed.
Everything is emitted as .epi text (epic/autodiff/text.py) and compiled like any program.

What is saved (`Derivation.saved`) and recomputed (`Derivation.recomputed`) is decided here and
shown by `epic grad` (its header, and `--shape` for bytes and flops).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..diagnostics import error
from ..dtypes import F32, DType
from ..ir import primitives as P
from ..ir.core import GemmKernel, Program, Tensor, Value, make, topo_order
from ..shapes import Kind, Shape
from . import epilogue
from .builder import SMOOTH_CASTS
from .finishing import crosses as _crosses, finished_by_row_combine
from .fused import accumulate_sums, derive_fused, refuse_unfinishable
from .text import GemmText, type_text as _type


@dataclass
class Derivation:
    program: Program
    forward_text: str                 # the forward program, storing what the backward needs
    backward_text: str
    wrt: list[str]                    # inputs whose gradients the backward returns
    grads: dict[str, str]             # input -> backward output holding its gradient
    transposed_grads: set[str]        # inputs whose gradient is stored transposed (K-major B operands: dW [N, K])
    upstream: dict[str, str]          # forward output -> backward input holding its gradient
    saved: dict[str, str]             # forward tensor kept for the backward -> why
    renamed_inputs: dict[str, str] = field(default_factory=dict)  # backward input -> forward input it is (transposed)
    recomputed: list[str] = field(default_factory=list)           # forward gemms the backward runs again
    fused: bool = False               # policy "fused": forward_text computes the gradients too; no backward
    sums: dict[str, str] = field(default_factory=dict)  # fused, accumulate: gradient -> the earlier chunks' sum

    def ledger(self, sizes: dict[str, int]) -> list[str]:
        """What the derivation decided, in bytes and flops at these sizes: the tensors the forward
        keeps for the backward, and the forward gemms the backward recomputes."""
        from .. import sizes as sizes_mod
        from ..frontend.lower import load_program
        fwd = load_program(self.forward_text, "<forward>", ".")
        lines, total = [], 0
        for name in self.saved:
            t = fwd.tensors[name]
            count = 1
            for dim in t.dims:
                count *= sizes_mod.evaluate(dim, sizes)
            nbytes = count * max(t.dtype.bits, 8) // 8
            total += nbytes
            lines.append(f"saved by the forward: {name} {t.describe()} = {nbytes:,} B")
        lines.append(f"saved in all: {total:,} B")
        for name in self.recomputed:
            k = self.program.kernel(name)
            flops = 2 * sizes_mod.evaluate(k.rows, sizes) * sizes_mod.evaluate(k.k, sizes) * sizes_mod.evaluate(k.n, sizes)
            lines.append(f"recomputed in the backward: gemm {name} ({flops:,} flops)")
        return lines

    @property
    def has_kernels(self) -> bool:
        """False when every gradient is an incoming one passed on as it is (`out y = z`: dz = dy), or
        the forward computes them (policy "fused")."""
        return "\ngemm " in self.backward_text


class _Names:
    def __init__(self, program: Program):
        self.taken = set(program.tensors) | set(program.dims) | {k.name for k in program.kernels} | P.RESERVED \
            | P.BUILTIN_NAMES

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            i += 1
            name = f"{base}{i}"
        self.taken.add(name)
        return name


@dataclass
class _Piece:
    """One gradient contribution to a tensor, computed in backward gemm `at` (its index in order)."""
    at: int
    value: Value


POLICIES = ("save", "recompute")      # what a separate backward program keeps or recomputes
FUSED = "fused"                        # no backward program: the forward computes the gradients


class _Deriver:
    def __init__(self, program: Program, wrt: list[str], straight_through: bool, policy: str = "save"):
        self.p = program
        self.wrt = wrt
        self.st = straight_through
        self.policy = policy
        self.saved_tiles: dict[str, str] = {}            # saved accumulator -> the forward gemm that stores it
        self.recomputed: list[str] = []
        self.names = _Names(program)
        self.gemms: list[GemmText] = []
        self.kernel_dims: list[tuple] = []              # (rows, n) of each emitted gemm
        self.pieces: dict[str, list[_Piece]] = {}       # tensor -> contributions to its gradient
        self.declared: set[str] = set()                 # tensors the backward text declares or stores so far
        self.top_inputs: list[tuple[str, str]] = []     # top-level `in` declarations (name, type)
        self.upstream: dict[str, str] = {}
        self.saved: dict[str, str] = {}
        self.saved_stats: dict[str, tuple[str, Value]] = {}  # saved tensor -> (forward kernel, statistic)
        self.renamed: dict[str, str] = {}
        self.stat_names: dict[int, str] = {}
        self._dims_memo: dict[str, tuple] = {}
        self.needs = self._needs_grad()
        self.primal_inline: DType | None = None          # policy "fused" (autodiff/fused.py)
        self.last_primal: epilogue.Primal | None = None
        self.fused_head: GemmText | None = None          # policy "fused": the gemm that does both

    # ------------------------------------------------------------------ what needs a gradient
    def _needs_grad(self) -> set[str]:
        needs = set(self.wrt)
        for k in self.p.kernels:
            reads = {k.a, k.b} | {v.attrs["tensor"] for v in k.values if P.is_load(v)}
            if reads & needs:
                needs |= {s.tensor for s in k.stores}
        return needs

    def _differentiable_store(self, t: Tensor) -> bool:
        """A store a gradient flows back through: f32/bf16/f16, and not a tensor of block values (block
        scales are quantization metadata; as outputs they are marked non-differentiable)."""
        return t.dtype.name in SMOOTH_CASTS and not t.block

    # ------------------------------------------------------------------ declarations
    def _declare_input(self, name: str) -> None:
        """A forward tensor the backward reads: a top-level `in` (a forward tmp is saved for it)."""
        if name in self.declared:
            return
        t = self.p.tensors[name]
        self.declared.add(name)
        if t.role in ("tmp", "out"):
            self.saved.setdefault(name, "stored by the forward, read by the backward")
        self.top_inputs.append((name, _type(t.dtype, t.dims)))

    def _load(self, name: str, dtype: DType, dims: tuple, rows, n, span=None) -> Value:
        return make("load", (), {"tensor": name, "dtype": dtype, "shape": epilogue.shape_in(dims, rows, n)}, span, name)

    # ------------------------------------------------------------------ one forward gemm
    def _seeds(self, k: GemmKernel, skip: str | None = None, at: tuple | None = None) -> dict[int, Value]:
        """The cotangents of k's stored values (each store's upstream gradient and what later gemms
        sent back), but for the tensor `skip`; at: (rows, n) of the gemm they are loaded in (k's)."""
        rows, n = at or (k.rows, k.n)
        seeds: dict[int, Value] = {}
        for s in k.stores:
            if s.tensor == skip:
                continue
            t = self.p.tensors[s.tensor]
            terms: list[Value] = []
            if t.role == "out" and self._differentiable_store(t):
                name = self.names.fresh(f"d_{t.name}")
                self.upstream[t.name] = name
                self.top_inputs.append((name, _type(t.dtype, t.dims)))
                self._remember_dims(name, t.dims)
                shape = epilogue.shape_in(t.dims, rows, n) if at else s.value.shape
                terms.append(make("load", (), {"tensor": name, "dtype": t.dtype, "shape": shape}, s.span, name))
            for piece in self._take_pieces(s.tensor, rows, n):
                terms.append(piece)
            if not terms:
                continue
            if not self._differentiable_store(t) and not self.st:
                raise error("E901", f"'{t.name}' is stored as {t.dtype}, and a gradient would flow back "
                                     "through that rounding", s.span,
                                     "leave the inputs before it out of --wrt, or ask for straight-through")
            g = terms[0]
            for term in terms[1:]:
                g = make("add", (g, term), {}, s.span)
            seeds[s.value.id] = g if s.value.id not in seeds else make("add", (seeds[s.value.id], g), {}, s.span)
        return seeds

    def _take_pieces(self, tensor: str, rows, n) -> list[Value]:
        """Loads of the gradient contributions later gemms stored for `tensor` (already emitted)."""
        out = []
        for piece in self.pieces.pop(tensor, []):
            out.append(self._materialize(tensor, piece, rows, n))
        return out

    def _materialize(self, tensor: str, piece: _Piece, rows, n) -> Value:
        """Store a contribution in the gemm that computed it (unless it already is a tensor) and load it."""
        v = piece.value
        t = self.p.tensors[tensor]
        if P.is_load(v) and v.attrs["tensor"] in self.declared and v.dtype.name in SMOOTH_CASTS:
            return self._load(v.attrs["tensor"], v.dtype, self._dims_of(v.attrs["tensor"]), rows, n)
        name = self.names.fresh(f"d_{tensor}_part")
        dims = self._grad_dims(tensor)
        dtype = t.dtype if t.dtype.name in SMOOTH_CASTS and t.dims and len(t.dims) == 2 else F32
        self.gemms[piece.at].stores.append(("tmp", name, _type(dtype, dims), v))
        self._remember_dims(name, dims)
        return self._load(name, dtype, dims, rows, n)

    def _grad_dims(self, tensor: str) -> tuple:
        """The dims of a tensor's gradient: a K-major B operand's is dB^T ([N, K], the weight's layout)."""
        t = self.p.tensors[tensor]
        return (t.dims[1], t.dims[0]) if self._is_kmajor_b(tensor) else t.dims

    def _remember_dims(self, name: str, dims) -> None:
        self.declared.add(name)
        self._dims_memo[name] = tuple(dims)

    def _dims_of(self, name: str) -> tuple:
        return self._dims_memo.get(name) or self.p.tensors[name].dims

    def _stat_name(self, kernel: GemmKernel):
        def name(v: Value) -> str:
            if v.id not in self.stat_names:
                base = f"{kernel.name}_{v.name}" if v.name else f"{kernel.name}_stat"
                self.stat_names[v.id] = self.names.fresh(base)
            return self.stat_names[v.id]
        return name

    def kernel(self, k: GemmKernel) -> None:
        a, b = self.p.tensors[k.a], self.p.tensors[k.b]
        want_a, want_b = k.a in self.needs, k.b in self.needs
        loads = [v for v in k.values if P.is_load(v) and v.attrs["tensor"] in self.needs
                 and not v.dtype.is_int]
        if not (want_a or want_b or loads):
            return
        if getattr(k, "a_t", False) or getattr(k, "b_t", False) or a.layout != "row" or b.layout != "kmajor":
            raise error("E903", f"gemm '{k.name}' reads a transposed or row-major operand; its backward is not "
                        "derived yet", k.span)
        if (want_a or want_b) and a.dtype.bits == 16 and self._fused(k, loads, want_a or want_b):
            return
        seeds = self._seeds(k)
        if not seeds:
            return
        if (want_a or want_b) and a.dtype.bits != 16:
            raise error("E903", f"the gradient through gemm '{k.name}' ({a.dtype} x {b.dtype}) is not derived: "
                        "the backward gemms multiply 16-bit operands", k.span, "keep its operands out of --wrt")
        primal = epilogue.Primal(k, self._stat_name(k), inline=self.primal_inline)
        self.last_primal = primal
        stores, dacc = self._leaf_cotangents(k, seeds, primal, loads, want_a or want_b)
        self._keep_statistics(k, primal)
        self._emit_epilogue(k, stores, dacc)

    def _leaf_cotangents(self, k: GemmKernel, seeds: dict[int, Value], primal: epilogue.Primal,
                         loads: list[Value], want_acc: bool) -> tuple[list[tuple[str, Value]], Value | None]:
        """Reverse mode through k's epilogue: (tensor, cotangent) of each load whose gradient is wanted
        (tiles spread to whole tiles), and the accumulator's cotangent (None unless wanted)."""
        acc = next((v for v in k.values if P.is_accumulator(v.op)), None)
        leaves = {v.id for v in loads} | ({acc.id} if want_acc and acc is not None else set())
        cot = epilogue.backprop(k, seeds, primal, self.st, leaves)
        stores = []
        for v in loads:
            c = cot.get(v.id)
            if c is None:
                continue
            if "period" in v.attrs:
                raise error("E903", f"the gradient of the per-head vector '{v.attrs['tensor']}' is not derived yet",
                            v.span, f"keep {v.attrs['tensor']} out of --wrt")
            stores.append((v.attrs["tensor"], epilogue.as_tile(c, primal(v).shape) if v.kind is Kind.TILE else c))
        dacc = cot.get(acc.id) if want_acc and acc is not None else None
        return stores, dacc

    def _keep_statistics(self, k: GemmKernel, primal: epilogue.Primal) -> None:
        for name, stat in primal.used.items():
            self.saved_stats[name] = (k.name, stat)
            self.saved[name] = f"a statistic of gemm {k.name}, saved by the forward"

    # ------------------------------------------------------------------ pattern D: fused into the dA gemm
    def _fusion_target(self, k: GemmKernel) -> int | None:
        """The backward gemm whose accumulator is the whole incoming gradient of k's one stored tile
        (the dA gemm of the one gemm that reads it as its A operand), when k's backward epilogue can run
        there on the accumulator the forward saved: the "save" policy, nothing else reading the tile,
        and an epilogue without coordinates or block statistics (they would see the other gemm's columns)."""
        if self.policy != "save":
            return None
        tmps = {s.tensor for s in k.stores if self.p.tensors[s.tensor].role == "tmp"}
        if len(tmps) != 1 or any(self.p.tensors[s.tensor].role != "out" for s in k.stores if s.tensor not in tmps):
            return None                   # one tile for the next gemm; outputs besides it are fine
        name = tmps.pop()
        t = self.p.tensors[name]
        if not self._differentiable_store(t):
            return None
        readers = [c for c in self.p.kernels if c.a == name or c.b == name
                   or any(P.is_load(v) and v.attrs["tensor"] == name for v in c.values)]
        if len(readers) != 1 or readers[0].a != name or getattr(readers[0], "a_t", False):
            return None
        for v in k.values:
            p = P.prim(v.op)
            if p.family is P.Family.BLOCK or (p.family is P.Family.SOURCE and p.keyword and not P.is_accumulator(v.op)):
                return None
        pieces = self.pieces.get(name, [])
        if len(pieces) != 1 or pieces[0].at < 0 or not P.is_accumulator(pieces[0].value.op):
            return None
        return pieces[0].at

    def _fused_tile(self, k: GemmKernel) -> str:
        return next(s.tensor for s in k.stores if self.p.tensors[s.tensor].role == "tmp")

    def _fused(self, k: GemmKernel, loads: list[Value], want_acc: bool) -> bool:
        """Pattern D: k's backward epilogue in the epilogue of the gemm that produces its incoming
        gradient, on the accumulator the forward saved, instead of in a gemm that recomputes it."""
        at = self._fusion_target(k)
        if at is None:
            return False
        rows, n = self.kernel_dims[at]
        a = self.p.tensors[k.a]
        saved = self.names.fresh(f"{k.name}_acc")
        acc_load = make("load", (), {"tensor": saved, "dtype": a.dtype,
                                     "shape": epilogue.shape_in((k.rows, k.n), rows, n)}, k.span, saved)
        primal = epilogue.Primal(k, self._stat_name(k), rebase=(rows, n, acc_load, self.p.tensors))
        tile = self._fused_tile(k)
        incoming = self.pieces[tile][0].value
        taken = set(self.names.taken)
        saved_state = (dict(self.upstream), list(self.top_inputs), set(self.declared), dict(self._dims_memo),
                       {t: list(v) for t, v in self.pieces.items()}, [len(g.stores) for g in self.gemms])
        seeds = self._seeds(k, skip=tile, at=(rows, n))
        for s in k.stores:
            if s.tensor == tile:
                seeds[s.value.id] = incoming if s.value.id not in seeds else make("add", (seeds[s.value.id], incoming), {})
        requests, dacc = self._leaf_cotangents(k, seeds, primal, loads, want_acc)
        if dacc is not None:
            requests.append(("#acc", epilogue.as_tile(dacc, acc_load.shape)))
        order = topo_order([v for _, v in requests])
        # dacc is finished by the row combine only where a gemm reads it transposed (dB^T = dacc^T @ A):
        # read by dA alone, its row sum would have to be deferred into dA, which it is not shaped for
        finishable = k.b in self.needs or dacc is None
        if any(_crosses(x) for v in order for x in v.args) and not (finishable and finished_by_row_combine(order, requests)):
            # a backward sum that tiles need and the row combine kernel cannot finish: stages instead
            self.upstream, self.top_inputs, self.declared, self._dims_memo, self.pieces, counts = saved_state
            for g, count in zip(self.gemms, counts):
                del g.stores[count:]
            self.names.taken = taken
            return False
        # committed: the incoming gradient is consumed here, the forward saves k's accumulator
        self.pieces.pop(tile)
        self.saved_tiles[saved] = k.name
        self.saved[saved] = f"the accumulator of gemm {k.name}, saved by the forward (its backward runs in " \
                            f"{self.gemms[at].name}'s epilogue)"
        self._remember_dims(saved, (k.rows, k.n))
        self.top_inputs.append((saved, _type(a.dtype, (k.rows, k.n))))
        self._keep_statistics(k, primal)
        self.gemms[at].comment += f"\nand the backward of gemm {k.name}'s epilogue, on its saved accumulator {saved}"
        dacc_name = None
        for tensor, v in requests:
            if tensor == "#acc":
                dacc_name = self.names.fresh(f"d_{k.name}_acc")
                self.gemms[at].stores.append(("tmp", dacc_name, _type(a.dtype, (k.rows, k.n)), v))
                self._remember_dims(dacc_name, (k.rows, k.n))
            else:
                self.pieces.setdefault(tensor, []).append(_Piece(at, v))
        if dacc_name is not None:
            self._emit_operand_gemms(k, dacc_name)
        return True

    def _emit_epilogue(self, k: GemmKernel, stores: list[tuple[str, Value]], dacc: Value | None) -> None:
        a = self.p.tensors[k.a]
        dacc_name = None
        dacc_value = None
        if dacc is not None:
            dacc = epilogue.as_tile(dacc, Shape(Kind.TILE))
            if P.is_load(dacc) and dacc.dtype is a.dtype and dacc.kind is Kind.TILE and dacc.shape.width == 1:
                dacc_name = dacc.attrs["tensor"]          # the gradient arrives as a tensor: use it as it is
            else:
                dacc_value = dacc
        requests: list[tuple[str, Value]] = []
        for tensor, v in stores:
            if _passes_through(v, self.declared):    # a gradient that arrives as a tensor and goes on as it is
                self.pieces.setdefault(tensor, []).append(_Piece(-1, v))
            else:
                requests.append((tensor, v))
        if dacc_value is not None:
            requests.append(("#acc", dacc_value))
        if requests:
            dacc_name = self._emit_stages(k, requests, a.dtype) or dacc_name
        if dacc_name is not None:
            self._emit_operand_gemms(k, dacc_name)

    def _emit_operand_gemms(self, k: GemmKernel, dacc_name: str) -> None:
        rows, n, kd = k.rows, k.n, k.k
        if k.a in self.needs:                          # dA [M, K] = dacc [M, N] @ B^T
            renamed = k.b not in self.declared
            b_operand = self._renamed_b(k) if renamed else f"{k.b}.T"
            g = GemmText(self.names.fresh(f"{k.name}_da"), dacc_name, b_operand,
                         ["b_major = n"] if renamed else [],     # W [N, K] as it is: N-major
                         comment=f"the gradient of {k.a}: {dacc_name} @ {k.b}^T")
            self.gemms.append(g)
            self.kernel_dims.append((rows, kd))
            acc = make("acc", (), {})
            self._add_piece(k.a, acc)
        if k.b in self.needs:                          # dB^T [N, K] = dacc^T [N, M] @ A [M, K]
            self._declare_operand(k.a)
            g = GemmText(self.names.fresh(f"{k.name}_db"), f"{dacc_name}.T", k.a,
                         comment=f"the gradient of {k.b}, transposed: {dacc_name}^T @ {k.a} ([N, K], the layout of "
                                 f"the weight W that {k.b} = W.t() views)")
            self.gemms.append(g)
            self.kernel_dims.append((n, kd))
            self._add_piece(k.b, make("acc", (), {}))

    def _renamed_b(self, k: GemmKernel) -> str:
        """B read row-major ([N, K], K contiguous) when no earlier backward gemm declared it K-major."""
        b = self.p.tensors[k.b]
        name = self.names.fresh(f"{k.b}_t")
        self.renamed[name] = k.b
        self.declared.add(name)
        return f"{name}: {_type(b.dtype, (b.dims[1], b.dims[0]))}"

    def _declare_operand(self, name: str) -> None:
        if name not in self.declared:
            self._declare_input(name)

    def _add_piece(self, tensor: str, v: Value) -> None:
        self.pieces.setdefault(tensor, []).append(_Piece(len(self.gemms) - 1, v))

    def _emit_stages(self, k: GemmKernel, requests: list[tuple[str, Value]], operand_dtype: DType) -> str | None:
        """The recompute gemm(s) of k's backward epilogue: a backward row or column sum that later
        values need ends a stage (stored f32, loaded by the next)."""
        roots = [v for _, v in requests]
        order = topo_order(roots)
        level: dict[int, int] = {}
        last_use: dict[int, int] = {}          # the latest stage that reads each value
        for v in order:
            level[v.id] = max((level[x.id] + (1 if self._stage_ends(x) else 0) for x in v.args), default=0)
            for x in v.args:
                last_use[x.id] = max(last_use.get(x.id, 0), level[v.id])
        stages = max((level[v.id] for v in roots), default=0) + 1
        boundary: dict[int, str] = {}
        dacc_name = None
        b = self.p.tensors[k.b]
        for s in range(stages):
            self._declare_operand(k.a)
            b_text = f"{k.b}: {_type(b.dtype, b.dims)}" if k.b not in self.declared else k.b
            self.declared.add(k.b)
            self.recomputed.append(k.name)
            g = GemmText(self.names.fresh(f"{k.name}_bwd" if stages == 1 else f"{k.name}_bwd{s}"), k.a, b_text,
                         comment=f"backward of gemm {k.name}'s epilogue" + (f", stage {s + 1} of {stages}"
                                                                             if stages > 1 else ""))
            self.gemms.append(g)
            self.kernel_dims.append((k.rows, k.n))
            here = len(self.gemms) - 1
            memo: dict[int, Value] = {}
            # statistics this stage computes for later ones
            for v in order:
                if self._stage_ends(v) and level[v.id] == s and last_use.get(v.id, s) > s:
                    name = self.names.fresh(f"{k.name}_g")
                    boundary[v.id] = name
                    g.stores.append(("tmp", name, _type(F32, v.shape.dims(k.rows, k.n)), self._cut(v, boundary, memo)))
                    self._remember_dims(name, v.shape.dims(k.rows, k.n))
            for tensor, v in requests:
                if level[v.id] != s:
                    continue
                v = self._cut(v, boundary, memo)
                if tensor == "#acc":
                    dacc_name = self.names.fresh(f"d_{k.name}_acc")
                    g.stores.append(("tmp", dacc_name, _type(operand_dtype, (k.rows, k.n)), v))
                    self._remember_dims(dacc_name, (k.rows, k.n))
                else:
                    self.pieces.setdefault(tensor, []).append(_Piece(here, v))
        return dacc_name

    def _stage_ends(self, v: Value) -> bool:
        """A reduction across tiles ends a stage, except a forward statistic computed in place (policy
        "fused": the row combine kernel finishes the tiles that need it)."""
        return _crosses(v) and not (self.last_primal is not None and v.id in self.last_primal.inlined)

    def _cut(self, v: Value, boundary: dict[int, str], memo: dict[int, Value]) -> Value:
        """v with the statistics of earlier stages replaced by loads of what those stages stored (memo:
        shared by the values of one stage, so that they share their parts)."""
        if v.id in memo:
            return memo[v.id]
        for x in topo_order([v]):
            if x.id in memo:
                continue
            if x.id in boundary and x is not v:
                name = boundary[x.id]
                memo[x.id] = make("load", (), {"tensor": name, "dtype": F32, "shape": x.shape}, x.span, name)
                continue
            args = tuple(memo[a.id] for a in x.args)
            memo[x.id] = x if all(p is a for p, a in zip(args, x.args)) else make(x.op, args, x.attrs, x.span)
        return memo[v.id]

    # ------------------------------------------------------------------ the gradients of the inputs
    def finish(self) -> dict[str, str]:
        grads: dict[str, str] = {}
        for name in self.wrt:
            pieces = self.pieces.pop(name, [])
            if not pieces:
                continue
            t = self.p.tensors[name]
            last = max(pieces, key=lambda p: p.at)
            if last.at < 0:
                if len(pieces) > 1:
                    raise error("E903", f"the gradient of '{name}' is a sum of incoming gradients with no gemm to add "
                                "them in", t.span, f"keep {name} out of --wrt")
                grads[name] = last.value.attrs["tensor"]      # the gradient is a backward input as it is
                continue
            rows, n = self.kernel_dims[last.at]
            value = last.value
            for other in pieces:
                if other is not last:
                    value = make("add", (value, self._materialize(name, other, rows, n)), {})
            out = self.names.fresh(f"d_{name}")
            dims = self._grad_dims(name)
            dtype = t.dtype
            self.gemms[last.at].stores.append(("out", out, _type(dtype, dims), value))
            grads[name] = out
        return grads

    def _is_kmajor_b(self, name: str) -> bool:
        return self.p.tensors[name].layout == "kmajor"

    @property
    def transposed(self) -> set[str]:
        """Inputs whose gradient is dB^T: B operands read K-major (the user passes W.t())."""
        return {name for name in self.wrt if self._is_kmajor_b(name)
                and any(k.b == name for k in self.p.kernels)}

    def text(self) -> str:
        for g in self.gemms:                       # forward tensors the backward epilogues read
            for x in topo_order([v for *_, v in g.stores]):
                name = x.attrs.get("tensor") if P.is_load(x) else None
                if name in self.saved_stats and name not in self.declared:
                    kernel = self.p.kernel(self.saved_stats[name][0])
                    stat = self.saved_stats[name][1]
                    self.declared.add(name)
                    self.top_inputs.append((name, _type(F32, stat.shape.dims(kernel.rows, kernel.n))))
                elif name in self.p.tensors and name not in self.declared:
                    self._declare_input(name)
        lines = []
        for name, type_text in self.top_inputs:
            t = self.p.tensors.get(name)
            default = f" = {t.default!r}" if t is not None and t.role == "scalar" and t.default is not None else ""
            lines.append(f"in {name}: {type_text}{default}")
        taken = self.names.taken
        return "\n".join(lines + [""] + [g.render(taken) + "\n" for g in self.gemms])


def _passes_through(v: Value, declared: set[str]) -> bool:
    return P.is_load(v) and v.attrs["tensor"] in declared and v.dtype.name in SMOOTH_CASTS


def default_wrt(program: Program) -> list[str]:
    """Every floating-point tensor input of at least 16 bits (weights, activations, vectors), except
    per-head vectors (their gradient, a sum over heads, is not derived yet: `not_derived`)."""
    periodic = not_derived(program)
    return [t.name for t in program.inputs() if t.dims and t.dtype.is_float and t.dtype.bits >= 16
            and t.name not in periodic]


def not_derived(program: Program) -> set[str]:
    """Inputs whose gradient epic cannot derive yet: vectors read once per head."""
    return {v.attrs["tensor"] for k in program.kernels for v in k.values if P.is_load(v) and "period" in v.attrs}


def check_wrt(program: Program, wrt: list[str]) -> list[str]:
    out = []
    for name in wrt:
        t = program.tensors.get(name)
        if t is None:
            raise error("E902", f"--wrt names '{name}', which is not a tensor of the program", None,
                        "inputs: " + ", ".join(default_wrt(program)))
        if t.role not in ("input",):
            why = "a scalar (runtime scalars have no gradient yet)" if t.role == "scalar" else f"an {t.role} tensor"
            raise error("E902", f"'{name}' is {why}; gradients are taken with respect to inputs", t.span,
                        "inputs: " + ", ".join(default_wrt(program)))
        if not t.dtype.is_float or t.dtype.bits < 16:
            raise error("E902", f"'{name}' is {t.dtype}, which has no gradient", t.span,
                        "gradients are taken with respect to f32, bf16 or f16 tensors")
        if name not in out:
            out.append(name)
    return out


def derive(program: Program, wrt: list[str] | None = None, straight_through: bool = False,
           source_name: str = "<program>", policy: str = "save", accumulate: bool = False) -> Derivation:
    """The backward of a source-level program (straight from the front end, before any pass).
    policy "save": a gemm whose one stored tile feeds only the next gemm's A operand has its backward
    epilogue run in that gemm's dA gemm, on its accumulator saved by the forward (pattern D; one gemm
    fewer, the saved tile's bytes more); "recompute": every backward epilogue runs in a gemm that
    recomputes its forward accumulator; "fused": one program computes the outputs and the gradients,
    the outputs' cotangents given with the inputs (a loss head: autodiff/fused.py)."""
    if policy not in POLICIES + (FUSED,):
        raise error("E801", f"unknown policy '{policy}'", None, "policies: " + ", ".join(POLICIES + (FUSED,)))
    from .forward import program_text
    wrt = check_wrt(program, wrt) if wrt else default_wrt(program)
    if not wrt:
        raise error("E902", "the program has no floating-point tensor input to take a gradient with respect to",
                    None)
    d = _Deriver(program, wrt, straight_through, "recompute" if policy == FUSED else policy)
    if policy == FUSED:
        derive_fused(program, d)
    else:
        for k in reversed(program.kernels):
            d.kernel(k)
    if not d.upstream:
        outs = [t.name for t in program.outputs()]
        raise error("E902", f"no output of the program carries a gradient back to {', '.join(wrt)} (outputs: "
                    f"{', '.join(outs)}; quantized outputs and block scales have none)", None,
                    "gradients flow back from f32, bf16 or f16 outputs that depend on the inputs")
    grads = d.finish()
    if policy == FUSED:
        refuse_unfinishable(d, program)
    sums = accumulate_sums(d, grads, program) if accumulate and policy == FUSED else {}
    missing = [name for name in wrt if name not in grads]
    backward = d.text()
    extra: dict[str, list] = {}
    for name, kernel in d.saved_tiles.items():
        k = program.kernel(kernel)
        acc = next(v for v in k.values if P.is_accumulator(v.op))
        extra.setdefault(kernel, []).append((name, _type(program.tensors[k.a].dtype, (k.rows, k.n)), acc))
    for name, (kernel, stat) in d.saved_stats.items():
        k = program.kernel(kernel)
        extra.setdefault(kernel, []).append((name, _type(F32, stat.shape.dims(k.rows, k.n)), stat))
    keep = {name for name in d.saved if name in program.tensors and program.tensors[name].role == "tmp"}
    forward = program_text(program, keep, extra, d.names.taken,
                           header=f"Forward of {source_name} for training: it also stores what the backward reads.")
    header = [f"Backward of {source_name}, derived by epic grad.",
              "Gradients: " + ", ".join(f"{grads[n]} = d loss / d {n}" + (" (transposed: [N, K])"
                                                                         if n in d.transposed else "")
                                        for n in wrt if n in grads)]
    if missing:
        header.append("No gradient flows to: " + ", ".join(missing) + " (they do not reach a differentiable output).")
    skipped = sorted(not_derived(program) - set(wrt))
    if skipped:
        header.append("Not derived yet: " + ", ".join(skipped) + " (per-head vectors: their gradient sums over heads).")
    if d.upstream:
        header.append("Inputs: " + ", ".join(f"{v} = d loss / d {k}" for k, v in d.upstream.items())
                      + "; the forward's inputs; and what it saved: " + (", ".join(d.saved) or "nothing"))
    if policy == FUSED:
        header[0] = f"Forward of {source_name} with its gradient (policy fused), derived by epic grad."
        header[-1] = "Inputs: " + ", ".join(f"{v} = d loss / d {k} (the weight of each row in the loss)"
                                             for k, v in d.upstream.items()) + "; the forward's inputs"
        text = "\n".join(f"# {line}" for line in header) + "\n" + backward
        return Derivation(program, text, "", wrt, grads, {n for n in grads if n in d.transposed},
                          dict(d.upstream), {}, dict(d.renamed), [], fused=True, sums=sums)
    text = "\n".join(f"# {line}" for line in header) + "\n" + backward
    return Derivation(program, forward, text, wrt, grads, {n for n in grads if n in d.transposed},
                      dict(d.upstream), dict(d.saved), dict(d.renamed), list(d.recomputed))


def derive_source(path_or_text, wrt: list[str] | None = None, straight_through: bool = False,
                  path: bool | None = None, policy: str = "save", accumulate: bool = False) -> Derivation:
    """Check a program (file or text) as `epic check` does, then derive its backward."""
    from .. import pipeline
    analysis = pipeline.analyze(path_or_text, path=path)
    program = analysis.source_program
    return derive(program, wrt, straight_through, source_name=program.name, policy=policy, accumulate=accumulate)
