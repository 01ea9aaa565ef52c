"""A program's generated kernels, run on the host, against the reference interpreter.

    case = prepare("samples/residual_rmsnorm.epi", dict(M=77, D=392), config_m=64)
    check(case, seed=1)          # raises AssertionError listing every problem

prepare() picks the configuration the heuristic gives M = config_m (64: pingpong 64x64x64, 8192:
cooperative 128x256x64) at the case's sizes (any M) and renders every kernel (emit.units).
check() then
  1. checks each source's C ABI by roles (abi.py);
  2. compiles the sources for the host (compiler.py) and binds them to the plan with the runtime's
     own binding.bind, and a call's scalars with its binding.scalar_values, so pointer order, sizes
     and scalars (a caller's value or the default) are what the runtime passes;
  3. runs the kernels in order on fresh random inputs (fixed seed), every allocated buffer poisoned
     first (binding.allocate), and again with the buffers filled with other bytes: any element
     that differs between the two runs was not written;
  4. compares every buffer each kernel writes (outputs, intermediates, per-tile partials) with the
     reference interpreter of the rewritten program in rounding mode, kernel by kernel: the
     reference of a kernel's stores is computed from the host's values of everything the other
     kernels wrote (as tests/test_gpu.py does).
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

import epic
from epic import dtypes, reference
from epic.codegen import emit, vendor
from epic.plan import planner, tail
from epic.runtime import binding, derived, vendor_gemm

from .. import gpu_cases
from . import abi, compiler
from .compare import mismatch, unwritten
from .parse import kind, parse_combine, parse_gemm, parse_tail

SECOND_FILL = 0x00   # the second run's buffers start as zero bytes (the first run's are poisoned)


@functools.lru_cache(maxsize=None)
def compiled(path: str):
    return epic.compile(path)


def overrides(configs: dict) -> dict[str, dict]:
    """Per-gemm overrides that make the plan use exactly these configurations."""
    return {name: {"backend": c.backend} if c.vendor else dict(tile=c.tile, schedule=c.schedule, cluster=c.cluster, aux_load=c.aux_load,
                       epi_tile=c.epi_tile, swizzle=c.swizzle, raster=c.raster, combine=c.combine,
                       a_rows=c.a_rows)
            for name, c in configs.items()}


@dataclass
class Case:
    path: str
    sizes: dict
    config_m: int
    program: object        # the rewritten program
    source_program: object
    plan: planner.Plan
    specs: list            # the specs of the kernels epic builds, in plan order
    sources: list[str]     # each one's generated source
    vendor: list = field(default_factory=list)   # gemms on the vendor's library (no source): torch.mm runs them

    def describe(self, seed=None) -> str:
        configs = ", ".join(f"{k} {c.key()}" for k, c in self.plan.configs.items())
        return f"{self.path} sizes {self.sizes} ({configs})" + (f" seed {seed}" if seed is not None else "")

    def with_sources(self, transform) -> "Case":
        """The same case with each source passed through transform(source) (to plant a bug)."""
        return replace(self, sources=[transform(s) for s in self.sources])


def _options_for(program, gemm: str, options: dict | None) -> dict:
    """options for one gemm: combine=tail only where the gemm can take it (epic/plan/tail.py)."""
    options = dict(options or {})
    if options.get("combine") == "tail" and tail.refusal(program, program.kernel(gemm)):
        del options["combine"]
    return options


def prepare(path: str, sizes: dict, config_m: int, options: dict | None = None) -> Case:
    """Plan and generated sources of a program at `sizes` with the configuration the heuristic picks
    for M = config_m (and each gemm's N at `sizes`), changed by `options` (KernelConfig fields, e.g.
    aux_load="direct"). Raises EpicError E702 when code generation does not support the program."""
    prog = compiled(path)
    # the options as the call's overrides: the plan chooses around them (combine=tail, say, leaves out
    # the 1x2 cluster a block statistic takes in the gemm's epilogue)
    changes = {k.name: _options_for(prog.program, k.name, options) for k in prog.program.kernels if k.kind == "gemm"}
    configs = emit.kernel_configs(prog.program, config_m, {n: o for n, o in changes.items() if o} or None, sizes)
    plan = planner.make_plan(prog.program, sizes, overrides(configs))
    assert plan.configs == configs, (plan.configs, configs)
    # A tile finished in place (plan.aliases) gets its own buffer here: the host runs a warp again
    # until its shuffles settle (hostsim.hpp), and a finish that overwrites what it read cannot run
    # twice. tests/test_gpu.py runs it in place; test_plan.py checks the finish reads before it writes.
    plan.aliases = {}
    pairs = emit.units(prog.program, plan.configs)
    return Case(path, dict(sizes), config_m, plan.program, prog.analysis.source_program, plan,
                [spec for spec, _ in pairs], [unit.source for _, unit in pairs],
                [s for s in emit.specs(prog.program, plan.configs) if isinstance(s, vendor.VendorGemmSpec)])


def libraries(case: Case) -> list:
    """(spec, library) of every launched kernel: the sources compiled for the host, after checking
    what runtime/loader.load checks before binding, and the vendor's gemms (runtime/vendor_gemm.py)."""
    built = compiler.build(case.sources)
    for spec, lib in zip(case.specs, built):
        assert lib.info["ptrs"] == [f"{p.role}:{p.tensor}" for p in spec.pointers], (lib.info, spec.pointers)
    return list(zip(case.specs, built)) + [(spec, vendor_gemm.VendorGemm(spec)) for spec in case.vendor]


