"""The IR verifier: re-derives every value's type from its primitive's rule and checks the DAG's
invariants (operands before users, stores of known tensors by their producer, loads of known
tensors with their dtype). What each pass promises on top (its `ensures`) is checked by
epic/passes/ensures.py.

The pass manager runs both after every pass when EPIC_VERIFY is set (the test suite sets it, so CI
verifies every program it compiles after every pass). A failure is a bug in epic: E599, naming the
pass, the kernel and the value.
"""
from __future__ import annotations

from ..diagnostics import Diagnostic, EpicError
from ..shapes import Kind
from . import primitives as P
from .core import Program
from .typing import TypeRuleError, infer

def problems(program: Program) -> list[str]:
    out: list[str] = []
    names = [k.name for k in program.kernels]
    if len(set(names)) != len(names):
        out.append(f"kernel names repeat: {names}")
    producers: dict[str, str] = {}
    for k in program.kernels:
        out += [f"kernel {k.name}: {p}" for p in _kernel_problems(program, k)]
        for s in k.stores:
            if s.tensor in producers:
                out.append(f"tensor {s.tensor} is stored by {producers[s.tensor]} and {k.name}")
            producers[s.tensor] = k.name
    return out


def _kernel_problems(program: Program, k) -> list[str]:
    out = []
    seen: dict[int, int] = {}
    for i, v in enumerate(k.values):
        where = f"%{i} {v.op}"
        if v.id in seen:
            out.append(f"{where} appears twice")
        if P.PRIMITIVES.get(v.op) is None:
            out.append(f"{where}: no such primitive")
            continue
        for a in v.args:
            if a.id not in seen:
                out.append(f"{where}: operand {a.op} is not an earlier value of this kernel")
        seen[v.id] = i
        try:
            dtype, shape = infer(v.op, v.args, v.attrs)
        except TypeRuleError as e:
            out.append(f"{where}: ill-typed ({e.message})")
            continue
        if (dtype, shape) != (v.dtype, v.shape):
            out.append(f"{where}: typed {v.dtype} {v.shape} but its rule gives {dtype} {shape}")
        reads = P.prim(v.op).reads
        if reads is not None:
            t = program.tensors.get(v.attrs[reads])
            if t is None:
                out.append(f"{where}: reads unknown tensor {v.attrs[reads]}")
            elif reads == "tensor" and (t.dtype is not v.dtype or (len(t.dims) == 0) != (v.kind is Kind.SCALAR)):
                out.append(f"{where}: loads {t.name} ({t.describe()}) as {v.dtype} {v.shape.kind.value}")
    for s in k.stores:
        t = program.tensors.get(s.tensor)
        if t is None:
            out.append(f"store {s.tensor}: no such tensor")
            continue
        if s.value.id not in seen:
            out.append(f"store {s.tensor}: its value is not a value of this kernel")
        if t.producer != k.name:
            out.append(f"store {s.tensor}: the tensor says it is stored by {t.producer}")
        if s.value.kind is not Kind.PARTIAL and t.dims != s.value.shape.dims(k.rows, k.n):
            out.append(f"store {s.tensor}: tensor {t.describe()} does not hold a {s.value.shape.describe(k.rows, k.n)}")
    if k.kind == "gemm":
        for name in (k.a, k.b):
            if name not in program.tensors or len(program.tensors[name].dims) != 2:
                out.append(f"operand {name} is not a matrix of the program")
    return out


def verify(program: Program, after: str = "the front end", extra: list[str] | None = None) -> None:
    found = problems(program) + list(extra or [])
    if found:
        listing = "\n".join(f"  - {p}" for p in found[:20]) + ("\n  ..." if len(found) > 20 else "")
        raise EpicError(Diagnostic("E599", f"internal: the IR is ill-formed after {after} (a bug in epic):\n{listing}",
                                   None, "please report it with the program; set EPIC_VERIFY=0 to skip the check"))
