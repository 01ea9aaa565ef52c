"""A translation unit to build: what code generation hands to the nvcc driver (runtime/build.py)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Unit:
    """One translation unit: a name (for messages and the library's file name) and its CUDA source.
    The source alone decides what is built: it holds no file names or paths of the program.
    `expect`, if given, is the library's expected epic_info (or part of it): it goes into the cache
    entry's manifest and the loader checks it."""
    name: str
    source: str
    uses_cutlass: bool = True
    expect: dict | None = field(default=None, compare=False)
