"""Stable, readable renderings of a Program: text, JSON and Graphviz dot.

Values are numbered per kernel (%0, %1, ...) in topological order, so a dump does not depend on
how many programs were compiled before in the same process.
"""
from __future__ import annotations

import json
from collections import Counter

from . import primitives as P
from .core import Program, Value


def _attr_text(v: Value) -> str:
    return P.prim(v.op).show(v.attrs)


def _type_text(v: Value) -> str:
    s = v.shape
    kind = s.kind.value
    if s.has_columns and s.width != 1:
        kind += f"(w={s.width})"
    if s.block:
        kind += f"(1x{s.block})"
    return f"{kind} {v.dtype}"


def _numbering(values: list[Value]) -> dict[int, int]:
    return {v.id: i for i, v in enumerate(values)}


def _loc(v: Value) -> str:
    return f"{v.span.line}:{v.span.column}" if v.span else ""


def kernel_lines(k, program: Program) -> list[str]:
    num = _numbering(k.values)
    lines = [_kernel_header(k, program)]
    for v in k.values:
        args = v.args
        rhs = v.op + (" " + _attr_text(v) if _attr_text(v) else "")
        if args:
            rhs += (" " if not _attr_text(v) else ", ") + ", ".join(f"%{num[a.id]}" for a in args)
        note = "  # " + " ".join(x for x in (v.name or "", _loc(v)) if x) if (v.name or v.span) else ""
        lines.append(f"  %{num[v.id]:<3} = {rhs:<40} : {_type_text(v):<18}{note}")
    for s in k.stores:
        t = program.tensors[s.tensor]
        lines.append(f"  store {s.tensor}: {t.describe()} <- %{num[s.value.id]}")
    return lines


def _kernel_header(k, program: Program) -> str:
    if k.kind == "gemm":
        a, b = program.tensors[k.a], program.tensors[k.b]
        opts = ""
        if k.options:
            opts = " with " + ", ".join(f"{key}={_opt(v)}" for key, v in k.options.items())
        return (f"kernel {k.name} = gemm {a.name}{'.T' * k.a_t}{_dims(a)} @ {b.name}{'.T' * k.b_t}{_dims(b)}{opts}"
                f" -> acc {k.acc}[{k.rows}, {k.n}]")
    over = "the whole" if k.axis == "all" else f"{k.axis}s of"
    return f"kernel {k.name} = {k.kind} over {over} [{k.rows}, {k.n}]"


def _opt(v) -> str:
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _dims(t) -> str:
    return "[" + ", ".join(map(str, t.dims)) + "]"


def to_text(program: Program) -> str:
    lines = [f"program {program.name}", "tensors:"]
    width = max((len(n) for n in program.tensors), default=4)
    for t in program.tensors.values():
        extra = []
        if t.layout == "kmajor":
            extra.append("K-major")
        if t.default is not None:
            extra.append(f"default {t.default!r}")
        if t.producer:
            extra.append(f"stored by {t.producer}")
        lines.append(f"  {t.name:<{width}}  {t.role:<6}  {t.describe()}" + ("  (" + ", ".join(extra) + ")" if extra else ""))
    for k in program.kernels:
        lines.extend(kernel_lines(k, program))
    return "\n".join(lines) + "\n"


def to_json(program: Program) -> str:
    def value(v: Value, num) -> dict:
        return {"id": num[v.id], "op": v.op, "args": [num[a.id] for a in v.args],
                "attrs": {k: (str(x) if not isinstance(x, (int, float, str)) else x) for k, x in v.attrs.items()},
                "dtype": str(v.dtype), "kind": v.shape.kind.value, "width": str(v.shape.width),
                "block": v.shape.block, "name": v.name,
                "loc": {"line": v.span.line, "column": v.span.column} if v.span else None}

    kernels = []
    for k in program.kernels:
        num = _numbering(k.values)
        entry = {"name": k.name, "kind": k.kind, "rows": str(k.rows), "n": str(k.n),
                 "values": [value(v, num) for v in k.values],
                 "stores": [{"tensor": s.tensor, "value": num[s.value.id]} for s in k.stores]}
        if k.kind == "gemm":
            entry.update(a=k.a, b=k.b, k=str(k.k), options={key: _opt(v) for key, v in k.options.items()})
        else:
            entry.update(axis=k.axis)
        kernels.append(entry)
    tensors = [{"name": t.name, "role": t.role, "dtype": str(t.dtype), "dims": [str(d) for d in t.dims],
                "layout": t.layout, "producer": t.producer, "default": t.default, "block": t.block}
               for t in program.tensors.values()]
    return json.dumps({"program": program.name, "dims": program.dims, "tensors": tensors, "kernels": kernels},
                      indent=1) + "\n"


