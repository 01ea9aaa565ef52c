"""What `epic check` warns about once the checks pass: kernels that code generation will refuse.

The checks accept every program the reference interpreter can run; code generation covers less
(E702: a reduction or a store no node implements yet). `epic check` lowers each kernel of the
rewritten program as `epic build` would, at the small-M and the large-M configuration, without
rendering C++ or running nvcc, and returns each refusal as a warning. Rewrites name what they add
NAME__suffix (a gemm's per-tile partials `g__c_part0`, its combine kernel `g__row_combine`, a
pre-scaled copy `q__pre0`); warnings name the user's value instead.
"""
from __future__ import annotations

import re

from . import combine, emit, evt, tail
from ..plan import tail as tail_plan
from ..diagnostics import Diagnostic, EpicError
from ..plan import planner

CHECKED_M = (64, emit.DEFAULT_M)     # the decode and the prefill configurations differ in tiles
_INTERNAL = re.compile(r"\b([A-Za-z_]\w*?)__(\w+)\b")
_SUFFIX = re.compile(r"_(?:part|lanes)\d+$")


def user_name(name: str, program) -> str:
    """The user's value an internal name stands for, in words ('c', "the row_lse of gemm 'g'")."""
    m = _INTERNAL.fullmatch(name)
    if m is None:
        return f"'{name}'"
    first, rest = m.groups()
    if re.fullmatch(r"pre\d+", rest):
        return f"'{first}'"                                   # a pre-scaled copy of a stored tensor
    if rest.endswith("_combine"):
        return f"the {rest[:-len('_combine')]} combine kernel of gemm '{first}'"
    value = _SUFFIX.sub("", rest)
    if value in program.tensors:
        return f"'{value}'"
    return f"the {value.replace('_', ' ')} of gemm '{first}'"   # an unnamed reduction


def _describe(text: str, program) -> str:
    text = re.sub(r"'(\w+__\w+)'", lambda m: user_name(m.group(1), program), text)
    return _INTERNAL.sub(lambda m: user_name(m.group(0), program).strip("'"), text)


def _lower(program, k, configs) -> None:
    folded = planner.folds(program, configs)
    if k.kind == "tail":
        tail.lower_tail(program, k)
    elif k.kind == "gemm":
        inside = next((c for c in program.kernels if folded.get(c.name) == k.name), None)
        evt.lower_gemm(program, k, configs[k.name],
                       combine.lower_combine(program, inside, folded=True) if inside else None)
    elif k.name not in folded:
        combine.lower_combine(program, k)


def refusals(program, source_program=None) -> list[Diagnostic]:
    """One warning per distinct refusal by code generation of a kernel of the rewritten `program`
    (source_program: the user's program, whose names the warnings use; defaults to `program`)."""
    names = source_program or program
    out: list[Diagnostic] = []
    seen: set = set()

    def add(e: EpicError, where: str) -> None:
        for d in e.diagnostics:
            key = (d.code, d.message, str(d.span))
            if key not in seen:
                seen.add(key)
                out.append(Diagnostic(d.code, f"{where} will not build: {_describe(d.message, names)}",
                                      d.span, d.hint and _describe(d.hint, names)))

    for m in CHECKED_M:
        configs = emit.kernel_configs(program, m)
        try:
            rewritten = tail_plan.rewrite(program, configs)      # combine=tail: a gemm and its tail kernel
        except EpicError as e:                                  # a gemm that cannot take it (E216)
            rewritten = program
            add(e, "the program")
        for k in rewritten.kernels:
            try:
                _lower(rewritten, k, configs)
            except EpicError as e:
                add(e, f"gemm '{k.name}'" if k.kind == "gemm" else user_name(k.name, names))
    return out


def render_warning(d: Diagnostic) -> str:
    """A diagnostic rendered as a warning: `file:line:col: warning[E702]: ...`."""
    text = d.render()
    return text.replace(f"error[{d.code}]", f"warning[{d.code}]", 1)
