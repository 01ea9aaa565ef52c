"""Block-scale hoisting: move a per-block scale (QK-norm's 1/rms of each head) out of the element-wise
math to the stored value, where the epilogue can apply it once the block is reduced.

A 1xB block statistic s (rsqrt(block_sum(x * x, B) / B + eps)) is constant on each 1xB block of a row.
When a stored tile is linear in s -- t = E[y * s], with E built from products, quotients by block-free
values, sums and differences whose terms carry the same scale, negation, and the pairwise maps
even/odd/interleave (a column pair never straddles a block: B is even) -- then t = E[y] * s. Code
generation computes E[y] element by element while it reduces the blocks, and multiplies by s once a
block's statistic is known (BlockReduceScale, codegen/nodes/custom.py). RoPE is such an E, so
`rope(h * rsqrt(block_mean(h * h, Dh) + eps) * gamma, pos, freq)` is one epilogue.

A store that selects between such a tile and a block-free one by a block-free condition -- QK-norm on
the q and k heads of a fused QKV projection, v passed through: select(col < qk_cols, E[y * s], acc) --
becomes select(c, E[y] * s, w): the kernel keeps, per element, whether the scale applies.

A store that already has that form (q = x / s of the block quantizers) is left alone, and so is one
whose scale cannot be moved (exp(s * x), a cast of a scaled value, a block sum added to a tile): code
generation then says it cannot build it (E702). The identity holds for real numbers; in floating point
the two orders differ by a rounding, within the tolerance of any float32 epilogue.
"""
from __future__ import annotations

from fractions import Fraction

from .. import trampoline
from ..ir import primitives as P
from ..ir.core import Store, Value, const, topo_order
from ..shapes import Kind
from .rewrite import make, product

Factors = tuple[tuple[Value, int], ...]     # (block value, exponent), sorted by value id


class _Fixed(Exception):
    """The scale cannot be moved out of this value."""


def block_dependent(kernel) -> set[int]:
    """Ids of the values that are, or are computed from, a per-block value."""
    dep: set[int] = set()
    for v in kernel.values:
        if v.kind is Kind.BLOCK or any(a.id in dep for a in v.args):
            dep.add(v.id)
    return dep


def root_form(v: Value, dep: set[int]) -> tuple[Value, Value, bool] | None:
    """(y, s, divide) when v = y * s, s * y or y / s with s a block value and y free of them."""
    algebra = P.prim(v.op).algebra
    if algebra not in ("product", "quotient") or len(v.args) != 2 or v.kind is not Kind.TILE:
        return None
    a, b = v.args
    if b.kind is Kind.BLOCK and a.id not in dep and a.kind is Kind.TILE:
        return a, b, algebra == "quotient"
    if algebra == "product" and a.kind is Kind.BLOCK and b.id not in dep and b.kind is Kind.TILE:
        return b, a, False
    return None


def _merge(*parts: Factors, signs: tuple[int, ...] | None = None) -> Factors:
    total: dict[int, list] = {}
    for part, sign in zip(parts, signs or (1,) * len(parts)):
        for f, e in part:
            total.setdefault(f.id, [f, 0])[1] += sign * e
    return tuple(sorted(((f, e) for f, e in total.values() if e), key=lambda fe: fe[0].id))


def _same(a: Factors, b: Factors) -> bool:
    return [(f.id, e) for f, e in a] == [(f.id, e) for f, e in b]


def _pull(v: Value, dep: set[int], memo: dict) -> tuple[Value | None, Factors]:
    """v = rest * prod(factors): rest free of block values (None: 1), factors block values. Walks
    without recursion (a product of thousands of factors): see epic/trampoline.py."""
    return trampoline.run(_pull_walk(v, dep, memo))


def _pull_walk(v: Value, dep: set[int], memo: dict):
    if v.id not in dep:
        return v, ()
    if v.kind is Kind.BLOCK:
        return None, ((v, 1),)
    if v.id in memo:
        return memo[v.id]
    p = P.prim(v.op)
    parts = []
    for a in v.args:
        parts.append((yield _pull_walk(a, dep, memo)))
    if p.algebra == "product":
        rests = [r for r, _ in parts if r is not None]
        rest = rests[0]
        for r in rests[1:]:
            rest = make("mul", (rest, r), like=v)
        out = rest, _merge(*(f for _, f in parts))
    elif p.algebra == "quotient":
        (num, fn), (den, fd) = parts
        if den is None:
            rest = num
        else:
            rest = make("div", (num if num is not None else _one(v), den), like=v)
        out = rest, _merge(fn, fd, signs=(1, -1))
    elif p.algebra == "negation":
        (r, f), = parts
        out = make("neg", (r,), like=v), f
    elif p.algebra == "sum" or (p.family is P.Family.PAIR and p.pair_part is None):   # a + b, interleave(a, b)
        (ra, fa), (rb, fb) = parts
        if ra is None or rb is None or not _same(fa, fb):
            raise _Fixed          # x * s + y: the terms carry different scales
        out = make(v.op, (ra, rb), v.attrs, like=v), fa
    elif p.family is P.Family.SELECT:                        # select(c, x * s, y * s) = select(c, x, y) * s
        (rc, fc), (ra, fa), (rb, fb) = parts
        if fc or ra is None or rb is None or not _same(fa, fb):
            raise _Fixed
        out = make(v.op, (rc, ra, rb), v.attrs, like=v), fa
    elif p.family is P.Family.PAIR:                          # even(x * s) = even(x) * s
        (r, f), = parts
        out = make(v.op, (r,), v.attrs, like=v), f
    else:
        raise _Fixed
    if out[0] is None:
        raise _Fixed
    memo[v.id] = out
    return out


