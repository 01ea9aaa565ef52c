"""One function per `epic` command. Each returns the exit code; EpicError is rendered by main()."""
from __future__ import annotations

import sys

from epic import pipeline, sizes as sizes_mod
from epic.codegen import refusals as codegen_refusals
from epic.diagnostics import EpicError, error
from epic.frontend import sources
from epic.ir import dump


def cmd_check(args) -> int:
    status = 0
    for path in args.files:
        try:
            analysis = pipeline.analyze(path, path=True)
        except EpicError as e:
            print(str(e), file=sys.stderr)
            status = max(status, e.exit_status)
            continue
        p = analysis.program
        gemms = sum(1 for k in p.kernels if k.kind == "gemm")
        print(f"{p.name}: ok ({gemms} gemm{'s' if gemms != 1 else ''}, {len(p.kernels)} kernel"
              f"{'s' if len(p.kernels) != 1 else ''} after rewrites)")
        for w in codegen_refusals.refusals(p, analysis.source_program):   # warnings: the exit status stays 0
            print(codegen_refusals.render_warning(w), file=sys.stderr)
    return status


def _render(program, args) -> str:
    if args.json:
        return dump.to_json(program)
    if args.dot:
        return dump.to_dot(program)
    return dump.to_text(program)


def cmd_ir(args) -> int:
    from epic.passes import manager
    if args.list_passes:
        for p in manager.PASSES:
            print(f"{p.name:<22} {p.summary}")
        return 0
    if args.file is None:
        raise error("E801", "epic ir needs a FILE", None, "only `epic ir --list-passes` runs without one")
    if args.after and args.after not in manager.pass_names():
        raise error("E801", f"unknown pass '{args.after}'", None, "passes: " + ", ".join(manager.pass_names()))
    analysis = pipeline.analyze(args.file, stop_after=args.after, path=True)
    stages = analysis.stages
    if args.after_all:
        print("// ---- after front end")
        print(_render(analysis.source_program, args), end="")
        for before, stage in zip([analysis.source_program] + [s.program for s in stages], stages):
            print(f"// ---- after {stage.name}")
            print(_render(stage.program, args), end="")
            _print_trace(before, stage, args)
        return 0
    if args.after:
        before = stages[-2].program if len(stages) > 1 else analysis.source_program
        print(_render(stages[-1].program, args), end="")
        _print_trace(before, stages[-1], args)
    else:
        print(_render(analysis.source_program, args), end="")
    return 0


def _print_trace(before, stage, args) -> None:
    """What the pass did: its own trace (simplify: each rule that fired, where), else what changed."""
    if getattr(args, "rules", False) and not (args.json or args.dot):
        for line in stage.trace or dump.changes(before, stage.program) or ["(no change)"]:
            print(f"// {stage.name}: {line}")


def _summary_line(name: str, t) -> str:
    import torch
    x = t.double()
    finite = x[torch.isfinite(x)]
    head = ", ".join(f"{float(v):.4g}" for v in x.reshape(-1)[:4])
    stats = (f"mean {finite.mean():.4g}  std {finite.std():.4g}  min {finite.min():.4g}  max {finite.max():.4g}"
             if finite.numel() > 1 else "")
    bad = x.numel() - finite.numel()
    return (f"  {name:<10} {str(list(t.shape)):<14} {stats}" + (f"  non-finite {bad}" if bad else "")
            + f"\n  {'':<10} first: {head}")


def _sizes(program, text: str) -> dict[str, int]:
    sizes = sizes_mod.parse_shape_arg(text)
    sizes_mod.check_complete(program, sizes)
    return sizes


# The reference interpreter holds every tensor in float64 on the CPU: refuse sizes it cannot hold
# (512 MiB per tensor) with a diagnostic instead of an allocation failure.
REFERENCE_MAX_ELEMENTS = 1 << 26