# ------------------------------------------------------------------------------------------ inputs
def make_inputs(case: Case, seed: int) -> dict:
    """Random inputs (tests/gpu_cases.make_inputs) with every gemm operand that is a program input
    quantized (A to multiples of 1/8, B to multiples of 1/64, both near their random values): their
    products and sums are then exact in f32, so the host's f32 accumulator equals the reference's
    float64 one and results computed from it exactly (integer stores) can be compared exactly."""
    inputs = gpu_cases.make_inputs(case.source_program, case.sizes, seed)
    for k in case.program.kernels:
        if k.kind != "gemm":
            continue
        for name, step in ((k.a, 8.0), (k.b, 64.0)):
            if name in inputs and inputs[name].is_floating_point():
                x = inputs[name]
                inputs[name] = (torch.round(x.double() * step) / step).to(x.dtype)
    return inputs


def _host_tensor(t, x: torch.Tensor) -> torch.Tensor:
    """An input as the kernels read it: row-major, or K-major ([K, N] whose memory is [N, K])."""
    return x.t().contiguous().t() if t.layout == "kmajor" else x.contiguous()


# ------------------------------------------------------------------------------------------ running
def abi_problems(case: Case) -> list[str]:
    """The C ABI of every source, checked by roles (abi.py), and each gemm's tile against the plan's
    (the plan lays out the partials and hands the combine kernels their tile sizes)."""
    problems = []
    for source in case.sources:
        if kind(source) == "gemm":
            src = parse_gemm(source)
            found = abi.gemm_problems(src)
            planned = case.plan.configs[src.info["kernel"]].tile
            if src.tile != tuple(planned):
                found.append(f"built with TileShape {src.tile}, but the plan lays out its buffers for {planned}")
        elif kind(source) == "tail":
            src = parse_tail(source)
            found = abi.tail_problems(src, case.program)
        else:
            src = parse_combine(source)
            found = abi.combine_problems(src, case.program)
        problems += [f"ABI of kernel '{src.info['kernel']}': {p}" for p in found]
    return problems


def run(case: Case, inputs: dict, fill: int | None = None) -> dict[str, torch.Tensor]:
    """Every buffer the plan allocates, after running the case's kernels on the host in order,
    exactly as CompiledProgram.__call__ launches them. Buffers start poisoned (binding.allocate),
    or filled with the byte `fill`."""
    # device -1: torch.cuda.device(-1) is a no-op, so the runtime's bind works without CUDA
    bound = binding.bind(case.plan, libraries(case), -1)
    program = case.program
    buffers = {t.name: _host_tensor(t, inputs[t.name]) for t in program.inputs() if not t.is_scalar}
    scalars = binding.scalar_values([t for t in program.inputs() if t.is_scalar], inputs)   # the runtime's own
    for name, vectors, matrix in derived.specs(program):      # computed from weights, as a call does
        buffers[name] = derived.compute([buffers[v] for v in vectors], buffers[matrix])
    for b in bound.allocations:
        buffers[b.name] = binding.allocate(b, "cpu", poison=True)
        if fill is not None:
            buffers[b.name].reshape(-1).view(torch.uint8).fill_(fill)
    for launch in bound.launches:       # the runtime's own launch path: pointers, scalars, workspace
        launch.run(buffers, scalars, 0, "cpu")
    return {b.name: buffers[b.name] for b in bound.allocations}


