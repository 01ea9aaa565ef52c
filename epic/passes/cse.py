"""Common subexpressions: structurally equal values (same op, operands, attributes, type) become one."""
from __future__ import annotations

from .rewrite import rebuild


def run(program):
    kernels = []
    for k in program.kernels:
        seen: dict[tuple, object] = {}

        def merge(v, args):
            from .rewrite import copy_with
            candidate = copy_with(v, args)
            key = candidate.key()
            if key in seen:
                return seen[key]
            seen[key] = candidate
            return candidate

        kernels.append(rebuild(k, merge))
    return program.replace_kernels(kernels)
