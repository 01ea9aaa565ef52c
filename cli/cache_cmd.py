"""`epic cache`: show the kernel cache; --prune removes what is broken, --clean removes every entry."""
from __future__ import annotations

from epic.runtime import cache

LINK = "symbolic link named like an entry (the link only; its target is left alone)"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _listing(title: str, items: list) -> list[str]:
    lines = [f"{title}: {len(items)}"]
    for item in items:
        lines.append(f"  {item[0]}: {item[1]}" if isinstance(item, tuple) else f"  {item}")
    return lines


def cmd_cache(args) -> int:
    root = cache.cache_dir()
    if args.clean:
        r = cache.clean(root)
        for p in r.links:
            print(f"removed {p}: {LINK}")
        print(f"removed {len(r.entries)} entries ({_size(r.size)}) from {root}")
    elif args.prune:
        r = cache.prune(root)
        removed = [*r.bad, *((p, "orphaned temporary") for p in r.temps),
                   *((p, "stale lock") for p in r.stale_locks), *((p, LINK) for p in r.links)]
        for p, why in removed:
            print(f"removed {p}: {why}")
        print(f"pruned {root}: {len(r.bad)} bad entries, {len(r.temps)} temporary files, "
              f"{len(r.stale_locks)} stale lock files, {len(r.links)} symbolic links ({_size(r.size)})")
    else:
        r = cache.scan(root)
        if not r.exists:
            print(f"cache: {root} (empty: not created yet)")
            return 0
        lines = [f"cache: {root}", f"size: {_size(r.size)}", f"entries: {len(r.entries)}",
                 *_listing("bad entries", r.bad), *_listing("orphaned temporary files", r.temps),
                 *_listing("stale lock files", r.stale_locks)]
        if r.failed:
            lines += _listing("failed builds (source and log kept)", r.failed)
        if r.links:
            lines += _listing("symbolic links named like entries (never followed)", r.links)
        if r.bad or r.temps or r.stale_locks or r.links:
            lines.append("`epic cache --prune` removes bad entries, temporary files, stale locks and such links")
        print("\n".join(lines))
    if r.busy:
        print("\n".join(_listing("in use by a running build (left alone)", r.busy)))
    return 0
