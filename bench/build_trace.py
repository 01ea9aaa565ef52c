"""Where cicc's time goes while it builds one generated kernel: nvcc's device time trace, summed per
template family (the name up to its first '<'), as self time and as inclusive time (a family counted
once where it nests inside itself).

  nvcc <epic's flags, from the cache entry's build.txt> -cubin K.cu -o K.cubin -fdevice-time-trace K.trace
  python3 bench/build_trace.py K.trace.json [--top 30]

The trace slows cicc about five times and runs to gigabytes for a CUTLASS kernel: it is read in
chunks, never whole, and only its proportions mean anything. No GPU needed."""
import argparse
import collections
import re
import sys

# a complete event: {"args":{"detail":"..."},"dur":N,"name":"...","ph":"X","pid":P,"tid":T,"ts":N}
EVENT = re.compile(rb'\{"args":\{"detail":"((?:[^"\\]|\\.)*)"\},"dur":(\d+),"name":"([^"]*)","ph":"X",'
                   rb'"pid":(\d+),"tid":\d+,"ts":(\d+)\}')
CHUNK = 1 << 26


PROCESS = re.compile(rb'"name"\s*:\s*"cicc"\s*\}\s*,\s*"cat"\s*:\s*""\s*,\s*"name"\s*:\s*"process_name"\s*,'
                     rb'\s*"ph"\s*:\s*"M"\s*,\s*"pid"\s*:\s*(\d+)')


def cicc_pid(path: str) -> int | None:
    """The process id the trace gives cicc (its metadata comes first), None if not named."""
    with open(path, "rb") as f:
        m = PROCESS.search(f.read(1 << 20))
    return int(m.group(1)) if m else None


def events(path: str):
    """(pid, ts, dur, name, detail) of every complete event, read 64 MB at a time."""
    with open(path, "rb") as f:
        rest = b""
        while chunk := f.read(CHUNK):
            rest += chunk
            cut = rest.rfind(b"},{")
            if cut < 0:
                continue
            part, rest = rest[:cut + 1], rest[cut + 1:]
            for m in EVENT.finditer(part):
                yield _event(m)
        for m in EVENT.finditer(rest):
            yield _event(m)


def _event(m: re.Match) -> tuple:
    return int(m.group(4)), int(m.group(5)), int(m.group(2)), m.group(3).decode(), m.group(1).decode(errors="replace")


def family(name: str, detail: str) -> tuple[str, str]:
    return name[:24], re.sub(r"<.*", "<>", detail.replace('\\"', '"'))[:100]


def summarize(evs) -> tuple[collections.Counter, collections.Counter]:
    """Self and inclusive microseconds per family; events nest by time on one thread."""
    own, inclusive = collections.Counter(), collections.Counter()
    stack: list[tuple[int, int, tuple]] = []
    for ts, dur, name, detail in sorted(evs, key=lambda e: (e[0], -e[1])):
        while stack and stack[-1][0] + stack[-1][1] <= ts:
            stack.pop()
        key = family(name, detail)
        if stack:
            own[stack[-1][2]] -= dur
        own[key] += dur
        if all(k != key for _, _, k in stack):
            inclusive[key] += dur
        stack.append((ts, dur, key))
    return own, inclusive


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="the JSON file nvcc's -fdevice-time-trace wrote")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    try:
        pid = cicc_pid(args.trace)      # cicc's events only: the trace also holds ptxas's
        evs = [e[1:] for e in events(args.trace) if pid is None or e[0] == pid]
    except OSError as e:
        print(f"cannot read {args.trace}: {e.strerror}", file=sys.stderr)
        return 2
    own, inclusive = summarize(evs)
    print(f"{len(evs)} events")
    for title, table in (("self", own), ("inclusive", inclusive)):
        print(f"--- {title} seconds by template family")
        for (name, fam), us in table.most_common(args.top):
            print(f"{us / 1e6:8.2f}  {name:24s} {fam}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
