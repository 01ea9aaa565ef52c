"""Row-scale deferral: move a per-row scale out of a GEMM's epilogue into the next GEMM's.

If a stored tile t = s * V, where s is constant along each row and needs a whole-row reduction
(RMSNorm's r = 1/rms(h)), and t is read only as the A operand of later GEMMs, then for each of
those GEMMs (s * V) @ W = s * (V @ W) row by row: store V instead, and multiply the consumer's
accumulator by s[row]. s itself becomes a small [M] buffer (finished by a combine kernel, see
split_reductions). The product is flattened through *, / and integer powers, so any operand
order works. Where a sum carries the reduction (LayerNorm: (h - mu) * r * gamma + beta), t is
expanded into terms (affine_terms.py): one tile term a * T, whose T is stored and whose a scales the
consumer's accumulator, and row terms b_j * R_j, which the consumer adds as b_j[row] * (R_j @ W)[col]
from a derived tensor R_j @ W (computed from the weights before the kernels, runtime/derived.py).
Anything else that carries the reduction into t (silu(r*h), a per-column statistic) cannot be moved,
and the pass says why.

A scale never crosses a store or cast that rounds coarsely or saturates (integers, fp8, f16's
overflow): i8(r * v) != r * i8(v). Such stores are left for split-reductions, which finishes them in
the row combine kernel (epic/checks/row_finish.py).

The identity holds for real numbers. Where s is inf or nan (a zero row sum under a division), the
two forms can differ in which non-finite value they produce: the source sums infinities of both
signs into nan where the rewrite multiplies a finite product by inf.
"""
from __future__ import annotations

from ..checks.locality import describe_reduction, reductions_feeding
from ..checks.row_finish import commutes_with_scale, nonlinear_crossing
from ..checks import row_finish
from ..diagnostics import Diagnostic, EpicError
from ..dtypes import F32
from ..ir import core
from ..ir import primitives as P
from ..ir.core import Store, Tensor, Value, topo_order
from ..shapes import COL, ROW, Kind
from . import affine_terms as AT
from .rewrite import make, product, rebuild

SUFFIX = "__rowscale"    # internal names contain "__", which user names cannot
SHIFT = "__rowshift"     # b_j of a deferred affine form (see affine_terms)


class _NotLinear(Exception):
    def __init__(self, culprit: Value, why: str):
        self.culprit, self.why = culprit, why


def _flatten(v: Value, dep: dict, exp: int, out: list, sign: list) -> None:
    """Collect the factors of a product tree: (value, exponent) pairs; a sign flip for neg. Walks
    with an explicit stack (a product of thousands of factors), left to right as recursion would."""
    stack = [(v, exp)]
    while stack:
        v, exp = stack.pop()
        if v.id not in dep:        # tile-local factor: keep it whole
            out.append((v, exp))
            continue
        algebra = P.prim(v.op).algebra
        if algebra == "product":
            stack.extend((a, exp) for a in reversed(v.args))
            continue
        if algebra == "quotient":
            stack += [(v.args[1], -exp), (v.args[0], exp)]
            continue
        if algebra == "negation":
            sign[0] = -sign[0]
            stack.append((v.args[0], exp))
            continue
        if algebra == "power" and v.kind is not Kind.COL:      # (r * x) ** p = r ** p * x ** p
            stack.append((v.args[0], exp * v.attrs["exp"]))
            continue
        if v.kind is Kind.COL or v.kind is Kind.SCALAR:
            out.append((v, exp))    # a row-constant factor that needs a reduction: the scale
            continue
        if v.kind is Kind.ROW:
            raise _NotLinear(v, "it is a per-column statistic; only a per-row scale commutes with the right "
                                "matrix product ((x * c[col]) @ W != c * (x @ W))")
        raise _NotLinear(v, f"the reduction reaches it through `{v.op}`, which is not a product; "
                            "(r * x) @ W = r * (x @ W) holds only when r multiplies the whole row")


