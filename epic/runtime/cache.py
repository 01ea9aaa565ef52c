"""The kernel cache on disk: layout, validation, locking, listing and cleaning.

$EPIC_CACHE_DIR/<key>/ holds <name>.so, its manifest <name>.json (sha256, size, key, exported
symbols, epic version, the kernel's expected self-description), the source <name>.cu and build.txt.
One entry of kind "launcher" holds the compiled call path (runtime/fastcall.py), a Python module.
While a build runs the directory also holds .lock (the builder's flock) and a .tmp-* directory
(nvcc's output and temporaries). An entry is served only if its manifest matches the library and the
library is a complete ELF shared object exporting epic's C ABI: a truncated library would otherwise
kill the process with SIGBUS inside dlopen. Only regular files are read (a FIFO or /dev/zero
planted in a shared cache is a damaged entry, not a hang), and pruning or cleaning never follows a
symbolic link nor deletes anything outside the cache directory.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..diagnostics import Diagnostic, EpicError
from ..frontend.sources import NotARegularFile, read_bytes

EXPORTS = ("epic_launch", "epic_workspace_size", "epic_info")
LAUNCHER_EXPORTS = ("PyInit_epic_launcher",)      # the compiled call path (runtime/fastcall.py)
TMP_PREFIX = ".tmp-"
LOCK = ".lock"
KEY_RE = re.compile(r"[0-9a-f]{24}")      # entry directories; anything else under the root is left alone
MISSING = "not in the cache"
MAX_LIBRARY = 1 << 30     # a CUTLASS kernel is a few MiB; anything near this is not one of epic's
MAX_MANIFEST = 1 << 20


def cache_dir() -> Path:
    env = os.environ.get("EPIC_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "epic"


def unusable(path: Path, err: OSError) -> EpicError:
    """E704 for a cache directory that cannot be created, read or written."""
    return EpicError(Diagnostic("E704", f"the kernel cache cannot be used: {path}: {err.strerror or err}", None,
                                "set EPIC_CACHE_DIR to a writable directory"))


def manifest_path(lib: Path) -> Path:
    return lib.with_suffix(".json")


# ---------------------------------------------------------------- ELF check (no nm, no dlopen)
def elf_exports(data: bytes) -> set[str]:
    """The defined, visible dynamic symbols of a complete ELF64 shared object; ValueError says what is
    wrong. Every header table, segment and section must lie inside the file, so dlopen never maps
    past its end."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] not in (1, 2):
        raise ValueError("not a 64-bit ELF file")
    bo = "<" if data[5] == 1 else ">"

    def inside(offset: int, size: int, what: str) -> None:
        if offset + size > len(data):
            raise ValueError(f"truncated: the {what} ends at byte {offset + size}, the file has {len(data)}")

    try:
        (etype, _, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum,
         _) = struct.unpack_from(bo + "HHIQQQIHHHHHH", data, 16)
        if etype != 3:
            raise ValueError("not a shared object")
        if (ehsize, phentsize, shentsize) != (64, 56, 64) or not phnum or not shnum:
            raise ValueError("malformed ELF header")
        inside(phoff, 56 * phnum, "program header table")
        inside(shoff, 64 * shnum, "section header table")
        segments = set()
        for i in range(phnum):
            ptype, _, offset, _, _, filesz, _, _ = struct.unpack_from(bo + "IIQQQQQQ", data, phoff + 56 * i)
            inside(offset, filesz, f"segment {i}")
            segments.add(ptype)
        if not {1, 2} <= segments:
            raise ValueError("no loadable or no dynamic segment")
        sections = [struct.unpack_from(bo + "IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
        for i, (_, stype, _, _, offset, size, *_) in enumerate(sections):
            if stype != 8:                        # SHT_NOBITS (.bss) takes no room in the file
                inside(offset, size, f"section {i}")
        dynsym = [s for s in sections if s[1] == 11]
        if len(dynsym) != 1:
            raise ValueError("no dynamic symbol table")
        _, _, _, _, offset, size, link, _, _, entsize = dynsym[0]
        if entsize != 24 or link >= shnum or sections[link][1] != 3:
            raise ValueError("malformed dynamic symbol table")
        stroff, strsize = sections[link][4], sections[link][5]
        names = set()
        for pos in range(offset + 24, offset + size - 23, 24):     # entry 0 is the null symbol
            name, info, other, shndx, _, _ = struct.unpack_from(bo + "IBBHQQ", data, pos)
            if shndx == 0 or info >> 4 not in (1, 2, 10) or other & 3 not in (0, 3):
                continue                          # undefined, local or hidden
            end = data.find(b"\0", stroff + name, stroff + strsize)
            if name >= strsize or end < 0:
                raise ValueError("a symbol name lies outside the string table")
            names.add(data[stroff + name:end].decode("ascii", "replace"))
        return names
    except struct.error as e:                     # unreachable after the bounds checks; never a crash
        raise ValueError(f"malformed ELF file ({e})") from None


def library_problem(data: bytes, exports: tuple[str, ...] = EXPORTS) -> str | None:
    """Why these bytes are not a usable kernel library (or launcher module: its exports), or None."""
    try:
        symbols = elf_exports(data)
    except ValueError as e:
        return str(e)
    missing = [s for s in exports if s not in symbols]
    return f"does not export {', '.join(missing)}" if missing else None


# ---------------------------------------------------------------- entries
def read_manifest(lib: Path) -> dict:
    m = json.loads(read_bytes(manifest_path(lib), MAX_MANIFEST, "manifest"))
    if not isinstance(m, dict):
        raise ValueError("not a JSON object")
    return m


def problem(lib: Path) -> str | None:
    """Why the cache entry `lib` must not be loaded (MISSING when there is none), or None when its
    manifest matches the library's size and sha256 and the library passes the ELF check."""
    if lib.parent.is_symlink():
        return "the entry directory is a symbolic link (epic makes none)"
    try:
        m = read_manifest(lib)
    except (FileNotFoundError, NotADirectoryError):
        return "no manifest" if lib.exists() else MISSING
    except (OSError, ValueError) as e:
        return f"unreadable manifest ({e})"
    try:
        data = read_bytes(lib, MAX_LIBRARY, "kernel library")
    except FileNotFoundError:
        return "a manifest without its library"
    except NotARegularFile as e:
        return f"unreadable library ({e})"
    except OSError as e:
        return f"unreadable library ({e.strerror})"
    if m.get("size") != len(data):
        return f"{len(data)} bytes where the manifest says {m.get('size')}"
    if m.get("sha256") != hashlib.sha256(data).hexdigest():
        return "contents differ from the manifest (sha256)"
    if m.get("key") != lib.parent.name or m.get("library") != lib.name:
        return "the manifest belongs to another entry"
    return library_problem(data, LAUNCHER_EXPORTS if m.get("kind") == "launcher" else EXPORTS)


def commit(built: Path, target: Path, expect: dict | None = None, kind: str = "kernel") -> str | None:
    """Check a fresh build and move it into the cache; returns why it is unusable instead, moving
    nothing. The library goes first, then the manifest, both by atomic rename: readers see no entry,
    an entry without a manifest (rejected), or a whole one. The manifest is written next to `built`,
    in the build's temporary directory, so a failure leaves nothing behind."""
    try:
        data = read_bytes(built, MAX_LIBRARY, "kernel library")
    except FileNotFoundError:
        return "nvcc wrote no output file"
    except NotARegularFile as e:
        return str(e)
    exports = LAUNCHER_EXPORTS if kind == "launcher" else EXPORTS
    bad = library_problem(data, exports)
    if bad:
        return bad
    from ..version import __version__
    manifest = {"library": target.name, "key": target.parent.name, "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "kind": kind,
                "symbols": sorted(s for s in elf_exports(data) if s in exports or s.startswith("epic_")),
                "epic_version": __version__, "expect": expect}
    tmp_manifest = built.with_name(built.name + ".json")
    tmp_manifest.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(built, target)
    os.replace(tmp_manifest, manifest_path(target))
    return None


def write_file(path: Path, text: str) -> None:
    """Write a new file at `path` (inside an entry, with its lock held), replacing whatever is there:
    never through a symbolic link planted there (it could point at another user's file) nor into a
    FIFO (it would block)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def discard(lib: Path) -> None:
    """Remove an entry's library and manifest (call with the entry's lock held)."""
    for p in (manifest_path(lib), lib):
        p.unlink(missing_ok=True)


# ---------------------------------------------------------------- locking
def _acquire(lock: Path, wait: float) -> int | None:
    """flock `lock` (created if needed), waiting up to `wait` seconds; None if another process holds it
    that long. A holder deletes the file before it lets go, so once locked, check that the file we hold
    is still the one at `lock`, else start over with the new one."""
    deadline = time.monotonic() + wait
    while True:
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except FileNotFoundError:                 # the directory went away meanwhile: recreate it
            continue
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            lock.unlink()                         # a link where the lock goes: removed, never followed
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        return None
                    time.sleep(0.05)
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _release(lock: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()                             # no lock files left behind
    os.close(fd)


@contextlib.contextmanager
def locked(entry: Path, wait: float):
    """Hold the lock of an entry directory (created if needed); E704 if it cannot be created or
    another process holds it longer than `wait` seconds."""
    lock = entry / LOCK
    try:
        fd = _acquire(lock, wait)
    except OSError as e:
        raise unusable(Path(e.filename or entry), e) from None
    if fd is None:
        raise EpicError(Diagnostic("E704", f"waited {wait:.0f} s for another process building into {entry}",
                                   None, f"if no build is running, remove {lock} (or run `epic cache --prune`)"))
    try:
        yield
    finally:
        _release(lock, fd)
        with contextlib.suppress(OSError):
            entry.rmdir()                         # only if a failed build left it empty


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


# ---------------------------------------------------------------- listing, pruning, cleaning
@dataclass
class Report:
    root: Path
    exists: bool = False
    entries: list[Path] = field(default_factory=list)          # sound libraries
    bad: list[tuple[Path, str]] = field(default_factory=list)   # libraries or manifests that fail validation
    failed: list[Path] = field(default_factory=list)           # directories of failed builds (source kept)
    temps: list[Path] = field(default_factory=list)            # orphaned temporaries
    stale_locks: list[Path] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)             # directories a build is writing now
    links: list[Path] = field(default_factory=list)            # symbolic links named like entries
    size: int = 0


def _keyed(root: Path) -> list[Path]:
    try:
        return sorted(d for d in root.iterdir() if KEY_RE.fullmatch(d.name))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise unusable(root, e) from None


def _entry_dirs(root: Path) -> list[Path]:
    """The entry directories: real ones only. A symbolic link named like an entry (epic makes none)
    may point at another user's files; following it would let a prune delete them."""
    return [d for d in _keyed(root) if not d.is_symlink() and d.is_dir()]


def _links(root: Path) -> list[Path]:
    return [d for d in _keyed(root) if d.is_symlink()]


def _inside(root: Path, p: Path) -> bool:
    """Whether p itself (not what it links to) lies inside the cache directory root."""
    try:
        return p.parent.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _size(p: Path) -> int:
    try:
        if p.is_dir() and not p.is_symlink():
            return sum(_size(c) for c in p.iterdir())
        return p.lstat().st_size
    except OSError:
        return 0


def _classify(d: Path, report: Report) -> None:
    files = sorted(d.iterdir())
    report.temps += [f for f in files if f.name.startswith(TMP_PREFIX)]
    libs = [f for f in files if f.suffix == ".so" and not f.name.startswith(TMP_PREFIX)]
    for lib in libs:
        why = problem(lib)
        if why is None:
            report.entries.append(lib)
        else:
            report.bad.append((lib, why))
    report.bad += [(f, "a manifest without its library") for f in files
                   if f.suffix == ".json" and not f.name.startswith(TMP_PREFIX) and not f.with_suffix(".so").exists()]
    if not libs and any(f.suffix == ".cu" for f in files):
        report.failed.append(d)


def scan(root: Path | None = None) -> Report:
    """What the cache holds, without changing it."""
    root = root or cache_dir()
    report = Report(root, exists=root.is_dir(), links=_links(root))
    for d in _entry_dirs(root):
        report.size += _size(d)
        lock = d / LOCK
        if lock.exists() and _held(lock):
            report.busy.append(d)                 # its temporaries and lock are in use
            continue
        if lock.exists():
            report.stale_locks.append(lock)
        try:
            _classify(d, report)
        except OSError as e:
            raise unusable(d, e) from None
    return report


def _remove(root: Path, p: Path) -> None:
    """Delete p (a link itself, never its target), only if it lies inside the cache."""
    if not _inside(root, p):
        raise EpicError(Diagnostic("E704", f"refusing to delete {p}: it is not inside the kernel cache {root}",
                                   None, "a directory of the cache was replaced while it was being pruned?"))
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)                          # removes links inside as links
    else:
        p.unlink(missing_ok=True)


