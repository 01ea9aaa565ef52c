"""The Python API: epic.compile(path_or_source) -> CompiledProgram; program(**tensors) -> outputs.

A call validates every tensor (presence, dtype, device, shape, strides, 16-byte alignment) before
anything launches, solves the dimension sizes, picks the plan for those sizes (cached per input
signature), builds or loads each kernel from the on-disk cache, allocates what the plan says, and
launches the plan's kernels in order on the current CUDA stream: one Executable per signature
(runtime/executable.py), which the compiled launcher and the ctypes path both run. Compiling
checks, rewrites and plans only: code generation (and its refusals, E702) happens when kernels are
first built.
"""
from __future__ import annotations

import threading

import torch

from .. import envflags, pipeline, reference
from ..frontend import options
from ..codegen import emit
from ..diagnostics import EpicError, error
from ..ir.core import Tensor
from ..plan import gpus, planner
from . import background, binding, build, custom_op, derived, executable, fastcall, given_outputs, graphs
from . import tuning_db as database
from .kernels import Kernels
from .validate import check_meaning, signature, solve, validate


FALLBACKS = ("never", "auto", "eager", "compiled")


def compile(path_or_source: str, config: dict[str, dict] | None = None, fallback: str = "never") -> "CompiledProgram":
    """Parse, check and rewrite a program (a path to an .epi file, or its text). Kernels are built
    lazily on the first call for a given row count (or ahead with CompiledProgram.build).
    config: per-gemm overrides, e.g. {"o_proj": {"tile": (128, 128, 64), "schedule": "cooperative"}}.
    fallback: "never" runs the fused kernels; "auto" runs the program's unfused torch form
    (runtime/unfused.py) at the shapes where `epic tune` measured it faster on this GPU; "eager" and
    "compiled" always run that form (eager, or traced and torch.compile'd; no GPU needed)."""
    analysis = pipeline.analyze(path_or_source)
    return CompiledProgram(analysis, options.check_config(config, _gemms(analysis.program)), _policy(fallback))


def _policy(fallback) -> str:
    if not isinstance(fallback, str) or fallback not in FALLBACKS:
        raise error("E608", f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}", None,
                    'fallback="auto" runs the unfused torch form where `epic tune` measured it faster than the '
                    "fused kernels")
    return str(fallback)


class _Unfused:
    """A bound signature that runs the unfused torch form (fallback "auto" decided it, at bind time)."""

    def __init__(self, compiled: bool):
        self.compiled = compiled


def _gemms(program) -> dict:
    return {k.name: k.span for k in program.kernels if k.kind == "gemm"}


def _merged(tuned: dict | None, given: dict | None) -> dict:
    """A gemm's tuned configuration under the program's own config: the given options over the tuned
    ones, unless either names a backend (another library's gemm has none of epic's kernel options):
    then the given config alone."""
    if tuned and given and ("backend" in tuned or "backend" in given):
        return dict(given)
    return {**(tuned or {}), **(given or {})}


def _tuning_name(device_name: str | None) -> str | None:
    """The tuning database's key for a GPU of this name: the name, None with EPIC_NO_TUNING set."""
    return None if envflags.enabled("EPIC_NO_TUNING") else device_name


