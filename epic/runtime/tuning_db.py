"""The tuning database: what `epic tune` measured best, per program, GPU, shape bucket and versions.
Every call reads it (runtime/compiled.py); the search (epic/tuning) writes it with store().

A JSON file: $EPIC_TUNING if set, else tuning.json in the kernel cache directory. Users can ship one
with their model (set EPIC_TUNING to it). An entry's key is

    <program fingerprint>|<GPU name>|<shape bucket>|epic <version>|cutlass <version>

where the fingerprint hashes the rewritten program's IR (so a changed program, or an epic whose
passes rewrite it differently, never matches), and the bucket is the row count rounded up to a
power of two with every other dimension exact (a model's weights fix them). The entry holds the
per-gemm configuration (epic.compile's `config` dicts), the tuned and heuristic times and the date.

The file is input from users: anything unreadable or malformed (also a FIFO, a device or a file over
MAX_BYTES) is reported once as a warning and ignored (entry by entry), never a crash or a hang;
entries are re-checked like a call's config before use.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from pathlib import Path

from .. import sizes as sizes_mod
from ..diagnostics import Diagnostic, EpicError
from ..frontend import options
from ..frontend.sources import read_bytes
from ..ir import dump

VERSION = 1
MAX_BYTES = 64 << 20     # tens of thousands of entries; a FIFO or /dev/zero is refused, not read
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def path() -> Path:
    env = os.environ.get("EPIC_TUNING", "").strip()
    if env:
        return Path(env)
    from .cache import cache_dir
    return cache_dir() / "tuning.json"


def fingerprint(program) -> str:
    return hashlib.sha256(dump.to_text(program).encode()).hexdigest()[:16]


def bucket(program, sizes: dict[str, int]) -> str:
    rows = next(k.rows for k in program.kernels)
    m = sizes_mod.evaluate(rows, sizes)
    others = ",".join(f"{d}={sizes[d]}" for d in sorted(sizes) if d not in rows.names)
    return f"M<={1 << max(0, (m - 1).bit_length())}" + (f",{others}" if others else "")


def versions() -> str:
    from .build import cutlass_paths
    from ..version import __version__
    try:
        cutlass = cutlass_paths()[0]
    except EpicError:
        cutlass = "none"
    return f"epic {__version__}|cutlass {cutlass}"


def key(program, sizes: dict[str, int], gpu: str) -> str:
    return f"{fingerprint(program)}|{gpu}|{bucket(program, sizes)}|{versions()}"


def ignored(why: str) -> None:
    """Say (once) that the database was not used for a call, and why."""
    _warn(f"{why}; the heuristic's configuration is used")


def _warn(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"epic: tuning database: {message}", RuntimeWarning, stacklevel=3)


def load(file: Path | None = None) -> dict:
    """The entries of the database ({} if there is none, or it cannot be read: a warning says why)."""
    file = file or path()
    try:
        data = json.loads(read_bytes(file, MAX_BYTES, "tuning database"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        _warn(f"{file} cannot be read ({e}); ignored")
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
        _warn(f"{file} is not an epic tuning database of version {VERSION}; ignored")
        return {}
    return data["entries"]


def lookup(program, sizes: dict[str, int], gpu: str, gemms: dict, file: Path | None = None) -> dict[str, dict]:
    """The tuned per-gemm configuration for this program, sizes and GPU ({} if none). gemms: name ->
    span, for the same checks a call's config gets; a malformed entry warns and is ignored."""
    entries = load(file)
    if not entries:
        return {}
    k = key(program, sizes, gpu)
    entry = entries.get(k)
    if entry is None:
        return {}
    try:
        configs = entry["configs"]
        return options.check_config({g: dict(c) for g, c in configs.items()}, gemms)
    except (EpicError, KeyError, TypeError, ValueError, AttributeError) as e:
        _warn(f"the entry {k!r} of {file or path()} is not usable ({str(e).splitlines()[0]}); ignored")
        return {}


def entries(program, sizes: dict[str, int], file: Path | None = None) -> dict[str, dict]:
    """GPU name -> entry, for every GPU the database holds this program at these sizes for."""
    fp, rest = fingerprint(program), f"|{bucket(program, sizes)}|{versions()}"
    out = {}
    for k, entry in load(file).items():
        if k.startswith(fp + "|") and k.endswith(rest) and isinstance(entry, dict):
            out[k[len(fp) + 1:len(k) - len(rest)]] = entry
    return out


def milliseconds(x) -> float | None:
    """A time read from the file (a user's): a positive, finite number of ms, else None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e9 else None


def verdict(entry: dict) -> tuple[str, float] | None:
    """Which form the entry measured fastest -- "fused", "eager" or "compiled" (the unfused torch form)
    -- and how much faster it is than the best of the others; None without unfused timings."""
    unfused = entry.get("unfused") if isinstance(entry, dict) else None
    fused = milliseconds(entry.get("ms")) if isinstance(entry, dict) else None
    if not isinstance(unfused, dict) or fused is None:
        return None
    times = {"fused": fused, **{form: ms for form in ("eager", "compiled")
                                if (ms := milliseconds(unfused.get(f"{form}_ms"))) is not None}}
    if len(times) < 2:
        return None
    best = min(times, key=times.get)
    second = min(ms for form, ms in times.items() if form != best)
    return best, second / times[best]


def store(program, sizes: dict[str, int], gpu: str, entry: dict, file: Path | None = None) -> str:
    """Add or replace the entry for this program, sizes and GPU; the file is replaced atomically
    (a reader sees the old or the new database, never half of one). Returns the key."""
    file = file or path()
    k = key(program, sizes, gpu)
    with _LOCK:
        entries = load(file)
        entries[k] = entry
        tmp = None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tuning-", dir=file.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, file)
        except OSError as e:
            raise EpicError(Diagnostic("E704", f"the tuning database {file} cannot be written: {e.strerror or e}",
                                       None, "pass a writable file with --db (or EPIC_TUNING)")) from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    return k