def _unlink_links(root: Path, removed: Report) -> None:
    for link in _links(root):
        _remove(root, link)
        removed.links.append(link)


def prune(root: Path | None = None) -> Report:
    """Remove orphaned temporaries, stale locks, entries that fail validation and symbolic links named
    like entries (the links, not their targets); directories a build holds are left alone. Returns
    what was removed (in a Report) and what was busy."""
    root = root or cache_dir()
    removed = Report(root, exists=root.is_dir())
    for d in _entry_dirs(root):
        lock = d / LOCK
        stale = lock.exists()
        try:
            fd = _acquire(lock, 0)
            if fd is None:
                removed.busy.append(d)
                continue
            try:
                if stale:
                    removed.stale_locks.append(lock)
                found = Report(root)
                _classify(d, found)
                for p in found.temps + [p for p, _ in found.bad]:
                    removed.size += _size(p)
                    _remove(root, p)
                    if p.suffix == ".so":
                        manifest_path(p).unlink(missing_ok=True)
                removed.temps += found.temps
                removed.bad += found.bad
            finally:
                _release(lock, fd)
            with contextlib.suppress(OSError):
                d.rmdir()
        except OSError as e:
            raise unusable(Path(e.filename or d), e) from None
    try:
        _unlink_links(root, removed)
    except OSError as e:
        raise unusable(Path(e.filename or root), e) from None
    return removed


def clean(root: Path | None = None) -> Report:
    """Remove every entry directory (not anything else under the root) except those a build holds,
    and symbolic links named like entries (the links, not their targets). Returns the removed
    directories as `entries`, with their total size."""
    root = root or cache_dir()
    removed = Report(root, exists=root.is_dir())
    for d in _entry_dirs(root):
        try:
            fd = _acquire(d / LOCK, 0)
            if fd is None:
                removed.busy.append(d)
                continue
            try:
                removed.size += _size(d)
                _remove(root, d)
                removed.entries.append(d)
            finally:
                _release(d / LOCK, fd)
        except OSError as e:
            raise unusable(Path(e.filename or d), e) from None
    try:
        _unlink_links(root, removed)
    except OSError as e:
        raise unusable(Path(e.filename or root), e) from None
    return removed