def _called(v: Value) -> str:
    """How a message names a value: its name, else where it is (an internal op name means nothing to
    the user)."""
    if v.name:
        return f"'{v.name}'"
    return f"the value at {v.span.line}:{v.span.column}" if v.span else "a value"


def _reduction_behind(v: Value, dep: dict) -> Value:
    """The whole-row/column reduction that makes v non-local: the nearest one among its operands
    (for a per-column value, a column reduction), not just the first the stored value depends on."""
    found, frontier, seen = [], [v], set()
    while frontier:
        x = frontier.pop(0)
        if x.id in seen or x.id not in dep:
            continue
        seen.add(x.id)
        if P.family(x.op) is P.Family.REDUCE:
            found.append(x)
        else:
            frontier.extend(x.args)
    if v.kind is Kind.ROW:
        found = [r for r in found if r.attrs["axis"] == "col"] or found
    return found[0] if found else dep[v.id]


def run(program, trace=None):
    kernels = list(program.kernels)
    tensors = dict(program.tensors)
    unscalable = row_finish.unscalable_reads(program)
    for i, k in enumerate(kernels):
        if k.kind != "gemm":
            continue
        dep = reductions_feeding(k)
        replaced: dict[str, Value] = {}
        extra: list[Store] = []
        for s in k.stores:
            v = s.value
            if v.kind is not Kind.TILE or v.id not in dep:
                continue
            if _stays(k, s, tensors[s.tensor], dep, unscalable):
                continue
            consumers = [c for c in kernels[i + 1:] if c.kind == "gemm" and c.a == s.tensor]
            if not consumers:
                continue        # nothing to defer into: the locality check reports it
            try:
                new_value, scale = _split(v, dep)
            except _NotLinear as e:
                affine = _affine(v, dep, s, tensors, consumers, k) if P.prim(e.culprit.op).algebra == "sum" \
                    else None
                if affine is not None:      # LayerNorm: a scaled tile plus scaled row vectors
                    new_value, scale, shifts = affine
                    replaced[s.tensor] = new_value
                    extra += _defer_affine(s, k, scale, shifts, tensors, kernels, consumers)
                    continue
                r = _reduction_behind(e.culprit, dep)
                notes = [(s.span, f"'{s.tensor}' is the A operand of gemm '{consumers[0].name}'")]
                if r is not e.culprit and r.span and str(r.span) != str(e.culprit.span):
                    notes.insert(0, (r.span, f"the {r.attrs['axis']} reduction is here"))
                raise EpicError(Diagnostic(
                    "E501", f"cannot move the row scale of '{s.tensor}' into gemm '{consumers[0].name}': "
                    f"{_called(e.culprit)} needs {describe_reduction(r, k)}, and {e.why}",
                    e.culprit.span or s.span,
                    "apply the non-linear part after the next gemm, or store the statistic "
                    "(out r: f32[M] = ...) and the unscaled value separately", notes)) from None
            buf = s.tensor + SUFFIX
            tensors[buf] = Tensor(buf, F32, (k.rows,), "buffer", s.span, producer=k.name)
            replaced[s.tensor] = new_value
            extra.append(Store(buf, scale, s.span))
            for j, c in enumerate(kernels):
                if c in consumers:
                    kernels[j] = _scale_accumulator(c, buf)
        if replaced:
            stores = [Store(s.tensor, replaced.get(s.tensor, s.value), s.span) for s in k.stores] + extra
            kernels[i] = k.with_values(topo_order([s.value for s in stores]), stores)
    return program.replace_kernels(kernels, tensors)


def _stays(k, s: Store, t: Tensor, dep: dict, unscalable: frozenset) -> bool:
    """A store whose row scale is not deferred: quantizing (no scale crosses it) or returned; the row
    combine kernel finishes it (split-reductions), or the locality check says why it cannot."""
    return row_finish.finished_after_row(k, s, t, dep, unscalable) or nonlinear_crossing(s, t, dep) is not None