def _device_name(device) -> str | None:
    """The CUDA name of `device` (default: the current CUDA device), None without one (a negative
    index: binding on the CPU)."""
    if isinstance(device, int) and device < 0:
        return None
    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.get_device_name(device)
    except (AssertionError, RuntimeError):      # a torch without CUDA (the tests' stand-in devices)
        return None


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_raw_stream(index: int) -> int:
    """The raw cudaStream_t of the current stream on device `index`."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def _current_stream(device: torch.device) -> int:
    """The raw cudaStream_t of the current stream on `device` (torch's internal accessor is ~10x
    cheaper than torch.cuda.current_stream(); the public API where it is missing)."""
    return _current_raw_stream(device.index if device.index is not None else torch.cuda.current_device())


class CompiledProgram:
    def __init__(self, analysis, config: dict[str, dict] | None = None, fallback: str = "never"):
        self.analysis = analysis
        self.program = analysis.program
        self.config = config or {}
        self.fallback = _policy(fallback)
        self._unfused_form = None
        self._bound: dict[tuple, executable.Executable | _Unfused] = {}   # input signature -> what runs
        self._kernels = Kernels(self.program)           # the kernels' libraries, per plan configuration
        self._lock = threading.Lock()                   # the compiled launcher's registrations
        self._op = None
        self._scalar_inputs = [t for t in self.program.inputs() if t.is_scalar]
        self._tensor_names = [t.name for t in self.program.inputs() if not t.is_scalar]
        self._fast = None                                # fastcall's Launcher, once a CUDA signature is bound
        self._fast_bound: dict[int, executable.Executable] = {}   # its plan ids -> the Executables handed to it
        self._fast_ids: set[int] = set()                 # id() of those Executables (kept alive by _fast_bound)
        self._fast_pending: list = []                    # (Executable, meta tensors) bound while it was being built
        self._derived_specs = derived.specs(self.program)    # tensors computed from weights before the kernels
        self._derived = derived.Cache()
        self._waiting: dict[tuple, dict] = {}            # EPIC_BUILD_IN_BACKGROUND: signatures -> their plans' configs

    # ------------------------------------------------------------------ information
    @property
    def inputs(self) -> list[Tensor]:
        return self.program.inputs()

    @property
    def outputs(self) -> list[Tensor]:
        return self.program.outputs()

    def plan(self, sizes: dict[str, int], device=None) -> planner.Plan:
        """The plan a call at these sizes on `device` (default: the current CUDA device, if any) runs:
        the configuration the tuning database holds for that GPU (epic tune), under the program's
        own config, else the heuristic's for that GPU (plan/gpus.py)."""
        name = _device_name(device)
        gpu, key = _tuning_name(name), gpus.key(name)
        tuned = database.lookup(self.program, sizes, gpu, _gemms(self.program)) if gpu else {}
        if tuned:
            merged = {g: _merged(tuned.get(g), self.config.get(g)) for g in {*tuned, *self.config}}
            try:
                return planner.make_plan(self.program, sizes, merged, key)
            except EpicError as e:          # an entry the plan refuses (E216/E217): the heuristic's plan
                database.ignored(f"a tuned configuration is refused ({e.diagnostics[0].message.splitlines()[0]})")
        return planner.make_plan(self.program, sizes, self.config, key)

    def units(self, sizes: dict[str, int] | None = None) -> list:
        """(spec, translation unit) of every kernel for these sizes (default: the large-M configuration),
        for this machine's GPU, or every GPU's heuristic without one (plan/gpus.py), without repeats;
        raises E702 for what code generation does not support yet."""
        return emit.units_for_gpus(self.program, emit.rows(self.program, sizes), self.config, sizes,
                                   gpus.build_keys())

    def build(self, sizes: dict[str, int] | None = None, jobs: int | None = None) -> list:
        """Build every kernel for these sizes (default: the large-M configuration); no GPU needed."""
        return build.build_all([u for _, u in self.units(sizes)], jobs)

    @property
    def unfused(self):
        """The program's unfused torch form (runtime/unfused.py): unfused(**args), unfused(compiled=True, **args)."""
        if self._unfused_form is None:
            from .unfused import Unfused
            self._unfused_form = Unfused(self.program, self.analysis.source_program)
        return self._unfused_form

    def unfused_choice(self, sizes: dict[str, int], device=None) -> str | None:
        """Under fallback="auto": "eager" or "compiled" where the tuning database says that unfused form
        beat the fused kernels at these sizes on this GPU, else None (the fused kernels run)."""
        gpu = _tuning_name(_device_name(device))
        if self.fallback != "auto" or gpu is None:
            return None
        entry = database.entries(self.program, sizes).get(gpu)
        best = database.verdict(entry) if entry else None
        return best[0] if best and best[0] != "fused" else None

    def reference(self, exact: bool = True, **tensors) -> dict[str, torch.Tensor]:
        """The float64 reference interpreter on the same inputs (on the CPU). It refuses what a call
        refuses about what the inputs mean: another dtype than the declared one (E603), shapes that
        disagree (E602) and sizes the layout rules refuse (E4xx). Any device, strides and alignment
        will do, and a scalar may be nan or inf (the interpreter says what that gives)."""
        check_meaning(self.program, tensors)
        return reference.run(self.analysis.source_program, tensors, exact=exact)

    # ------------------------------------------------------------------ running
    def __call__(self, *positional, poison: bool = False, keep: bool = False, out: dict | None = None,
                 **args) -> dict[str, torch.Tensor]:
        """Run the program; returns its outputs by name.
        poison=True fills every output and buffer with NaN (a sentinel for integers) before launching,
            so that elements the kernels fail to write show up;
        keep=True also returns the intermediate tensors (tmp, deferred scales, per-tile partials: disjoint
            views of one allocation, while each output has its own; runtime/executable.py), but for a
            tile the row combine kernel finished in place over another (plan.aliases): the finished one.
        The first call with given shapes/dtypes/strides validates everything and binds the signature's
        Executable; later calls with the same signature re-check alignment and scalar values (pointers
        change, layouts do not), in the compiled call path (runtime/fastcall.py) where it is available.
        Where the unfused torch form runs (fallback=...), poison has nothing to fill and keep returns the
        outputs only: that form has no buffers between its ops that the plan names.
        out={name: tensor} writes those outputs into the given tensors (runtime/given_outputs.py says
            which: one may be an input that the output overwrites in place, e.g. a running sum)."""
        if positional:
            raise error("E601", f"a compiled program takes its tensors and scalars by name, got {len(positional)} "
                        "positional argument(s)", None, "call it as prog(" + ", ".join(
                            f"{t.name}=..." for t in self.inputs) + ")")
        if out is not None:
            return self._call_into(out, poison, keep, args)
        if self.fallback in ("eager", "compiled"):
            return self.unfused(compiled=self.fallback == "compiled", **args)
        if self._fast_pending and not fastcall.building():
            self._adopt_launcher()
        fast = self._fast
        if fast is not None and not poison and not self._derived_specs:
            # the compiled launcher reads the keyword arguments itself (templates/launcher.cpp): the
            # outputs' dict; None where the Python path below must take the call (an argument it does not
            # know, a signature not bound yet, a misaligned pointer, a scalar that is not a plain number)
            result = fast.call(args, bool(keep))
            if type(result) is dict:
                return result
            if result is not None:
                self._launch_failed(*result)
        chosen = self._choose(args)
        if isinstance(chosen, _Unfused):
            return self.unfused(compiled=chosen.compiled, **args)
        return chosen.run(args, binding.scalar_values(self._scalar_inputs, args), _current_stream(chosen.device),
                          self._derived, poison_buffers=poison, keep=bool(keep),
                          launcher=fast if id(chosen) in self._fast_ids else None)

    def _call_into(self, out: dict, poison: bool, keep: bool, args: dict) -> dict[str, torch.Tensor]:
        """A call whose outputs `out` names go into the tensors given (the Python launch path)."""
        chosen = None if self.fallback in ("eager", "compiled") else self._choose(args)
        if chosen is None or isinstance(chosen, _Unfused):     # the torch form checks its arguments itself
            got = self.unfused(compiled=self.fallback == "compiled" if chosen is None else chosen.compiled, **args)
            tensors = {t.name: args[t.name] for t in self.inputs if not t.is_scalar}
            device = next(iter(tensors.values())).device
            sizes = solve(self.program, {n: tuple(x.shape) for n, x in tensors.items()}, indexable=False)
            given_outputs.check(self.plan(sizes, device), [t.name for t in self.outputs], device, tensors, out)
            for name, x in out.items():
                x.copy_(got[name])
            return {**got, **out}
        given_outputs.check(chosen.plan, chosen.outputs, chosen.device,
                            {n: args[n] for n in chosen.tensor_names}, out)
        return chosen.run(args, binding.scalar_values(self._scalar_inputs, args), _current_stream(chosen.device),
                          self._derived, poison_buffers=poison, keep=bool(keep), into=out)

    def _choose(self, args: dict):
        """The policy of this call's signature: its Executable (the fused kernels), or an _Unfused
        (fallback="auto" chose the torch form, or EPIC_BUILD_IN_BACKGROUND's kernels are not built yet).
        The first call of a signature validates everything; later ones re-check alignment."""
        key = signature(args)
        chosen = self._bound.get(key)
        if chosen is None:
            tensors, _, device, sizes = validate(self.program, args)
            if device.type == "cuda":
                fastcall.start()            # the launcher builds (if it must) while nvcc does
            choice = self.unfused_choice(sizes, device)
            if choice is None and not self._kernels_ready(key, sizes, device):
                return _Unfused(False)              # EPIC_BUILD_IN_BACKGROUND: the kernels are being built
            if choice is not None:
                chosen = self._bound[key] = _Unfused(choice == "compiled")
            else:
                chosen = self._bound[key] = self._bind(sizes, device)
                if device.type == "cuda":
                    self._register_fast(chosen, chosen.inputs(tensors, self._derived))
        elif not isinstance(chosen, _Unfused):
            for name in chosen.tensor_names:
                if args[name].data_ptr() % 16:
                    validate(self.program, args)          # reports E606 with the declaration's span
        return chosen

    def _launch_failed(self, plan: int, failed: int, rc: int):
        """The compiled launcher's launch `failed` of its plan `plan` returned status rc: its library's error."""
        raise self._fast_bound[plan].launches[failed].library.launch_error(rc)

    def _register_fast(self, exe: executable.Executable, tensors: list[torch.Tensor]) -> None:
        """Hand the Executable to the compiled launcher (tensors: its table's first entries, input tensors
        then derived tensors, whose signature the launcher matches). While the launcher is being built
        (runtime/fastcall.py: a call never waits for the compiler), keep it for then: only the tensors'
        dtypes, shapes and strides, as meta tensors (holding no caller's memory)."""
        with self._lock:
            if self._fast is None:
                self._fast = fastcall.launcher(self._tensor_names, self._scalar_inputs, wait=False)
            if self._fast is not None:
                self._fast_bound[fastcall.register(self._fast, exe, tensors)] = exe
                self._fast_ids.add(id(exe))
            elif fastcall.why_not() is None:          # not refused: being built (or just finished)
                self._fast_pending.append((exe, [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
                                                 for x in tensors]))

    def _adopt_launcher(self) -> None:
        """The launcher's background build has finished: register what was bound meanwhile (or drop it,
        where the launcher could not be built: the ctypes path keeps those signatures)."""
        with self._lock:
            pending, self._fast_pending = self._fast_pending, []
            if self._fast is None:
                self._fast = fastcall.launcher(self._tensor_names, self._scalar_inputs, wait=False)
            if self._fast is not None:
                for exe, metas in pending:
                    self._fast_bound[fastcall.register(self._fast, exe, metas)] = exe
                    self._fast_ids.add(id(exe))

    def _kernels_ready(self, signature: tuple, sizes: dict[str, int], device) -> bool:
        """Whether this call's kernels can be bound now: always, unless EPIC_BUILD_IN_BACKGROUND is set
        and they are not built (runtime/background.py starts their build, once)."""
        if not background.enabled():
            return True
        if signature not in self._waiting:
            self._waiting[signature] = self.plan(sizes, device).configs
        return self._kernels.ready(self._waiting[signature])

    def _bind(self, sizes: dict[str, int], device) -> executable.Executable:
        """The Executable of a signature at these sizes: its plan, its kernels' libraries, bound."""
        plan = self.plan(sizes, device)
        return binding.bind(plan, self._kernels.libraries(plan.configs), device)

    def capture(self, keep: bool = False, **args) -> "graphs.Captured":
        """This call recorded as a CUDA graph (epic/runtime/graphs.py): captured(**new_inputs) copies them
        into the recorded input tensors and replays every kernel with one cudaGraphLaunch."""
        return graphs.Captured(self, keep, args)

    # ------------------------------------------------------------------ torch integration
    def torch_op(self):
        """This program as a torch custom op (torch.library), usable inside torch.compile'd code:
        op(**inputs) -> dict of outputs, like calling the program."""
        if self._op is None:
            self._op = custom_op.register(self)
        return self._op


__all__ = ["compile", "CompiledProgram"]