def to_dot(program: Program) -> str:
    out = ["digraph epic {", "  rankdir=TB;", '  node [fontname="monospace", fontsize=10];']
    tensor_node = {}
    for t in program.tensors.values():
        tid = f"t_{t.name}"
        tensor_node[t.name] = tid
        shape = "cylinder" if t.role in ("input", "scalar") else "note"
        out.append(f'  {tid} [shape={shape}, label="{t.name}\\n{t.describe()}\\n{t.role}"];')
    for ki, k in enumerate(program.kernels):
        num = _numbering(k.values)
        out.append(f'  subgraph cluster_{ki} {{ label="{k.kind} {k.name}"; style=rounded;')
        for v in k.values:
            label = f"%{num[v.id]} {v.op} {_attr_text(v)}\\n{_type_text(v)}"
            if v.name:
                label += f"\\n{v.name}"
            out.append(f'    k{ki}_{num[v.id]} [shape=box, label="{label}"];')
        out.append("  }")
        for v in k.values:
            for a in v.args:
                out.append(f"  k{ki}_{num[a.id]} -> k{ki}_{num[v.id]};")
            reads = P.prim(v.op).reads
            if reads and v.attrs[reads] in tensor_node:
                out.append(f'  {tensor_node[v.attrs[reads]]} -> k{ki}_{num[v.id]} [style=dashed];')
        for s in k.stores:
            out.append(f"  k{ki}_{num[s.value.id]} -> {tensor_node[s.tensor]} [style=bold];")
        acc = next((v for v in k.values if P.is_accumulator(v.op)), None)
        if k.kind == "gemm" and acc is not None:
            out.append(f'  {tensor_node[k.a]} -> k{ki}_{num[acc.id]} [style=dashed, label="A"];')
            out.append(f'  {tensor_node[k.b]} -> k{ki}_{num[acc.id]} [style=dashed, label="B"];')
    out.append("}")
    return "\n".join(out) + "\n"


def changes(before: Program, after: Program) -> list[str]:
    """What a pass changed, for `epic ir --rules` where the pass keeps no trace of its own: tensors and
    kernels added or removed, and per changed kernel its value count and the ops that came or went.
    Empty when the program is unchanged."""
    lines = []
    for verb, a, b in (("added", after.tensors, before.tensors), ("removed", before.tensors, after.tensors)):
        names = [n for n in a if n not in b]
        if names:
            lines.append(f"tensors {verb}: " + ", ".join(names))
    old = {k.name: k for k in before.kernels}
    new = {k.name for k in after.kernels}
    for k in after.kernels:
        if k.name not in old:
            lines.append(f"kernel {k.name} added ({k.kind}, {_count(k.values)})")
        elif kernel_lines(old[k.name], before) != kernel_lines(k, after):
            lines.append(_kernel_change(old[k.name], k))
    lines += [f"kernel {name} removed" for name in old if name not in new]
    if not lines and to_text(before) != to_text(after):
        lines.append("changed the program")     # e.g. a tensor's role or a kernel's order
    return lines


def _kernel_change(was, k) -> str:
    ops_was, ops_now = Counter(v.op for v in was.values), Counter(v.op for v in k.values)
    gone, came = ops_was - ops_now, ops_now - ops_was
    detail = "; ".join(f"{label} " + ", ".join(op + (f" x{n}" if n > 1 else "") for op, n in sorted(c.items()))
                       for label, c in (("removed", gone), ("added", came)) if c)
    return f"{k.name}: {len(was.values)} -> {_count(k.values)}" + (f" ({detail})" if detail else "")


def _count(values) -> str:
    return f"{len(values)} value{'s' if len(values) != 1 else ''}"