def _check_reference_sizes(program, sizes: dict[str, int]) -> None:
    shapes = [(f"'{t.name}'", t.dims) for t in program.tensors.values()]
    shapes += [(f"the accumulator of gemm '{k.name}'", (k.rows, k.n)) for k in program.kernels if k.kind == "gemm"]
    for what, dims in shapes:
        count = 1
        for d in dims:
            count *= sizes_mod.evaluate(d, sizes)
        if count > REFERENCE_MAX_ELEMENTS:
            raise error("E607", f"{what} would hold {count:,} values at these sizes; the reference interpreter "
                        f"runs on at most {REFERENCE_MAX_ELEMENTS:,} per tensor", None,
                        "the reference is float64 on the CPU: use small sizes, e.g. --shape M=64,...")


def cmd_ref(args) -> int:
    from epic import reference
    from epic.checks import layout
    analysis = pipeline.analyze(args.file, path=True)
    program = analysis.source_program
    sizes = _sizes(program, args.shape)
    diags = layout.check_sizes(program, sizes)
    if diags:
        raise EpicError(diags)
    _check_reference_sizes(program, sizes)
    if not -2**63 <= args.seed < 2**64:
        raise error("E801", f"--seed {args.seed} is out of range", None, "use a seed between 0 and 2**63 - 1")
    inputs = reference.random_inputs(program, sizes, args.seed)
    exact = not args.rounded
    outputs = reference.run(program, inputs, exact=exact, sizes=sizes)
    mode = "exact float64" if exact else "stored values rounded to their dtypes"
    print(f"{program.name}: {', '.join(f'{k}={v}' for k, v in sizes.items())}  ({mode}, seed {args.seed})")
    for name, t in outputs.items():
        print(_summary_line(f"{name}", t) + f"  [{program.tensors[name].dtype}]")
    if args.compare_rewrite:
        from epic.plan import verify
        print(verify.compare_report(analysis, inputs, sizes))
    return 0


def cmd_plan(args) -> int:
    from epic.plan import ledger, planner
    analysis = pipeline.analyze(args.file, path=True)
    sizes = _sizes(analysis.program, args.shape)
    plan = planner.make_plan(analysis.program, sizes, gpu=_gpu_key(args.gpu))
    print(ledger.render(plan, analysis.source_program))
    if args.tuned:
        from pathlib import Path
        from epic.tuning import report
        print()
        print(report.render(analysis.program, sizes, Path(args.db) if args.db else None))
    return 0


def cmd_compile(args) -> int:
    from epic.codegen import emit
    analysis = pipeline.analyze(args.file, path=True)
    sizes = _sizes(analysis.program, args.shape) if args.shape else None
    gpu = _gpu_key(args.gpu)
    try:
        written = emit.write_sources(analysis.program, args.output, sizes, gpu)
    except OSError as e:
        raise error("E801", f"cannot write to -o {sources.printable(args.output)}: {e.strerror or e}", None,
                    "give a directory that can be created or written") from None
    for p in written:
        print(p)
    for name, cfg in emit.kernel_configs(analysis.program, emit.rows(analysis.program, sizes), sizes=sizes,
                                         gpu=gpu).items():
        if cfg.vendor:
            print(f"{name}: no source (backend {cfg.backend}: the vendor's gemm, called through torch)")
    if args.build:
        _build(analysis, sizes, None)
    return 0


