"""A derived backward program run on slices of its rows (epic.autograd(..., chunk_rows=N)), so that its
[M, ...] intermediates (cross entropy's dlogits [M, V]) exist for N rows at a time.

Every tensor whose first dimension is the program's row dimension M is sliced. What a chunk computes
is one of three kinds, decided from the backward program before anything runs:
  "row"  row-local values (a gemm with M rows, row reductions): the slices of per-row outputs;
  "sum"  sums over the rows (the acc of a gemm whose K is M: dW = dacc^T @ X; col_sum): over all rows
         they are the sum of the chunks' values, so outputs without M are summed over chunks;
  "inv"  what no row changes (weights, [N] inputs, literals, scalars).
A "sum" may only be combined linearly (added, negated, scaled by an "inv"); anything else (a max over
columns, exp of a sum, a whole-tensor statistic, the row index, M as a number) would change with the
chunking and is refused (E903).
"""
from __future__ import annotations

import torch

from ..diagnostics import error
from ..ir import primitives as P
from ..ir.primitives import Family
from ..ir.core import Program, topo_order
from ..shapes import Dim

_LINEAR = {"sum", "negation"}          # algebra of add/sub and neg
_HINT = "leave chunk_rows out for this program (the backward then runs on all rows at once)"


def _refuse(why: str, span=None):
    return error("E903", f"chunk_rows: {why}; chunking the backward over rows would change its result", span, _HINT)


class RowChunks:
    def __init__(self, forward: Program, backward: Program, chunk_rows: int):
        self.rows = self._check_rows(chunk_rows)
        self.dim = _row_dim(forward)
        self.program = backward
        tensors = backward.tensors
        for t in tensors.values():
            if any(self.dim.names[0] in d.names for d in t.dims[1:]):
                raise _refuse(f"'{t.name}' has the row dimension {self.dim} in another place than first", t.span)
        self.sliced = {t.name for t in backward.inputs() if _per_row(t.dims, self.dim)}
        self.per_row = {t.name for t in backward.outputs() if _per_row(t.dims, self.dim)}
        self.summed = {t.name for t in backward.outputs()} - self.per_row
        stored: dict[str, str] = {}              # tensors the backward stores -> the kind of what it stores
        for k in backward.kernels:
            if k.k == self.dim and k.rows != self.dim:
                acc = "sum"
            elif k.rows == self.dim and k.k != self.dim:
                acc = "row"
            else:
                raise _refuse(f"gemm '{k.name}' does not have exactly one of its rows and its inner dimension "
                              f"{self.dim}", k.span)
            kind = _Kinds(self, acc, stored, tensors, k.name).of
            for s in k.stores:
                got = kind(s.value)
                want = "row" if _per_row(tensors[s.tensor].dims, self.dim) else "sum"
                if got != want and not (want == "row" and got == "inv"):
                    where = "a per-row tensor" if want == "row" else f"a tensor without {self.dim} (summed over chunks)"
                    raise _refuse(f"'{s.tensor}' is {where} but would store a value that is {_WORDS[got]}", s.span)
                stored[s.tensor] = want

    @staticmethod
    def _check_rows(chunk_rows) -> int:
        if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise error("E903", f"chunk_rows must be a positive integer, got {chunk_rows!r}")
        return chunk_rows

    # ------------------------------------------------------------------ running
    def run(self, call, feed: dict) -> dict[str, torch.Tensor]:
        """call(**feed) on row slices of `feed`, per-row outputs written into their rows of the whole,
        summed ones added up (in place, in the output's dtype)."""
        m = next((feed[n].shape[0] for n in self.sliced if n in feed), None)
        if m is None or m <= self.rows:
            return call(**feed)
        out: dict[str, torch.Tensor] = {}
        for start in range(0, m, self.rows):
            stop = min(start + self.rows, m)
            part = call(**{k: _rows(v, start, stop) if k in self.sliced else v for k, v in feed.items()})
            for name, value in part.items():
                if name in self.per_row:
                    if name not in out:
                        out[name] = value.new_empty((m, *value.shape[1:]))
                    out[name][start:stop].copy_(value)
                elif name not in out:
                    out[name] = value
                else:
                    out[name].add_(value)
            del part
        return out

    def chunk_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        """The sizes one chunk runs at."""
        name = self.dim.names[0]
        return {**sizes, name: min(int(sizes[name]), self.rows)}


