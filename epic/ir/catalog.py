"""The language's primitives and reduction functions as a table, made from their records: what
`epic ops` prints and what docs/LANGUAGE.md holds (a test compares the two)."""
from __future__ import annotations

from . import primitives as P

_GROUPS = [
    ("element-wise", (P.Family.ELEMENTWISE, P.Family.COMPARE, P.Family.SELECT)),
    ("casts", (P.Family.CAST,)),
    ("pairwise", (P.Family.PAIR,)),
    ("values", (P.Family.SOURCE,)),
]


def _spelling(p: P.Primitive) -> str:
    if p.family is P.Family.CAST:
        return ", ".join(f"{n}(x)" for n in P.CALLS if P.CALLS[n].primitive is p)
    names = [f"{s}({', '.join('xyz'[:p.arity])})" for s in p.surface]
    if p.operator:
        names.insert(0, p.operator if p.arity == 1 else f"x {p.operator} y")
    if p.keyword:
        names.insert(0, p.keyword)
    return ", ".join(names)


def rows() -> list[tuple[str, str, str, str]]:
    """(group, spelling, meaning, cost) per user-visible primitive, then per reduction function."""
    out = []
    for group, families in _GROUPS:
        for p in P.PRIMITIVES.values():
            spelling = _spelling(p)
            if p.family in families and spelling:
                out.append((group, spelling, p.doc, str(p.cost)))
    for r in P.REDUCTIONS.values():
        names = [f"{axis}_{r.name}(x)" for axis in r.axes] + [f"all_{r.name}(x)"] + \
            ([f"block_{r.name}(x, B)"] if r.block else [])
        out.append(("reductions", ", ".join(names), f"{r.doc}; identity {r.identity}", "-"))
    return out


def text() -> str:
    lines = []
    group = None
    for g, spelling, doc, cost in rows():
        if g != group:
            lines.append(f"{g}:")
            group = g
        lines.append(f"  {spelling:<44} {doc}" + (f"  [cost {cost}]" if cost != "-" else ""))
    return "\n".join(lines)


def markdown() -> str:
    lines = ["| group | spelling | meaning |", "|---|---|---|"]
    lines += [f"| {g} | {spelling} | {doc} |" for g, spelling, doc, _ in rows()]
    return "\n".join(lines)
