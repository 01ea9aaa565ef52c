"""IR values and gemms printed back as .epi text, so that a derived program can be read, edited and
compiled like a hand-written one. Every primitive is spelled from its record (surface name,
operator or keyword); a value used more than once is bound to a name first."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..diagnostics import error
from ..ir import primitives as P
from ..ir.core import Value, topo_order
from ..shapes import Kind

def type_text(dtype, dims) -> str:
    """A tensor's type as written in a program: bf16[M, 2*F], or f32 for a scalar."""
    return f"{dtype.name}[{', '.join(str(d) for d in dims)}]" if dims else dtype.name


def literal(v: Value) -> str:
    x = v.attrs["value"]
    if v.dtype.is_int:
        text = str(int(x))
    else:
        x = float(x)
        if not math.isfinite(x):
            raise error("E903", f"the literal {x} cannot be written in a program", v.span)
        text = repr(x)
    return f"({text})" if text.startswith("-") else text


def _leaf(v: Value) -> str | None:
    p = P.prim(v.op)
    if p.family is not P.Family.SOURCE:
        return None
    if P.is_load(v):
        return v.attrs["tensor"]
    if P.is_literal(v):
        return literal(v)
    if "dim" in v.attrs:          # a dimension's size used as a value
        return f"({v.attrs['dim']})"
    return p.keyword              # acc, row, col


def _call(v: Value, args: list[str]) -> str:
    p = P.prim(v.op)
    if p.family is P.Family.CAST:
        return f"{v.attrs['to'].name}({_strip(args[0])})"
    if p.family is P.Family.REDUCE:
        return f"{v.attrs['axis']}_{v.attrs['fn']}({_strip(args[0])})"
    if p.family is P.Family.BLOCK and "fn" in v.attrs:
        return f"block_{v.attrs['fn']}({_strip(args[0])}, {v.attrs['block']})"
    if p.operator == "-x":
        return f"(-{args[0]})"
    if p.operator == "x ** n":
        n = v.attrs["exp"]
        return f"({args[0]} ** {n})" if n >= 0 else f"({args[0]} ** ({n}))"
    if p.operator and p.arity == 2:
        return f"({args[0]} {p.operator} {args[1]})"
    if p.surface:
        return f"{p.surface[0]}({', '.join(_strip(a) for a in args)})"
    raise error("E903", f"'{v.op}' cannot be written as program text (an internal operation)", v.span)


def _strip(text: str) -> str:
    """Drop one pair of outer parentheses (a statement's right-hand side needs none)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1]


@dataclass
class GemmText:
    """One gemm as .epi text: operands as written (`x: bf16[M, K]`, `h.T`), options, `in`
    declarations, and stores (role, tensor, type text, value)."""
    name: str
    a: str
    b: str
    options: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    stores: list[tuple[str, str, str, Value]] = field(default_factory=list)
    comment: str = ""

    def render(self, taken: set[str]) -> str:
        roots = [s[3] for s in self.stores]
        order = topo_order(roots)
        uses: dict[int, int] = {}
        for v in order:
            for a in v.args:
                uses[a.id] = uses.get(a.id, 0) + 1
        for r in roots:
            uses[r.id] = uses.get(r.id, 0) + 1
        names: dict[int, str] = {}
        body: list[str] = []
        counter = 0
        for v in order:
            leaf = _leaf(v)
            if leaf is not None:
                names[v.id] = leaf
                continue
            text = _call(v, [names[a.id] for a in v.args])
            if uses.get(v.id, 0) > 1 and v.kind is not Kind.SCALAR:
                while f"v{counter}" in taken:
                    counter += 1
                name = f"v{counter}"
                counter += 1
                body.append(f"  {name} = {_strip(text)}")
                names[v.id] = name
            else:
                names[v.id] = text
        lines = [f"# {line}" for line in self.comment.splitlines()]
        opts = f" with {', '.join(self.options)}" if self.options else ""
        lines.append(f"gemm {self.name}({self.a} @ {self.b}){opts} {{")
        lines += [f"  {d}" for d in self.inputs]
        lines += body
        for role, tensor, type_text, v in self.stores:
            lines.append(f"  {role} {tensor}: {type_text} = {_strip(names[v.id])}")
        lines.append("}")
        return "\n".join(lines)