def run_compiled(case: Case, inputs: dict, fast) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The case's kernels run through the compiled call path (runtime/fastcall.py, a Launcher
    `fast`) on the host: (every buffer, by keep=True; the outputs, by keep=False). Its buffers are
    not poisoned (at::empty): compare with run()'s."""
    from epic.runtime import fastcall
    bound = binding.bind(case.plan, libraries(case), -1)
    bound.device = torch.device("cpu")
    program = case.program
    names = [t.name for t in program.inputs() if not t.is_scalar]
    scalar_inputs = [t for t in program.inputs() if t.is_scalar]
    host = {n: _host_tensor(program.tensors[n], inputs[n]) for n in names}
    tensors = bound.inputs(host, derived.Cache())        # the input tensors, then the derived tensors
    plan = fastcall.register(fast, bound, tensors)
    values = binding.scalar_values(scalar_inputs, inputs)
    scalars = [values[t.name] for t in scalar_inputs]
    results = []
    for keep in (True, False):
        got, failed, rc, out = fast.run(tensors, scalars, 0, keep)
        assert (got, failed, rc) == (plan, -1, 0), (got, failed, rc)
        results.append(dict(zip(bound.keep if keep else bound.outputs, out)))
    return results[0], results[1]


class _KernelByKernel(dict):
    """The `override` of Interpreter.run that checks kernel by kernel in one run: it hands the
    interpreter the host's value of each tensor a kernel stores -- so every later kernel sees exactly
    what the host kernels saw -- and keeps the reference's own value of that tensor, which the
    interpreter holds when it asks (right after running the kernel that stores it; asserted, so a
    change of that order fails here rather than comparing against the wrong values)."""

    def __init__(self, host: dict, interp: reference.Interpreter):
        super().__init__(host)
        self.interp = interp
        self.taken: dict[str, torch.Tensor] = {}

    def __getitem__(self, name):
        kernel = self.interp.kernel
        assert name in {s.tensor for s in kernel.stores}, f"asked for {name} while running {kernel.name}"
        self.taken[name] = self.interp.store[name].clone()
        return super().__getitem__(name)


def as_reference(t, x: torch.Tensor) -> torch.Tensor:
    """A buffer as the reference interpreter holds the tensor: packed int4 bytes unpacked."""
    if t.dtype is dtypes.E2M1:
        return reference.unpack_e2m1(x)
    return reference.unpack_int4(x) if t.dtype is dtypes.I4 else x


def expected(case: Case, inputs: dict, host: dict) -> dict[str, torch.Tensor]:
    """The reference value of every buffer a kernel writes, given the host's values of everything
    the other kernels wrote (so each kernel is checked on exactly the inputs it saw)."""
    interp = reference.Interpreter(case.program, case.sizes, exact=False, tiles=case.plan.tiles())
    override = _KernelByKernel({name: as_reference(case.program.tensors[name], x) for name, x in host.items()}, interp)
    interp.run(inputs, override=override)
    missing = set(host) - set(override.taken)
    assert not missing, f"the reference interpreter never stored {sorted(missing)}"
    return override.taken


def block_quantized(case: Case) -> set[str]:
    """Tensors that a block-scale node quantizes (its comment: "1x32 block scale -> q, scales s"), and
    tiles a row combine kernel quantizes with a row statistic (both divide by an f32 scale)."""
    out = {s.tensor for k in case.program.kernels if k.kind in ("combine", "tail") for s in k.stores
           if s.value.kind.value == "tile" and (k.kind == "combine" or not case.program.tensors[s.tensor].dtype.is_float
                                                or case.program.tensors[s.tensor].dtype.bits == 8)}
    for source in case.sources:
        if kind(source) == "gemm":
            for node in parse_gemm(source).nodes:
                if node.name == "epic_nodes::Sm90BlockScale" and "->" in node.comment:
                    out.add(node.comment.split("->")[1].split(",")[0].strip())
    return out


def problems(case: Case, inputs: dict) -> list[str]:
    """Everything wrong with the case's kernels on these inputs (empty: they match the reference)."""
    found = abi_problems(case)
    if found:          # a kernel that misuses its pointers would read or write out of bounds here
        return found
    host = run(case, inputs)
    again = run(case, inputs, fill=SECOND_FILL)
    found += [p for name in host if (p := unwritten(name, host[name], again[name]))]
    want = expected(case, inputs, host)
    quantized = block_quantized(case)
    for name, got in host.items():
        t = case.program.tensors[name]
        dtype = "f32" if t.role == "partial" else t.dtype.name
        found += [p for p in [mismatch(name, as_reference(t, got), want[name], dtype, name in quantized)] if p]
    return found


@contextmanager
def one_torch_thread():
    """The tensors here are small: torch's thread pool only costs time (most of it on a busy machine,
    where a pool thread waits for a core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check(case: Case, seed: int, inputs: dict | None = None) -> None:
    """Raise AssertionError (naming the case and seed) if the kernels do not match the reference."""
    with one_torch_thread():
        inputs = make_inputs(case, seed) if inputs is None else inputs
        found = problems(case, inputs)
    if found:
        raise AssertionError(f"{case.describe(seed)}:\n  " + "\n  ".join(found))
