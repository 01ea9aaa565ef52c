"""Diagnostics: every user-facing failure is a Diagnostic with a code, a source span and a hint.

Codes are stable (tests and users rely on them):
  E1xx syntax, E2xx names and types, E3xx tile locality, E4xx layout and alignment,
  E5xx rewrites that could not legalize a program, E6xx tensors handed to a compiled program,
  E7xx code generation and build, E8xx the command line and files, E9xx derivatives (epic grad).
"""
from __future__ import annotations

from dataclasses import dataclass, field


CODES = {
    "E101": "unexpected character",
    "E102": "unexpected token",
    "E103": "unexpected end of file",
    "E104": "a `use` file cannot be read (missing, not a regular UTF-8 .epi file, or too large)",
    "E105": "the program is nested too deeply",
    "E106": "chained comparison (a < b < c)",
    "E201": "unknown name or tensor",
    "E202": "name defined twice, or a reserved name",
    "E203": "wrong number or kind of arguments",
    "E204": "unknown dtype",
    "E205": "dtype not allowed here",
    "E206": "wrong shape kind (a row vector is not a tile)",
    "E207": "operand widths do not line up",
    "E208": "declared dimensions do not match",
    "E209": "GEMM operands do not fit together",
    "E210": "a definition calls itself",
    "E211": "unknown function",
    "E212": "an argument must be an integer literal",
    "E213": "nothing to do (no gemm, or a gemm that stores nothing)",
    "E214": "a vector could be a row or a column vector",
    "E215": "bad gemm option (an unknown option, or a value it cannot take)",
    "E216": "kernel configuration that CUTLASS's sm90 schedules do not accept",
    "E217": "the epilogue's shared memory leaves the mainloop fewer than 2 pipeline stages",
    "E301": "needs a whole row inside the same epilogue (tile locality)",
    "E302": "needs a whole column inside the same epilogue (tile locality)",
    "E303": "needs a whole-tensor statistic inside the same gemm (tile locality)",
    "E401": "pairwise map on an odd width",
    "E402": "a width-changing map must feed a store",
    "E403": "contiguous dimension not a multiple of 16 bytes (TMA)",
    "E404": "quantization block size does not fit the tile",
    "E405": "int4 output with an odd width",
    "E501": "a row scale cannot be moved into the next gemm: it does not multiply the whole row",
    "E502": "a row scale cannot be moved: the value is also returned or read as a tile",
    "E599": "internal: an ill-formed program after a pass, or an ill-formed prelude (a bug in epic)",
    "E601": "missing tensor or scalar argument",
    "E602": "tensor of the wrong shape",
    "E603": "tensor of the wrong dtype",
    "E604": "tensor on the wrong device",
    "E605": "tensor with unsupported strides",
    "E606": "tensor not 16-byte aligned",
    "E607": "bad or missing dimension sizes",
    "E608": "bad argument to epic.compile (an unknown fallback policy)",
    "E609": "a captured program replayed with other shapes, dtypes, strides, devices or scalar values",
    "E610": "a HuggingFace model or batch that epic.integrations cannot take (a bias, another activation, not bfloat16, a label outside the vocabulary)",
    "E611": "a tensor given with out= that the program cannot write its output into (not an output, or it shares memory with an input read elsewhere)",
    "E701": "the generated CUDA failed to compile (a bug in epic; the .cu is kept)",
    "E702": "not supported by code generation yet",
    "E703": "no CUDA device or the kernel launch failed",
    "E704": "the kernel cache cannot be used (not writable, a damaged entry, or a missing kernel with EPIC_NO_BUILD)",
    "E705": "nvcc is missing, failed to run, timed out, or reported success without a usable library",
    "E706": "an EPIC_* environment variable has a value that is not understood",
    "E707": "`epic tune` could not build and time any configuration of a gemm",
    "E708": "torch.compile could not compile the unfused torch form (fallback=\"compiled\")",
    "E801": "bad command-line argument (unknown pass, bad option value)",
    "E802": "the program file cannot be read (missing, a directory, not UTF-8 text, or too large)",
    "E901": "a gradient would flow through something without a derivative (a quantizing cast or store)",
    "E902": "--wrt names something that has no gradient (unknown, an integer tensor, a scalar, an output)",
    "E903": "a derivative not derived yet, or a backward chunk_rows would change (the message says which)",
}


@dataclass(frozen=True)
class Source:
    """A named source text (a file or a string handed to epic.compile)."""
    name: str
    text: str

    def line(self, lineno: int) -> str:
        """Line `lineno` as the parser counts lines (by \\n only), without its line end."""
        lines = self.text.split("\n")
        return lines[lineno - 1].rstrip("\r") if 0 < lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """1-based line/column range inside a Source."""
    source: Source = field(repr=False)
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"

    def caret(self) -> str:
        """The source line with a caret (and tildes to the end of the span on that line)."""
        text = "".join(c if c.isprintable() else " " for c in self.source.line(self.line).expandtabs(1))
        width = 1
        if self.end_line == self.line and self.end_column and self.end_column > self.column:
            width = self.end_column - self.column
        pad = " " * (self.column - 1)
        return f"  {text}\n  {pad}^{'~' * (width - 1)}"


@dataclass
class Diagnostic:
    code: str
    message: str
    span: Span | None = None
    hint: str | None = None
    notes: list[tuple[Span | None, str]] = field(default_factory=list)

    def render(self) -> str:
        where = f"{self.span}: " if self.span else ""
        out = [f"{where}error[{self.code}]: {self.message}"]
        if self.span:
            out.append(self.span.caret())
        for span, note in self.notes:
            out.append(f"  note: {note}" + (f" ({span})" if span else ""))
            if span:
                out.append(span.caret())
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


class EpicError(Exception):
    """Raised with one or more diagnostics; str() renders them all."""

    def __init__(self, diagnostics: Diagnostic | list[Diagnostic]):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))

    @property
    def codes(self) -> list[str]:
        return [d.code for d in self.diagnostics]

    @property
    def exit_status(self) -> int:
        """What the `epic` command exits with: 1 the program is at fault, 2 the command line or the
        environment, 3 a bug in epic. The worst of the diagnostics wins."""
        return max(exit_status(d.code) for d in self.diagnostics)


_ENVIRONMENT = {"E607", "E608", "E703", "E704", "E705", "E706", "E707", "E708", "E801", "E802"}
_BUGS = {"E599", "E701"}


def exit_status(code: str) -> int:
    if code in _BUGS:
        return 3
    if code in _ENVIRONMENT:
        return 2
    return 1


def error(code: str, message: str, span: Span | None = None, hint: str | None = None,
          notes: list[tuple[Span | None, str]] | None = None) -> EpicError:
    """The one way to report a user-facing failure: `raise error("E201", "unknown name 'x'", span, hint)`."""
    return EpicError(Diagnostic(code, message, span, hint, notes or []))
