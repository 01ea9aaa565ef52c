"""A program printed back as .epi text, optionally storing more than it did: the forward half of a
training step keeps what its backward reads (a tmp it would drop becomes an `out`, and row, column
or block statistics get stores of their own)."""
from __future__ import annotations

from ..ir.core import GemmKernel, Program, Value
from .text import GemmText, type_text as _type


def _option(key: str, value) -> str:
    if isinstance(value, tuple):
        value = "x".join(str(x) for x in value)
    return f"{key} = {value}"


def program_text(program: Program, keep: set[str] = frozenset(),
                 extra: dict[str, list[tuple[str, str, Value]]] | None = None, taken: set[str] | None = None,
                 header: str = "") -> str:
    """The program as text. keep: tmp tensors to store as `out`; extra: kernel name -> extra stores
    (tensor, type text, value)."""
    extra = extra or {}
    declared: set[str] = set()
    operands = {k.a for k in program.kernels} | {k.b for k in program.kernels}
    lines = [f"# {line}" for line in header.splitlines()]
    for t in program.tensors.values():
        if t.role in ("input", "scalar") and not (t.name in operands and t.layout == "kmajor"):
            default = f" = {t.default!r}" if t.role == "scalar" and t.default is not None else ""
            lines.append(f"in {t.name}: {_type(t.dtype, t.dims)}{default}")
            declared.add(t.name)
    lines.append("")
    names = set(taken or ()) | set(program.tensors) | set(program.dims)
    for k in program.kernels:
        lines.append(_kernel(program, k, declared, keep, extra.get(k.name, [])).render(names))
        lines.append("")
    return "\n".join(lines)


def _kernel(program: Program, k: GemmKernel, declared: set[str], keep: set[str], extra) -> GemmText:
    b = program.tensors[k.b]
    if k.b in declared:
        b_text = k.b
    else:
        b_text = f"{k.b}: {_type(b.dtype, b.dims)}"
        declared.add(k.b)
    a_text = k.a + (".T" if getattr(k, "a_t", False) else "")
    b_text += ".T" if getattr(k, "b_t", False) else ""
    g = GemmText(k.name, a_text, b_text, [_option(key, v) for key, v in k.options.items()])
    for s in k.stores:
        t = program.tensors[s.tensor]
        role = "out" if t.role == "out" or s.tensor in keep else t.role
        g.stores.append((role, s.tensor, _type(t.dtype, t.dims), s.value))
    for tensor, type_text, v in extra:
        g.stores.append(("out", tensor, type_text, v))
    return g
