"""One nvcc build with its host and device halves running at the same time, which shortens a cold
build where a core is free for the second half (docs/PERFORMANCE.md, "Cold build time").

nvcc runs its steps one after another: the host half (preprocessing, cudafe++), the device half
(preprocessing, cicc, ptxas, fatbinary), then the host compile that embeds the device code, and the
link; for a CUTLASS kernel cicc is the longest step. The halves share one thing: the module id, a
name that cudafe++ writes and cicc reads (it makes internal-linkage names unique per translation
unit). Here epic writes that id itself, in nvcc's format, and runs the halves concurrently; every
step is nvcc's own (`nvcc -dryrun`), run as nvcc prints it. Given nvcc's id, the result is nvcc's
library byte for byte but for two temporary file names (tests/test_nvcc_split.py). When the dry run
does not have the expected shape (another nvcc), None tells the caller to run plain nvcc.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import re
import subprocess
import time
import zlib
from pathlib import Path

# Characters a POSIX shell interprets, even inside the double quotes nvcc puts around paths. nvcc runs
# its steps through a shell and build() runs them with `bash -c`: a path holding one could run
# commands (build.check_paths refuses such paths before nvcc starts). Spaces nvcc quotes correctly.
SHELL_CHARS = frozenset("$`\\\"';&|<>()*?[]{}~!#")


def shell_hazard(path: str) -> str | None:
    """The first character of `path` that a shell would interpret (or a control character), or None."""
    return next((c for c in path if c in SHELL_CHARS or not c.isprintable()), None)


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_MODULE_ID = re.compile(r'--module_id_file_name\s+"([^"]+)"')


def steps(dryrun_stderr: str) -> tuple[dict, list[list[str]]] | None:
    """(environment, [host half, device half, the rest]) from `nvcc -dryrun`'s output, or None."""
    env, commands = {}, []
    for line in dryrun_stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        text = line[3:].strip()
        match = _ASSIGN.match(text)
        if match and not commands:
            if '"' not in match.group(2):          # the paths nvcc's commands use (PATH, CICC_PATH, ...)
                env[match.group(1)] = match.group(2).strip()
        else:
            commands.append(text)
    if len(commands) < 8:
        return None
    host, device, rest = commands[0:2], commands[2:7], commands[7:]
    shape = [(" -E " in f" {host[0]} ",), (host[1].startswith("cudafe++ "), "--gen_module_id_file " in host[1]),
             (" -E " in f" {device[0]} ", "-D__CUDA_ARCH__" in device[0]), (device[1].split()[0].strip('"').rsplit("/", 1)[-1] == "cicc",),
             (device[2].startswith("ptxas "),), (device[3].startswith("fatbinary "),), (device[4].startswith("rm "),)]
    ids = {_MODULE_ID.search(c).group(1) if _MODULE_ID.search(c) else None for c in (host[1], device[1])}
    if not all(all(s) for s in shape) or len(ids) != 1 or None in ids:
        return None
    return env, [host, device, rest]


def module_id(source_path: str, source: str) -> str:
    """A module id in nvcc's format: _<crc32 of the path>_<length of the file name>_<file name as an
    identifier>_<8 hex digits> (nvcc's last part is its own hash; here the source's)."""
    name = Path(source_path).name
    return (f"_{zlib.crc32(source_path.encode()):08x}_{len(name)}_{re.sub(r'[^A-Za-z0-9]', '_', name)}_"
            f"{hashlib.sha256(source.encode()).hexdigest()[:8]}")


def build(cmd: list[str], env: dict, timeout: float, run, source_path: str, source: str,
          the_id: str | None = None) -> subprocess.CompletedProcess | None:
    """Build what `cmd` (an nvcc command line) builds, halves in parallel; None: run plain nvcc.
    run(argv, timeout, env) -> CompletedProcess (build._run: process groups, timeouts, Ctrl-C)."""
    start = time.monotonic()
    dry = run([*cmd, "-dryrun"], timeout, env)
    parsed = steps(dry.stderr) if dry.returncode == 0 else None
    if parsed is None:
        return None
    extra, (host, device, rest) = parsed
    host = [host[0], host[1].replace("--gen_module_id_file ", "", 1)]     # it reads the id written here
    try:
        Path(_MODULE_ID.search(host[1]).group(1)).write_text(the_id or module_id(source_path, source))
    except OSError:                           # not in nvcc's temporary directory after all: plain nvcc
        return None
    run_env = {**env, **extra}

    def half(commands: list[str]) -> subprocess.CompletedProcess:
        # a missing temporary is no error (nvcc's own `rm` of a file its fatbinary did not write)
        script = "\n".join("rm -f " + c[3:] if c.startswith("rm ") else c for c in commands)
        return run(["bash", "-e", "-c", script], max(1.0, timeout - (time.monotonic() - start)), run_env)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = [f.result() for f in [pool.submit(half, host), pool.submit(half, device)]]
    failed = [r for r in done if r.returncode != 0]
    if not failed:
        done.append(half(rest))
        failed = [r for r in done if r.returncode != 0]
    return subprocess.CompletedProcess(cmd, failed[0].returncode if failed else 0,
                                       "".join(r.stdout for r in done), "".join(r.stderr for r in done))