def _split(v: Value, dep: dict) -> tuple[Value, Value]:
    """v = scale * rest with scale row-constant and non-local; returns (rest, scale)."""
    inner, cast = v, None
    if P.family(v.op) is P.Family.CAST and commutes_with_scale(v.dtype):
        inner, cast = v.args[0], v
    factors: list[tuple[Value, int]] = []
    sign = [1]
    _flatten(inner, dep, 1, factors, sign)
    scale = [(f, e) for f, e in factors if f.id in dep]
    rest = [(f, e) for f, e in factors if f.id not in dep]
    if not any(f.kind is Kind.TILE for f, _ in rest):
        raise _NotLinear(v, "no tile-shaped factor is left to store once the row scale is removed")
    value = product(rest, v)
    if sign[0] < 0:
        value = make("neg", (value,), like=v)
    if cast is not None:
        value = make("cast", (value,), {"to": cast.dtype}, like=cast)
    if all(value is not f for f, _ in rest):
        value.name = v.name      # name the new value only, never one shared with an earlier stage
    return value, product(scale, v)


def _scale_accumulator(kernel, buffer: str):
    load = core.make("load", (), {"tensor": buffer, "dtype": F32, "shape": COL}, kernel.span, buffer)

    def scale(v, args):
        if P.is_accumulator(v.op):
            return make("mul", (v, load), like=v, name="acc")
        return None
    return rebuild(kernel, scale)


# ---------------------------------------------------------------------------------- affine forms
def _affine(v: Value, dep: dict, s: Store, tensors: dict, consumers, k):
    """v as a * T + sum_j (b_j + c_j) * R_j (epic/passes/affine_terms.py): (T, a or None, shifts), shifts
    a list of (b_j value or None, c_j float, vectors of R_j); None when a non-product, non-sum op
    carries the reduction (the caller reports the first refusal); E501 when the terms do not fit."""
    inner, cast = v, None
    if P.family(v.op) is P.Family.CAST and commutes_with_scale(v.dtype):
        inner, cast = v.args[0], v
    try:
        terms = AT.expand(inner, dep)
    except AT.NotAffine:
        return None
    tiles = [t for t in terms if AT.local_kind(t) is Kind.TILE]
    groups: dict[tuple, list] = {}
    for t in terms:
        if AT.local_kind(t) is Kind.TILE:
            continue
        vectors, number = _vector_factors(t, tensors, dep, s, consumers, k)
        groups.setdefault(vectors, []).append((t, number))
    if len(tiles) != 1:
        _refuse_affine(s, consumers, dep, k, inner, f"it is a sum of {len(tiles)} tile-shaped terms once the "
                       "products are expanded; exactly one can be stored (the others would need the row "
                       "statistic in this epilogue)")
    tile = tiles[0]
    value = product(tile.local, inner)
    if tile.sign < 0:
        value = make("neg", (value,), like=inner)
    if cast is not None:
        value = make("cast", (value,), {"to": cast.dtype}, like=cast)
    if all(value is not f for f, _ in tile.local):
        value.name = v.name
    scale = product(tile.coef, inner) if tile.coef else None
    shifts = []
    for vectors, members in groups.items():
        b, c = None, 0.0
        for t, number in members:
            if not t.coef:
                c += t.sign * number
                continue
            f = product(t.coef + ([(core.const(number, F32, inner.span), 1)] if number != 1 else []), inner)
            f = make("neg", (f,), like=inner) if t.sign < 0 else f
            b = f if b is None else make("add", (b, f), like=inner)
        if b is not None and b.kind is not Kind.COL:
            _refuse_affine(s, consumers, dep, k, b, "its shift is not a per-row value")
        shifts.append((b, c, vectors))
    return value, scale, shifts


def _vector_factors(t, tensors: dict, dep: dict, s: Store, consumers, k) -> tuple[tuple[str, ...], float]:
    """A row term's tile-local factors as (input row vectors, a number): what R_j @ W is computed from."""
    names, number = [], 1.0
    for f, e in t.local:
        if P.is_literal(f):
            number *= float(f.attrs["value"]) ** e
        elif P.prim(f.op).reads == "tensor" and f.kind is Kind.ROW and e == 1 and "period" not in f.attrs \
                and tensors[f.attrs["tensor"]].role == "input":
            names.append(f.attrs["tensor"])
        else:
            _refuse_affine(s, consumers, dep, k, f, "a term without the tile is scaled by it; such a term can "
                           "move into the next gemm only as a product of input row vectors (gamma, beta) and "
                           "numbers")
    return tuple(sorted(names)), number


