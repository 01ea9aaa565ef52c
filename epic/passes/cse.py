"""Common subexpressions: structurally equal values (same op, operands, attributes, type) become one."""
from __future__ import annotations

from .rewrite import copy_with, rebuild


def run(program, trace=None):
    kernels = []
    for k in program.kernels:
        seen: dict[tuple, object] = {}

        def merge(v, args):
            candidate = copy_with(v, args)
            return seen.setdefault(candidate.key(), candidate)

        kernels.append(rebuild(k, merge))
    return program.replace_kernels(kernels)