def _one(like: Value) -> Value:
    return const(1.0, span=like.span)


def _scaled_branch(v: Value, dep: set[int]) -> int | None:
    """i (1 or 2) when v = select(c, a, b) whose branch i alone carries a block value (c and the other
    branch free of them), else None."""
    if P.family(v.op) is not P.Family.SELECT or v.kind is not Kind.TILE or v.args[0].id in dep:
        return None
    dependent = [i for i in (1, 2) if v.args[i].id in dep]
    return dependent[0] if len(dependent) == 1 else None


def select_form(v: Value, dep: set[int]) -> tuple[Value, int, tuple[Value, Value, bool]] | None:
    """(c, i, root form of branch i) when v = select(c, a, b) with branch i in root form (y * s, y / s)
    and c and the other branch free of block values."""
    i = _scaled_branch(v, dep)
    form = None if i is None else root_form(v.args[i], dep)
    return None if form is None else (v.args[0], i, form)


def _hoisted_select(v: Value, dep: set[int]) -> Value | None:
    """select(c, E[y * s], w) -> select(c, E[y] * s, w) (c and w free of block values), or None."""
    i = _scaled_branch(v, dep)
    branch = None if i is None else hoisted(v.args[i], dep)
    if branch is None:
        return None
    args = list(v.args)
    args[i] = branch
    return make(v.op, tuple(args), v.attrs, like=v, name=v.name)


def hoisted(v: Value, dep: set[int]) -> Value | None:
    """v rewritten as rest * s (or rest / s), or None when v stays as it is."""
    if v.id not in dep or v.kind is not Kind.TILE or v.shape.width != 1 or root_form(v, dep) or select_form(v, dep):
        return None
    if (out := _hoisted_select(v, dep)) is not None:
        return out
    try:
        rest, factors = _pull(v, dep, {})
    except _Fixed:
        return None
    if not factors or rest.kind is not Kind.TILE or rest.shape.width != Fraction(1):
        return None
    if all(e < 0 for _, e in factors):      # y / s rather than y * (1 / s)
        out = make("div", (rest, product([(f, -e) for f, e in factors], v)), like=v, name=v.name)
    else:
        out = make("mul", (rest, product(list(factors), v)), like=v, name=v.name)
    return out


def run(program, trace=None):
    kernels = list(program.kernels)
    for i, k in enumerate(kernels):
        if k.kind != "gemm":
            continue
        dep = block_dependent(k)
        if not dep:
            continue
        stores = []
        for s in k.stores:
            new = hoisted(s.value, dep)
            if new is not None and trace is not None:
                trace.append(_describe(k.name, s.tensor, new))
            stores.append(Store(s.tensor, new, s.span) if new is not None else s)
        if any(a is not b for a, b in zip(stores, k.stores)):
            kernels[i] = k.with_values(topo_order([s.value for s in stores]), stores)
    return program.replace_kernels(kernels, dict(program.tensors))


def _describe(kernel: str, tensor: str, new: Value) -> str:
    form = select_form(new, block_dependent_of(new))
    where = "" if form is None else " where the selection takes it"
    y, s, divide = form[2] if form else (new.args[0], new.args[1], P.prim(new.op).algebra == "quotient")
    return f"{kernel}: '{tensor}' = (its element-wise math) {'/' if divide else '*'} its 1x{s.shape.block} block scale{where}"


def block_dependent_of(root: Value) -> set[int]:
    """block_dependent over the values root is computed from."""
    order, seen, stack = [], set(), [root]
    while stack:
        v = stack.pop()
        if v.id not in seen:
            seen.add(v.id)
            order.append(v)
            stack.extend(v.args)
    dep: set[int] = set()
    for v in sorted(order, key=lambda x: x.id):
        if v.kind is Kind.BLOCK or any(a.id in dep for a in v.args):
            dep.add(v.id)
    return dep


def unhoisted(program) -> list[str]:
    """The `block-scales-hoisted` guarantee: no store is left that the pass would still rewrite."""
    out = []
    for k in program.kernels:
        if k.kind != "gemm":
            continue
        dep = block_dependent(k)
        out += [f"kernel {k.name}: store {s.tensor} still has a movable block scale" for s in k.stores
                if hoisted(s.value, dep) is not None]
    return out