def _refuse_affine(s: Store, consumers, dep: dict, k, culprit: Value, why: str):
    r = dep.get(s.value.id)
    raise EpicError(Diagnostic(
        "E501", f"cannot move the row statistics of '{s.tensor}' into gemm '{consumers[0].name}': "
        f"{_called(culprit)} " + (f"needs {describe_reduction(r, k)}, and " if r is not None else "") + why,
        culprit.span or s.span,
        "write it as r * T + b * gamma + beta (T a tile, r and b per-row statistics, gamma and beta input "
        "row vectors), or store the statistics (out r: f32[M] = ...) and apply them after the next gemm",
        [(s.span, f"'{s.tensor}' is the A operand of gemm '{consumers[0].name}'")]))


def _defer_affine(s: Store, k, scale, shifts, tensors: dict, kernels: list, consumers) -> list[Store]:
    """Buffers for a and each b_j (stored by the row combine kernel), a derived tensor R_j @ W per
    consumer, and each consumer's accumulator rewritten to a * acc + sum_j (b_j + c_j) * (R_j @ W)."""
    for c in consumers:
        if shifts and c.b_t:     # R_j @ W is computed from the weight as stored (runtime/derived.py)
            raise EpicError(Diagnostic(
                "E502", f"cannot move the row statistics of '{s.tensor}' into gemm '{c.name}': their shift terms "
                f"multiply its B operand, which it reads transposed ('{c.b}.T')", c.span,
                f"declare the weight in gemm '{c.name}' itself (K-major, e.g. {c.b}2: {tensors[c.b].dtype}[K, N]), "
                "or store the statistics and the unnormalized tile separately",
                [(s.span, f"'{s.tensor}' is stored here")] if s.span else []))
    extra, scale_buf, shift_bufs = [], None, []
    if scale is not None:
        scale_buf = s.tensor + SUFFIX
        tensors[scale_buf] = Tensor(scale_buf, F32, (k.rows,), "buffer", s.span, producer=k.name)
        extra.append(Store(scale_buf, scale, s.span))
    for j, (b, c, vectors) in enumerate(shifts):
        buf = None
        if b is not None:
            buf = f"{s.tensor}{SHIFT}{j}"
            tensors[buf] = Tensor(buf, F32, (k.rows,), "buffer", s.span, producer=k.name)
            extra.append(Store(buf, b, s.span))
        shift_bufs.append((buf, c, vectors))
    for i, c in enumerate(kernels):
        if c not in consumers:
            continue
        terms = []
        for j, (buf, number, vectors) in enumerate(shift_bufs):
            name = f"{s.tensor}__{c.name}__derived{j}"
            tensors[name] = Tensor(name, F32, (c.n,), "derived", s.span, derived=(vectors, c.b))
            terms.append((buf, number, name))
        kernels[i] = _affine_accumulator(c, scale_buf, terms)
    return extra


def _affine_accumulator(kernel, scale_buf: str | None, terms: list):
    def load(name, shape):
        return core.make("load", (), {"tensor": name, "dtype": F32, "shape": shape}, kernel.span, name)

    def rewrite(v, args):
        if not P.is_accumulator(v.op):
            return None
        out = make("mul", (v, load(scale_buf, COL)), like=v) if scale_buf else v
        for buf, number, name in terms:
            d = load(name, ROW)
            if buf is not None:
                out = make("add", (out, make("mul", (load(buf, COL), d), like=v)), like=v)
            if number != 0.0:
                d = d if number == 1.0 else make("mul", (d, core.const(number, F32, kernel.span)), like=v)
                out = make("add", (out, d), like=v)
        out.name = "acc"
        return out
    return rebuild(kernel, rewrite)
