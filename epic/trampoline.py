"""Recursive walks without Python recursion.

A program can be a chain of 20,000 terms or 200 nested definitions; a walk that recursed once per
level would pass Python's recursion limit. Such a walk is written as a generator that, where it
would call itself, yields the generator for the sub-walk instead and is sent back its result:

    def size(v):
        total = 1
        for a in v.args:
            total += yield size(a)
        return total

    run(size(root))

`run` keeps the pending generators on a list, so the depth costs memory, not stack. An exception
propagates to the generators waiting below it (their `finally` blocks run), as in recursion.
"""
from __future__ import annotations

from typing import Generator, TypeVar

T = TypeVar("T")


def run(walk: Generator[Generator, object, T]) -> T:
    """The result of `walk`, running every sub-walk it yields on an explicit stack."""
    stack = [walk]
    result, failure = None, None
    while stack:
        try:
            sub = stack[-1].throw(failure) if failure is not None else stack[-1].send(result)
        except StopIteration as done:
            stack.pop()
            result, failure = done.value, None
            continue
        except BaseException as exc:      # propagates to the walk that asked for this one
            stack.pop()
            if not stack:
                raise
            result, failure = None, exc
            continue
        stack.append(sub)
        result = None
    return result
