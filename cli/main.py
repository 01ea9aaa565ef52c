"""The `epic` command: a thin layer over the Python API, one function per command.

Exit codes: 0 success, 1 the program has diagnostics (or a build failed), 2 bad command line,
3 an internal error (a bug in epic: the message says so).
"""
from __future__ import annotations

import argparse
import os
import sys

from epic import envflags
from epic.diagnostics import EpicError
from epic.plan import gpus
from epic.tuning import measure

COMMANDS = {
    "check": "check .epi files: syntax, types, tile locality, layout (exit 0 clean, 1 on diagnostics)",
    "ir": "print a program's typed IR as text, JSON or Graphviz dot, before or after any pass",
    "ref": "run a program through the float64 reference interpreter on random inputs of given sizes",
    "plan": "print the kernels, buffers and byte ledger of a program for given sizes",
    "compile": "write the generated CUDA (.cu) of every kernel of a program to a directory",
    "build": "compile a program's kernels with nvcc into the on-disk cache (no GPU needed)",
    "tune": "time each gemm's legal configurations on the GPU and store the fastest (the tuning database)",
    "grad": "derive a program's backward (reverse mode) and print it as .epi text; --check compares with torch",
    "ops": "list the language's primitives and reduction functions (what each means, its C++ cost)",
    "cache": "show the kernel cache; --prune removes damaged entries and leftovers, --clean everything",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epic", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="epic: compile GEMM epilogue programs (.epi) into fused CUTLASS sm90a kernels.",
        epilog="commands:\n" + "\n".join(f"  {k:<8} {v}" for k, v in COMMANDS.items())
        + "\n\nRun `epic COMMAND --help` for a command's options.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("check", help=COMMANDS["check"], description=COMMANDS["check"])
    c.add_argument("files", nargs="+", metavar="FILE")

    c = sub.add_parser("ir", help=COMMANDS["ir"], description=COMMANDS["ir"])
    c.add_argument("file", metavar="FILE", nargs="?", help="the program (not needed with --list-passes)")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--dot", action="store_true", help="print Graphviz dot (render with `dot -Tsvg`)")
    when = c.add_mutually_exclusive_group()
    when.add_argument("--after", metavar="PASS", help="print the IR after this pass (see --list-passes)")
    when.add_argument("--after-all", action="store_true", help="print the IR after every pass")
    when.add_argument("--list-passes", action="store_true", help="list the passes in the order they run")
    c.add_argument("--rules", action="store_true", help="with --after/--after-all: also list what each pass did "
                   "where (simplify: which rule fired at which value)")

    c = sub.add_parser("ref", help=COMMANDS["ref"], description=COMMANDS["ref"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("--shape", required=True, help="sizes of the program's dimensions, e.g. M=64,D=512")
    c.add_argument("--seed", type=int, default=0, help="random seed for the inputs (default 0)")
    c.add_argument("--rounded", action="store_true",
                   help="round every stored value to its dtype, as kernels do (default: exact float64)")
    c.add_argument("--compare-rewrite", action="store_true",
                   help="also run the rewritten plan; report both against exact float64 (dtype-rounded)")

    c = sub.add_parser("plan", help=COMMANDS["plan"], description=COMMANDS["plan"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("--shape", required=True, help="sizes of the program's dimensions, e.g. M=8192,D=4096,F=14336")
    c.add_argument("--tuned", action="store_true", help="also print what `epic tune` measured at these sizes: "
                   "the fused kernels against the unfused torch form, per GPU")
    c.add_argument("--db", metavar="FILE", help="with --tuned: the tuning database (default: $EPIC_TUNING, else "
                   "tuning.json in the kernel cache)")
    _gpu_option(c)

    c = sub.add_parser("compile", help=COMMANDS["compile"], description=COMMANDS["compile"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for the .cu files")
    c.add_argument("--shape", help="sizes, to pick tile configurations (default: a large-M configuration)")
    c.add_argument("--build", action="store_true", help="also build them with nvcc (same as `epic build`)")
    _gpu_option(c)

    c = sub.add_parser("build", help=COMMANDS["build"], description=COMMANDS["build"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("--shape", help="sizes, to pick tile configurations (default: a large-M configuration)")
    c.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    c.add_argument("--rows", metavar="M1,M2", help="build the configurations of these row counts, e.g. 64,8192 "
                   "(with --shape: its other sizes)")
    c.add_argument("--bundle", metavar="DIR", help="also copy the kernels into DIR, a bundle a model can ship "
                   "(EPIC_BUNDLE=DIR serves them; README, Shipping prebuilt kernels)")

    c = sub.add_parser("tune", help=COMMANDS["tune"], description=COMMANDS["tune"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("--shape", required=True, help="sizes of the program's dimensions, e.g. M=8192,D=4096")
    c.add_argument("-k", "--candidates", type=int, default=6, help="configurations per gemm (default 6)")
    c.add_argument("--reps", type=int, default=20, help="timed runs per configuration (default 20)")
    c.add_argument("--timing", choices=measure.TIMINGS, default=measure.TIMINGS[0],
                   help="paired (default): each configuration in rounds against the first, runs milliseconds "
                        "apart; sustained: each replayed back to back for seconds at its own power limit, as a "
                        "training step runs its gemms (docs/PERFORMANCE.md, 'Sustained load')")
    c.add_argument("--timeout", type=int, default=120, metavar="SECONDS",
                   help="time each configuration in a child process killed after this long (a kernel that "
                        "never finishes fails its candidate, not the tune); 0: in this process (default 120)")
    c.add_argument("-j", "--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    c.add_argument("--db", metavar="FILE", help="the tuning database (default: $EPIC_TUNING, else tuning.json "
                   "in the kernel cache)")
    c.add_argument("--build-only", action="store_true", help="no GPU needed: build into the kernel cache the "
                   "kernels the tune would time, then stop (copy the cache to the GPU machine)")

    c = sub.add_parser("grad", help=COMMANDS["grad"], description=COMMANDS["grad"])
    c.add_argument("file", metavar="FILE")
    c.add_argument("--wrt", metavar="X,W", help="inputs to differentiate with respect to (default: every f32, bf16 "
                   "or f16 tensor input)")
    c.add_argument("--forward", action="store_true", help="print the forward program that also stores what the "
                   "backward reads, instead of the backward")
    c.add_argument("--straight-through", action="store_true", help="take the derivative of a quantizing cast or "
                   "store as 1 (straight-through estimator) instead of refusing (E901)")
    c.add_argument("--policy", choices=("save", "recompute", "fused"), default="save", help="save (default): a gemm "
                   "whose one stored tile only feeds the next gemm keeps its accumulator, and its backward runs in the "
                   "gemm that computes its incoming gradient (pattern D); recompute: every backward epilogue runs in a "
                   "gemm that recomputes its forward accumulator (less memory, more flops); fused: a loss head of one "
                   "gemm computes its gradient in the forward, its outputs' weights given as inputs (one program, "
                   "printed whether or not --forward is given)")
    c.add_argument("--shape", metavar="SIZES", help="also print what is saved (bytes) and recomputed (flops) at "
                   "these sizes, e.g. M=8192,D=4096,F=14336")
    c.add_argument("--check", metavar="SIZES", help="also run both on random inputs of these sizes (e.g. M=33,D=48) "
                   "with the float64 interpreter and compare the gradients with torch.autograd")

    c = sub.add_parser("ops", help=COMMANDS["ops"], description=COMMANDS["ops"])
    c.add_argument("--markdown", action="store_true", help="print the table docs/LANGUAGE.md holds")

    c = sub.add_parser("cache", help=COMMANDS["cache"], description=COMMANDS["cache"])
    what = c.add_mutually_exclusive_group()
    what.add_argument("--prune", action="store_true", help="remove orphaned temporaries, stale locks, bad entries")
    what.add_argument("--clean", action="store_true", help="remove every cache entry")
    return p


def _gpu_option(c) -> None:
    c.add_argument("--gpu", choices=sorted(gpus.SPELLINGS), help="the GPU whose tile choices to use (an H100's "
                   "differ at some shapes; default: this machine's GPU, else h200, which also stands for any "
                   "other GPU)")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning on the command line is one line of text (epic's say "epic: ..."), never Python's
    file, line number and source line, which read like a traceback."""
    text = str(message).splitlines()[0] if str(message) else category.__name__
    print(text if text.startswith("epic:") else f"epic: warning: {text}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import warnings
    warnings.showwarning = _show_warning
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from . import cache_cmd, commands
    try:
        code = getattr(cache_cmd if args.command == "cache" else commands, f"cmd_{args.command}")(args)
        sys.stdout.flush()      # a closed pipe shows here, not at exit
        return code
    except EpicError as e:
        print(str(e), file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:     # `epic ir ... | head`: the reader has all it wants
        _discard_stdout()
        return 141              # as if killed by SIGPIPE (128 + 13), like other tools in a pipe
    except Exception as e:  # a bug in epic: say so plainly; the traceback only on request
        if envflags.enabled("EPIC_DEBUG"):
            raise
        print(f"epic: internal error: {type(e).__name__}: {e}\n"
              "This is a bug in epic, not in your program. Set EPIC_DEBUG=1 for the traceback.", file=sys.stderr)
        return 3


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # stdout is not a file (captured in a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
