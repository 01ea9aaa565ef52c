"""Reading files a user could have placed: the program named on the command line or given to
epic.compile, the libraries it imports with `use` and (read_bytes) the kernel cache's libraries and
manifests and the tuning database. Only regular files of bounded size are read (a FIFO, a device or
/dev/zero would hang or exhaust memory), and a `use` may only name an .epi file, so an error message
never echoes a line of some other file on the machine."""
from __future__ import annotations

import os
import stat

from ..diagnostics import Span, error

MAX_BYTES = 1 << 20     # 1 MiB: far beyond any real program, small enough to read at once


class NotARegularFile(ValueError):
    """A path that names a directory, FIFO, device or socket (too_big=False), or a file over the size
    limit (too_big=True)."""

    def __init__(self, message: str, too_big: bool = False):
        super().__init__(message)
        self.too_big = too_big


def read_bytes(path, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes. Never blocks or reads without end (a FIFO,
    /dev/zero): NotARegularFile says why it is not read; an OSError (FileNotFoundError, ...) is passed on.
    Every file epic reads that a user could have placed (program, library, manifest, tuning database)
    comes through here."""
    shown = printable(str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)   # opening a FIFO must not wait
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise NotARegularFile(f"'{shown}' is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"'{shown}' is not a regular file (a FIFO, device or socket)")
        if st.st_size > limit:
            raise NotARegularFile(f"'{shown}' is {st.st_size:,} bytes; a {what} is at most {limit:,}", True)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise NotARegularFile(f"'{shown}' grew past {limit:,} bytes while being read", True)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, *, code: str, span: Span | None = None, what: str = "file") -> str:
    """The text of a regular UTF-8 file, or a diagnostic with `code` saying why not."""
    shown = printable(path)
    hint = f"give the path of an .epi text file{' (relative to the importing file)' if code == 'E104' else ''}"
    try:
        data = read_bytes(path, MAX_BYTES, what)
    except NotARegularFile as e:
        raise error(code, str(e), span, "split it into smaller files joined with `use`" if e.too_big else hint) from None
    except (OSError, ValueError) as e:      # ValueError: a NUL character in the name
        raise error(code, f"cannot read {what} '{shown}': {getattr(e, 'strerror', None) or e}", span, hint) from None
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
