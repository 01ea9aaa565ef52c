"""Kernel bundles: directories of prebuilt kernels a model can ship (`epic build FILE --bundle DIR`).

A bundle has the cache's layout -- DIR/<key>/<name>.so next to its manifest <name>.json -- plus
epic-bundle.json (the index: the programs, their source hashes, the epic, nvcc and CUTLASS versions
and the kernels' keys) and, where `epic tune` measured the program, tuning.json (the program's
entries of the tuning database; point EPIC_TUNING at it).

EPIC_BUNDLE=DIR[:DIR2...] makes every kernel lookup try the bundles, read-only, before the cache;
nothing is ever built into a bundle. A bundle is untrusted input: a library is served only if it
passes the cache's own checks (cache.problem: manifest, size, sha256, ELF exports) under its key,
which hashes the kernel's source, the flags and the nvcc and CUTLASS versions -- a bundle built by
another epic, nvcc or CUTLASS, or for other sources, is simply not found. Symbolic links inside a
bundle are never followed, FIFOs and devices are refused, and every read is bounded.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from ..diagnostics import error
from ..frontend.sources import NotARegularFile, printable, read_bytes
from . import cache

INDEX = "epic-bundle.json"
TUNING = "tuning.json"
FORMAT = 1
MAX_INDEX = 16 << 20


# ---------------------------------------------------------------- lookup
def roots() -> list[Path]:
    """The bundles EPIC_BUNDLE names, in order (E706 for one that is not a directory: a typo would
    otherwise make every kernel build again, or fail under EPIC_NO_BUILD, with no word why)."""
    out = []
    for part in os.environ.get("EPIC_BUNDLE", "").split(os.pathsep):
        if not part.strip():
            continue
        if not os.path.isdir(part):
            raise error("E706", f"EPIC_BUNDLE names '{printable(part)}', which is not a directory", None,
                        "give the directories `epic build FILE --bundle DIR` wrote, separated by ':'")
        out.append(Path(part))
    return out


def _kind(path: Path) -> int | None:
    """The file type of path itself (a link is a link, never what it points at); None if absent."""
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return None


def _servable(lib: Path) -> bool:
    """A bundle's entry is served only as plain files in a plain directory that pass the cache's checks."""
    if _kind(lib.parent) != stat.S_IFDIR:
        return False
    if any(_kind(p) != stat.S_IFREG for p in (lib, cache.manifest_path(lib))):
        return False
    return cache.problem(lib) is None


def find(key: str, name: str) -> Path | None:
    """The first bundle's library `name` under `key` that may be served, else None."""
    for root in roots():
        lib = root / key / name
        if _servable(lib):
            return lib
    return None


def find_built_elsewhere(name: str, key_for) -> Path | None:
    """Where this machine has no nvcc (or no CUTLASS headers) to compute a kernel's key with: each
    bundle's library under the key its own index's versions give (key_for(nvcc, cutlass)); the key
    still hashes the kernel's source, so a bundle for other sources is not found."""
    for root in roots():
        index = read_index(root)
        if index is None:
            continue
        lib = root / key_for(str(index.get("nvcc_version")), str(index.get("cutlass_version"))) / name
        if _servable(lib):
            return lib
    return None


def read_index(root: Path) -> dict | None:
    """A bundle's index, or None where there is none or it is not one (a link, a FIFO, too big, not JSON)."""
    path = root / INDEX
    if _kind(path) != stat.S_IFREG:
        return None
    try:
        index = json.loads(read_bytes(path, MAX_INDEX, "bundle index"))
    except (OSError, ValueError):           # NotARegularFile and JSON errors are ValueErrors
        return None
    return index if isinstance(index, dict) and index.get("format") == FORMAT else None


