"""The Executable (epic/runtime/executable.py): one launch table and buffer layout per call signature,
which the ctypes path and the compiled launcher both run. Expectations come from the programs' text:
what the gemms store, their dtypes and the sizes of the call."""
import pytest
import torch

import epic
from epic.runtime import binding, compiled, derived, executable, fastcall

from . import hostsim
from .hostsim import harness
from .test_hostsim import prepare

# two gemms; the first stores t, which only the second reads
CHAIN = """
gemm up(x: bf16[M, D] @ w1: bf16[D, F]) {
  tmp t: bf16 = acc
}
gemm down(t @ w2: bf16[F, D]) {
  out y: bf16 = acc
}
"""
# the same with an RMSNorm between them: its row scale needs whole rows, so a combine kernel runs
NORMED = """
gemm up(x: bf16[M, D] @ w1: bf16[D, F]) {
  in gamma: bf16[F]
  tmp t: bf16 = rmsnorm(acc, gamma, 1e-6)
}
gemm down(t @ w2: bf16[F, D]) {
  out y: bf16 = acc
}
"""
SIZES = dict(M=77, D=64, F=96)


class _Library:
    """A kernel library that is never launched here: only its workspace is asked for."""

    def __init__(self, kernel: str, workspace: int):
        self.kernel, self.workspace = kernel, workspace

    def workspace_size(self, dims):
        return self.workspace


def _bound(text: str, workspaces: dict[str, int] | None = None) -> executable.Executable:
    case = harness.prepare(text, SIZES, 64)
    libs = [_Library(spec.name, (workspaces or {}).get(spec.name, 0)) for spec in case.specs]
    return binding.bind(case.plan, list(zip(case.specs, libs)), -1)


def test_a_two_gemm_chain_has_two_launches_and_its_tmp_in_the_arena():
    exe = _bound(CHAIN, {"up": 100})
    assert [l.library.kernel for l in exe.launches] == ["up", "down"]
    assert "t" in exe.launches[0].pointer_tensors and {"t", "y"} <= set(exe.launches[1].pointer_tensors)
    assert exe.names == ["x", "w1", "w2", "t", "y"]
    offsets = dict(zip([b.name for b in exe.allocations], exe.offsets))
    assert offsets == {"t": 0, "y": -1}                          # y is an output: its own allocation
    t_bytes = 77 * 96 * 2                                        # [M, F] bf16
    assert [executable.nbytes(b) for b in exe.allocations] == [t_bytes, 77 * 64 * 2]
    ws = exe.launches[0]
    assert ws.workspace == 100 and ws.workspace_offset == -(-t_bytes // 256) * 256      # after t, 256-aligned
    assert exe.launches[1].workspace_offset == -1
    assert exe.arena == ws.workspace_offset + 100


def test_an_rmsnorm_chain_has_two_gemms_and_the_first_ones_tail():
    exe = _bound(NORMED)
    kinds = {k.name: k.kind for k in exe.plan.program.kernels}
    # at M = 77 the first gemm stores its accumulator and its tail kernel finds the row statistic (plan/tail.py)
    assert [kinds[l.library.kernel] for l in exe.launches] == ["gemm", "tail", "gemm"]
    inner = [(b, o) for b, o in zip(exe.allocations, exe.offsets) if b.name != "y"]
    (t,) = [b for b in exe.allocations if b.name == "t"]
    assert ("t", 0) in [(b.name, o) for b, o in inner] and executable.nbytes(t) == 77 * 96 * 2     # [M, F] bf16
    assert all(o >= 0 and o % 256 == 0 for _, o in inner)       # everything but the output in the arena
    spans = sorted((o, o + executable.nbytes(b)) for b, o in inner)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    assert exe.arena == spans[-1][1]
    assert dict(zip([b.name for b in exe.allocations], exe.offsets))["y"] == -1


# ---------------------------------------------------------------- both paths, one Executable
@pytest.fixture(scope="module")
def launcher_module():
    hostsim.require_toolchain()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EPIC_LAUNCHER", "compiled")
        mp.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
        assert fastcall.launcher() is not None, fastcall.why_not()
        yield fastcall._STATE["module"]


class _Spy:
    """A Launcher that counts the calls it takes (and passes them on)."""

    def __init__(self, fast):
        self.fast, self.runs, self.calls = fast, 0, 0

    def run(self, *a):
        self.runs += 1
        return self.fast.run(*a)

    def call(self, *a):
        self.calls += 1
        return self.fast.call(*a)

    def __getattr__(self, name):
        return getattr(self.fast, name)


def _host_case(name, shape=(77, 392, 200)):
    case = prepare(name, "small_m", shape)
    exe = binding.bind(case.plan, list(zip(case.specs, hostsim.compiler.build(case.sources))), -1)
    exe.device = torch.device("cpu")
    inputs = harness.make_inputs(case, seed=9)
    args = {t.name: harness._host_tensor(t, inputs[t.name]) if not t.is_scalar else inputs[t.name]
            for t in case.program.inputs() if t.name in inputs}
    return case, exe, args


def _same_bytes(a: dict, b: dict):
    assert set(a) == set(b)
    for n in a:
        assert a[n].shape == b[n].shape and torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)), n


