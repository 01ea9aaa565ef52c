"""Running the compiler's recursive walks on a deep stack.

The syntax tree of a real program can be thousands of levels deep (a sum of 2,000 terms, a long
chain of unary minus); lark's transformer and the lowering recurse once per level. Rather than
rewrite every walk, the entry points (epic.compile, the CLI, code generation) run on a thread with
a 1 GiB stack (reserved address space, committed only as used) and a recursion limit to match; the
parser refuses trees deeper than frontend.parser.MAX_DEPTH with a diagnostic, so the limit holds.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
STACK_BYTES = 1 << 30
RECURSION_LIMIT = 200_000
_local = threading.local()


def run_deep(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a deep stack; exceptions propagate unchanged. Nested calls run inline."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    result: dict = {}

    def target() -> None:
        _local.deep = True
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:          # re-raised in the caller's thread
            result["error"] = e

    if sys.getrecursionlimit() < RECURSION_LIMIT:
        sys.setrecursionlimit(RECURSION_LIMIT)
    with _STACK_LOCK:
        old = threading.stack_size(STACK_BYTES)
        try:
            worker = threading.Thread(target=target, name="epic-deep")
            worker.start()
        finally:
            threading.stack_size(old)
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def deep(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator form of run_deep."""
    def wrapper(*args, **kwargs):
        return run_deep(fn, *args, **kwargs)
    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = fn.__name__, fn.__doc__, fn
    return wrapper


_STACK_LOCK = threading.Lock()