# ---------------------------------------------------------------- writing (epic build --bundle)
def check_target(text: str) -> Path:
    """The --bundle directory, refused (E801) before anything is built: a file, a link, or a directory
    that holds something other than a bundle (writing there would mix kernels into unrelated files)."""
    root = Path(text)
    shown = printable(text)
    kind = _kind(root)
    if kind == stat.S_IFLNK:
        raise error("E801", f"--bundle {shown} is a symbolic link", None, "give the bundle directory itself")
    if kind is not None and kind != stat.S_IFDIR:
        raise error("E801", f"--bundle {shown} exists and is not a directory", None,
                    "give a new directory, or one that `epic build --bundle` wrote")
    if kind == stat.S_IFDIR:
        try:
            names = os.listdir(root)
        except OSError as e:
            raise error("E801", f"--bundle {shown} cannot be read: {e.strerror or e}") from None
        if names and INDEX not in names:
            raise error("E801", f"--bundle {shown} is a directory that is not empty and holds no {INDEX}", None,
                        "give a new directory, or one that `epic build --bundle` wrote")
        if names and read_index(root) is None:
            raise error("E801", f"--bundle {shown}: its {INDEX} is not a bundle index of format {FORMAT}", None,
                        "write the bundle into a new directory")
    return root


def write(root: Path, program: dict, built: list, versions: dict) -> list[Path]:
    """Copy the built libraries (pairs of Unit and cache path) and their manifests into the bundle and
    add the program (name, fingerprint, source_sha256, sizes) to its index; returns the libraries copied.
    versions: what the kernels' keys hash (epic, nvcc, CUTLASS, code generation), which the index records."""
    try:
        return _write(root, program, built, versions)
    except OSError as e:
        raise error("E801", f"cannot write the bundle {printable(str(root))}: {e.strerror or e}", None,
                    "give a directory that can be created or written") from None


def _write(root: Path, program: dict, built: list, mine: dict) -> list[Path]:
    check_target(str(root))
    root.mkdir(parents=True, exist_ok=True)
    index = read_index(root) or {"format": FORMAT, **mine, "programs": {}, "kernels": {}}
    other = {k: (index.get(k), v) for k, v in mine.items()
             if index.get(k) != v and not (k == "cutlass_version" and v == "-")}
    if other:
        what = ", ".join(f"{k} {was} (this build: {now})" for k, (was, now) in other.items())
        raise error("E801", f"--bundle {printable(str(root))} holds kernels of another build: {what}", None,
                    "write this build into a new directory")
    written = []
    names = []
    for unit, lib in built:
        dest = root / lib.parent.name / lib.name
        names.append(f"{lib.parent.name}/{lib.name}")
        if not _servable(dest):
            _copy_entry(lib, dest)
            written.append(dest)
        manifest = cache.read_manifest(dest)
        index["kernels"][names[-1]] = {"kernel": unit.name, "sha256": manifest["sha256"], "size": manifest["size"]}
    index["programs"][program["fingerprint"]] = {**program, "kernels": sorted(set(names))}
    replace_file(root / INDEX, (json.dumps(index, indent=1, sort_keys=True) + "\n").encode())
    return written


def _copy_entry(lib: Path, dest: Path) -> None:
    """Library first, then manifest, each by atomic rename, then the cache's check on the copy."""
    if _kind(dest.parent) not in (None, stat.S_IFDIR):
        raise error("E801", f"the bundle's entry {printable(str(dest.parent))} is not a directory", None,
                    "write the bundle into a new directory")
    dest.parent.mkdir(exist_ok=True)
    try:
        data = read_bytes(lib, cache.MAX_LIBRARY, "kernel library")
        meta = read_bytes(cache.manifest_path(lib), cache.MAX_MANIFEST, "manifest")
    except NotARegularFile as e:
        raise error("E704", f"the cache entry {lib} cannot be copied: {e}") from None
    replace_file(dest, data)
    replace_file(cache.manifest_path(dest), meta)
    why = cache.problem(dest)
    if why is not None or hashlib.sha256(data).hexdigest() != json.loads(meta).get("sha256"):
        raise error("E704", f"the copy of {lib} in the bundle is not usable: {why or 'changed while copied'}",
                    None, "`epic cache --prune`, then build the bundle again")


def replace_file(path: Path, data: bytes) -> None:
    """Write a file by atomic rename: never through a link planted at `path`, never half written."""
    fd, tmp = tempfile.mkstemp(prefix=cache.TMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