@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "tests/programs/layernorm_chain.epi"])
def test_both_paths_run_the_same_executable(launcher_module, name):
    case, exe, args = _host_case(name)
    scalars = binding.scalar_values([t for t in case.program.inputs() if t.is_scalar], args)
    cache = derived.Cache()
    spy = _Spy(launcher_module.Launcher())
    with harness.one_torch_thread():
        fastcall.register(spy, exe, exe.inputs(args, cache))
        by_ctypes = exe.run(args, scalars, 0, cache, keep=True, poison_buffers=True)
        assert spy.runs == 0
        by_launcher = exe.run(args, scalars, 0, cache, keep=True, launcher=spy)
        assert spy.runs == 1
        outputs = exe.run(args, scalars, 0, cache, launcher=spy)
    _same_bytes(by_ctypes, by_launcher)
    assert set(outputs) == {t.name for t in case.program.outputs()}
    # both lay the intermediates out in one arena, at the Executable's offsets
    for got in (by_ctypes, by_launcher):
        inner = {n: got[n] for n, o in zip([b.name for b in exe.allocations], exe.offsets) if o >= 0}
        bases = {x.untyped_storage().data_ptr() for x in inner.values()}
        assert len(bases) == 1
        base = bases.pop()
        assert {n: x.data_ptr() - base for n, x in inner.items()} == \
            {b.name: o for b, o in zip(exe.allocations, exe.offsets) if o >= 0}


def test_a_derived_program_runs_its_host_step_before_the_launcher(launcher_module):
    case, exe, args = _host_case("tests/programs/layernorm_chain.epi")
    assert [d[0] for d in exe.derived] == [n for n in exe.names if n.endswith(("derived0", "derived1"))]
    cache = derived.Cache()
    tensors = exe.inputs(args, cache)
    assert len(tensors) == len(exe.tensor_names) + 2 and len(cache) == 2
    for (name, vectors, matrix), x in zip(exe.derived, tensors[len(exe.tensor_names):]):
        assert torch.equal(x, derived.compute([args[v] for v in vectors], args[matrix])), name


# ---------------------------------------------------------------- CompiledProgram: one Executable per signature
@pytest.fixture
def on_the_host(monkeypatch):
    """CompiledProgram on this machine: validation without the CUDA check, kernels bound from the host
    simulator's libraries (as _bind would bind the built ones), stream 0. Counts the binds."""
    hostsim.require_toolchain()
    real = compiled.validate
    binds = []

    def validate(program, args):
        return real(program, args, cuda=False)

    def bind(self, sizes, device):
        binds.append(dict(sizes))
        case = harness.prepare(self._host_path, sizes, 64)
        exe = binding.bind(case.plan, list(zip(case.specs, hostsim.compiler.build(case.sources))), -1)
        exe.device = device
        return exe

    monkeypatch.setattr(compiled, "validate", validate)
    monkeypatch.setattr(compiled.CompiledProgram, "_bind", bind)
    monkeypatch.setattr(compiled, "_current_stream", lambda device: 0)
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    return binds


def _program(path: str):
    prog = epic.compile(path)
    prog._host_path = path
    return prog


@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "tests/programs/layernorm_chain.epi"])
def test_the_same_shapes_get_the_same_executable(on_the_host, name):
    binds = on_the_host
    case, _, args = _host_case(name)
    prog = _program(case.path)
    with harness.one_torch_thread():
        first = prog(**args)
        again = prog(**args)
        exe = prog._choose(args)
        assert prog._choose(dict(args)) is exe and len(binds) == 1
        other = {k: (v[:5].contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2
                     and v.shape[0] == args[next(iter(args))].shape[0] else v) for k, v in args.items()}
        prog(**other)
    _same_bytes(first, again)
    assert len(binds) == 2 and prog._choose(other) is not exe


@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "tests/programs/layernorm_chain.epi"])
def test_a_registered_executable_runs_in_the_launcher(on_the_host, launcher_module, monkeypatch, name):
    # the executable a call bound, handed to the compiled launcher as _choose does on a GPU; programs
    # with derived tensors included (their host step runs first, then the launcher runs the table)
    monkeypatch.setenv("EPIC_LAUNCHER", "compiled")
    case, _, args = _host_case(name)
    prog = _program(case.path)
    with harness.one_torch_thread():
        by_ctypes = prog(keep=True, poison=True, **args)
        exe = prog._choose(args)
        spy = prog._fast = _Spy(launcher_module.Launcher())
        spy.names(prog._tensor_names, [t.name for t in prog._scalar_inputs],
                  [float(t.default) if t.default is not None else float("nan") for t in prog._scalar_inputs])
        prog._register_fast(exe, exe.inputs(args, prog._derived))
        by_launcher = prog(keep=True, **args)
    assert spy.runs + spy.calls >= 1
    assert (spy.runs == 1) == bool(exe.derived)        # derived tensors: Python's host step, then run()
    _same_bytes(by_ctypes, by_launcher)
