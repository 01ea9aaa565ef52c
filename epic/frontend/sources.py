"""Reading source files: the program named on the command line or given to epic.compile, and the
libraries it imports with `use`. Only regular UTF-8 text files of bounded size are read (a FIFO,
a device or /dev/zero would hang or exhaust memory), and a `use` may only name an .epi file, so an
error message never echoes a line of some other file on the machine."""
from __future__ import annotations

import os
import stat

from ..diagnostics import Span, error

MAX_BYTES = 1 << 20     # 1 MiB: far beyond any real program, small enough to read at once


def read_text(path: str, *, code: str, span: Span | None = None, what: str = "file") -> str:
    """The text of a regular UTF-8 file, or a diagnostic with `code` saying why not."""
    shown = printable(path)
    hint = f"give the path of an .epi text file{' (relative to the importing file)' if code == 'E104' else ''}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))   # never block on a FIFO
    except (OSError, ValueError) as e:      # ValueError: a NUL character in the name
        raise error(code, f"cannot read {what} '{shown}': {getattr(e, 'strerror', None) or e}", span, hint) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(code, f"'{shown}' is a directory, not a {what}", span, hint)
        if not stat.S_ISREG(st.st_mode):
            raise error(code, f"'{shown}' is not a regular file", span, hint)
        if st.st_size > MAX_BYTES:
            raise error(code, f"'{shown}' is {st.st_size:,} bytes; source files are at most {MAX_BYTES:,}", span,
                        "split it into smaller files joined with `use`")
        data = b""
        while len(data) <= MAX_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        if len(data) > MAX_BYTES:
            raise error(code, f"'{shown}' grew past {MAX_BYTES:,} bytes while being read", span,
                        "split it into smaller files joined with `use`")
    except OSError as e:
        raise error(code, f"cannot read {what} '{shown}': {e.strerror or e}", span, hint) from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(code, f"'{shown}' is not UTF-8 text (byte {e.start} cannot be decoded)", span,
                    "save the file as UTF-8") from None
    if "\0" in text:
        raise error(code, f"'{shown}' contains NUL characters: it is not a text file", span, "save the file as UTF-8 text")
    return text.removeprefix("\ufeff")      # a byte-order mark some editors write


def read_use(path: str, span: Span) -> str:
    # the file itself must be an .epi file, not only the name written (a link lib.epi -> /etc/passwd)
    if not path.endswith(".epi") or (os.path.lexists(path) and not os.path.realpath(path).endswith(".epi")):
        raise error("E104", f"`use` imports .epi files only, not '{printable(path)}'", span,
                    'write use "lib.epi" with the path of a file of definitions')
    return read_text(path, code="E104", span=span, what="library")


def printable(text: str) -> str:
    """A file name as it may appear in a message: control characters shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