def cmd_build(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise error("E801", f"-j {args.jobs}: the number of parallel nvcc processes must be at least 1", None,
                    "leave -j out to use one per CPU")
    rows = _rows(args.rows) if args.rows is not None else None
    if args.bundle is None and rows is None:
        analysis = pipeline.analyze(args.file, path=True)
        _build(analysis, _sizes(analysis.program, args.shape) if args.shape else None, args.jobs)
        return 0
    from epic.runtime import bundle, bundle_build
    target = bundle.check_target(args.bundle) if args.bundle is not None else None   # before nvcc runs
    analysis = pipeline.analyze(args.file, path=True)
    sizes = _sizes(analysis.program, args.shape) if args.shape else None
    for lib in bundle_build.build(analysis, args.file, sizes, rows, args.jobs, target):
        print(f"built {lib}")
    return 0


def _gpu_key(spelling: str | None) -> str | None:
    """--gpu's key (plan/gpus.py), else this machine's GPU's (None: an H200 or no GPU)."""
    from epic.plan import gpus
    return gpus.SPELLINGS[spelling] if spelling else gpus.local_without_torch()[1]


def _rows(text: str) -> list[int]:
    try:
        rows = [int(part) for part in text.split(",")]
    except ValueError:
        rows = []
    if not rows or any(not 1 <= m <= 1 << 31 for m in rows):
        raise error("E801", f"--rows {text!r}: expected row counts separated by commas, e.g. --rows 64,8192")
    return rows


def _build(analysis, sizes, jobs) -> None:
    from epic.runtime import fastcall
    from epic.runtime.compiled import CompiledProgram
    fastcall.start(warn=False)          # the launcher's compiler beside nvcc, not after it
    for lib in CompiledProgram(analysis).build(sizes, jobs):
        print(f"built {lib}")
    _build_launcher()


def _build_launcher() -> None:
    """The compiled call path (an optimization: where it cannot be built, calls take ctypes)."""
    import warnings
    from epic.runtime import fastcall
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        path = fastcall.library()
    if path is not None:
        print(f"built {path} (the compiled call path)")
    elif fastcall.why_not() != "EPIC_LAUNCHER=ctypes":
        print(f"epic: note: calls will take the ctypes path: {fastcall.why_not()}", file=sys.stderr)


def cmd_tune(args) -> int:
    for flag, value, least in (("-k", args.candidates, 1), ("--reps", args.reps, 1), ("-j", args.jobs, 1),
                               ("--timeout", args.timeout, 0)):
        if value is not None and not least <= value <= 10_000:
            raise error("E801", f"{flag} {value}: must be a whole number from {least} to 10000")
    from epic.tuning import tuner
    if args.build_only:
        analysis = pipeline.analyze(args.file, path=True)
        trials = tuner.build_candidates(args.file, _sizes(analysis.program, args.shape), limit=args.candidates,
                                        jobs=args.jobs)
        for t in trials:
            print(f"{t.gemm}: {t.config}" + (f"  skipped: {t.why}" if t.why else ""))
        print(f"built {len(tuner.kernels_of(trials))} kernel(s) for {sum(t.why is None for t in trials)} of "
              f"{len(trials)} configuration(s)")
        return 0
    import torch
    if not torch.cuda.is_available():
        raise error("E703", "epic tune times kernels on a CUDA GPU, and none is available", None,
                    "run it on the machine (the GPU type) the kernels will run on (--build-only builds "
                    "its kernels without one)")
    from pathlib import Path
    analysis = pipeline.analyze(args.file, path=True)
    sizes = _sizes(analysis.program, args.shape)
    result = tuner.tune(args.file, sizes, limit=args.candidates, reps=args.reps, jobs=args.jobs, timeout=args.timeout,
                        database_file=Path(args.db) if args.db else None, timing=args.timing)
    print(f"tuned: {result.ms:.3f} ms (heuristic configuration {result.heuristic_ms:.3f} ms, "
          f"{result.heuristic_ms / result.ms:.3f}x)")
    for gemm, cfg in result.configs.items():
        print(f"  {gemm}: " + ", ".join(f"{k}={'x'.join(map(str, v)) if isinstance(v, (tuple, list)) else v}"
                                      for k, v in cfg.items()))
    print(f"stored as {result.key}")
    return 0


def cmd_ops(args) -> int:
    from epic.ir import catalog
    print(catalog.markdown() if args.markdown else catalog.text())
    return 0


def cmd_grad(args) -> int:
    from epic.autodiff.derive import derive_source
    wrt = [w.strip() for w in args.wrt.split(",") if w.strip()] if args.wrt is not None else None
    if wrt is not None and not wrt:
        raise error("E801", "--wrt names no input", None, "e.g. --wrt x,w")
    d = derive_source(args.file, wrt, args.straight_through, path=True, policy=args.policy)
    print(d.forward_text if args.forward or d.fused else d.backward_text, end="")
    if args.shape:
        for line in d.ledger(_sizes(d.program, args.shape)):
            print(f"# {line}")
    if args.check:
        from epic.autodiff.check import compare
        sizes = _sizes(d.program, args.check)
        for name, err in compare(d, sizes).items():
            print(f"# check: d{name} relative error {err:.2e} against torch.autograd (float64)", file=sys.stderr)
    return 0
