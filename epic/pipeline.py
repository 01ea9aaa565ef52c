"""Front half of the compiler as one call: text -> typed IR -> checks -> rewrite passes.

`analyze` returns the program after every stage so that `epic ir --after PASS` can print any of
them; it raises EpicError with every diagnostic when the program is not legal. Nothing here
depends on code generation: a program that kernels cannot be generated for yet can still be
checked, rewritten, planned and interpreted (the refusal comes when it is built).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .checks import layout, locality
from .diagnostics import EpicError, error
from .frontend import sources
from .frontend.lower import load_program
from .ir.core import Program


@dataclass
class Analysis:
    source_program: Program                     # straight from the front end
    stages: list = field(default_factory=list)   # passes.manager.Stage per pass run

    @property
    def program(self) -> Program:
        """The final, legal program (after every pass)."""
        return self.stages[-1].program if self.stages else self.source_program

    def after(self, name: str) -> Program:
        return next(s.program for s in self.stages if s.name == name)


def looks_like_path(path_or_text: str) -> bool:
    """An existing file, or one line ending in .epi (program text always has a newline or a brace)."""
    return len(path_or_text) < 4096 and (os.path.isfile(path_or_text) or (
        "\n" not in path_or_text and (path_or_text.endswith(".epi") or os.path.exists(path_or_text))))


def read_source(path_or_text: str, path: bool | None = None) -> tuple[str, str, str]:
    """(text, display name, base directory for `use`) for a path or an inline program. path=True:
    it is a file name, whatever it looks like (the command line's FILE); None: guess."""
    if path or (path is None and looks_like_path(path_or_text)):
        text = sources.read_text(path_or_text, code="E802", what="program file")
        return text, sources.printable(path_or_text), os.path.dirname(os.path.abspath(path_or_text))
    return path_or_text, "<string>", os.getcwd()


def lower(path_or_text: str, name: str | None = None, path: bool | None = None) -> Program:
    text, default_name, base = read_source(path_or_text, path)
    return load_program(text, name or default_name, base)


def analyze(path_or_text: str, run_passes: bool = True, stop_after: str | None = None,
            name: str | None = None, path: bool | None = None) -> Analysis:
    """Front end, static checks, passes, locality. `name` labels an inline program in diagnostics;
    path=True says path_or_text is a file name even if it does not look like one (a pathlib.Path
    always is)."""
    if isinstance(path_or_text, os.PathLike):
        path_or_text, path = os.fspath(path_or_text), True
    if isinstance(path_or_text, bytes):
        path_or_text, path = os.fsdecode(path_or_text), True
    if not isinstance(path_or_text, str):
        raise error("E802", f"a program is a path or the program's text, not {type(path_or_text).__name__}", None,
                    'e.g. epic.compile("model.epi") or epic.compile(pathlib.Path("model.epi"))')
    program = lower(path_or_text, name, path)
    static = layout.check_static(program)
    if static:
        raise EpicError(static)
    analysis = Analysis(program)
    if run_passes:
        from .passes import manager
        analysis.stages = manager.run_all(program, stop_after=stop_after)
    if stop_after is None:      # the pass manager checked locality before split-reductions
        diags = locality.check(analysis.program)
        if diags:
            raise EpicError(diags)
    return analysis