def _rows(x, start: int, stop: int):
    part = x[start:stop]
    # a kernel wants 16-byte aligned tensors: an [M] vector's slice may not start on one
    return part.clone() if part.data_ptr() % 16 else part


_WORDS = {"row": "different in every row", "sum": "a sum over the rows", "inv": "the same for every chunk"}


def _row_dim(forward: Program) -> Dim:
    dims = {k.rows for k in forward.kernels if k.kind == "gemm"}
    if len(dims) != 1:
        raise _refuse("the forward's gemms do not share one row dimension")
    dim = dims.pop()
    if dim.coef != 1 or len(dim.names) != 1:
        raise _refuse(f"the row dimension {dim} is not a plain name")
    return dim


def _per_row(dims: tuple, row: Dim) -> bool:
    return bool(dims) and dims[0] == row


class _Kinds:
    """The kind ("row", "sum", "inv") of each value of one backward gemm."""

    def __init__(self, chunks: RowChunks, acc: str, stored: dict, tensors: dict, gemm: str):
        self.c, self.acc, self.stored, self.tensors, self.gemm = chunks, acc, stored, tensors, gemm
        self.memo: dict[int, str] = {}

    def of(self, root) -> str:
        for v in topo_order([root]):
            if v.id not in self.memo:
                self.memo[v.id] = self._kind(v, [self.memo[a.id] for a in v.args])
        return self.memo[root.id]

    def _kind(self, v, args: list[str]) -> str:
        row_dim = self.c.dim
        if P.is_accumulator(v.op):
            return self.acc
        if P.is_load(v):
            name = v.attrs["tensor"]
            if name in self.stored:
                return self.stored[name]
            return "row" if _per_row(self.tensors[name].dims, row_dim) else "inv"
        family = P.family(v.op)
        if P.prim(v.op).keyword == "row":
            raise _refuse("the backward reads the row index", v.span)
        if family is Family.SOURCE and "dim" in v.attrs and row_dim.names[0] in str(v.attrs["dim"]):
            raise _refuse(f"the backward uses {v.attrs['dim']} as a number", v.span)
        if not args:
            return "inv"
        if "sum" not in args:
            if family is Family.REDUCE and v.attrs["axis"] == "col" and self.acc == "row":
                if P.is_whole_tensor_reduce(v.args[0].kind, "col"):
                    raise _refuse(f"the backward takes a whole-tensor {v.attrs['fn']}", v.span)
                if v.attrs["fn"] != "sum":
                    raise _refuse(f"the backward takes col_{v.attrs['fn']} over the rows", v.span)
                return "sum"
            return "row" if "row" in args else "inv"
        return self._linear(v, args)

    def _linear(self, v, args: list[str]) -> str:
        """A value with a "sum" operand: a sum again where it is linear in it, else refused."""
        family, algebra = P.family(v.op), P.prim(v.op).algebra
        ok = False
        if algebra in _LINEAR or family in (Family.CAST, Family.PAIR):
            ok = all(k == "sum" or P.is_literal(a) and float(a.attrs["value"]) == 0.0 for a, k in zip(v.args, args))
        elif algebra == "product":
            ok = sorted(args) == ["inv", "sum"]
        elif algebra == "quotient":
            ok = args == ["sum", "inv"]
        elif family is Family.SELECT:
            ok = args[0] == "inv" and all(k == "sum" or P.is_literal(a) and float(a.attrs["value"]) == 0.0
                                          for a, k in zip(v.args[1:], args[1:]))
        elif family in (Family.REDUCE, Family.BLOCK):
            ok = v.attrs.get("fn") == "sum" and not (family is Family.REDUCE and P.is_whole_tensor_reduce(
                v.args[0].kind, v.attrs["axis"]))
        if not ok:
            raise _refuse(f"gemm '{self.gemm}' computes '{_show(v)}' of a sum over the rows, which is not "
                          "linear in it", v.span)
        return "sum"


def _show(v) -> str:
    return v.attrs.get("fn") or v.op
