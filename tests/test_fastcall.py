"""The compiled call path (epic/runtime/fastcall.py, templates/launcher.cpp), without a GPU.

The launcher is built here as on a GPU machine (g++ and torch's headers) and drives the host
simulator's kernels (tests/hostsim) with CPU tensors: the same plans, bound by the runtime's own
binding.bind, must give the bytes the ctypes path gives, for one-kernel programs, chains with
combine kernels, runtime scalars (defaulted and overridden) and keep=True. Anything that does not
match a bound signature must come back as "no plan", for the Python path to validate. The GPU suite
(tests/test_gpu.py) runs every program through it on the H200.
"""
import ctypes
import hashlib

import pytest
import torch

from epic.diagnostics import EpicError
from epic.runtime import cache, fastcall

from . import hostsim
from .hostsim import harness
from .test_hostsim import prepare


@pytest.fixture(scope="module")
def module():
    """The launcher, built into the session's cache (tests/conftest.py turns it off elsewhere)."""
    hostsim.require_toolchain()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EPIC_LAUNCHER", "compiled")
        mp.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
        fast = fastcall.launcher()
        assert fast is not None, fastcall.why_not()
        yield fastcall._STATE["module"]


CASES = [("samples/residual_rmsnorm.epi", "small_m", (77, 392, 200)),       # partials + combine, eps defaulted
         ("samples/prenorm_mlp.epi", "large_m", (300, 392, 200)),         # a 4-kernel chain
         ("tests/programs/every_primitive.epi", "small_m", (1, 392, 200)),  # scalar alpha overridden below
         ("samples/cross_entropy.epi", "small_m", (77, 392, 200)),
         ("samples/fp8_block_quant.epi", "large_m", (300, 392, 200)),
         ("samples/int4_pack.epi", "small_m", (77, 392, 200))]


@pytest.mark.parametrize("name,config,shape", CASES, ids=[c[0].split("/")[-1] for c in CASES])
def test_launcher_gives_the_bytes_of_the_ctypes_path(module, name, config, shape):
    case = prepare(name, config, shape)
    inputs = harness.make_inputs(case, seed=7)
    if any(t.name == "alpha" for t in case.program.inputs()):
        inputs["alpha"] = -1.75                    # not its default: the value must reach the kernel
    with harness.one_torch_thread():
        want = harness.run(case, inputs)
        kept, outputs = harness.run_compiled(case, inputs, module.Launcher())
    assert set(kept) == set(want)
    for n, x in want.items():
        assert kept[n].dtype == x.dtype and kept[n].shape == x.shape, n
        assert torch.equal(kept[n].view(torch.uint8), x.view(torch.uint8)), f"{n} differs from the ctypes path"
    assert set(outputs) == {t.name for t in case.program.outputs()}
    for n, x in outputs.items():
        assert torch.equal(x.view(torch.uint8), want[n].view(torch.uint8)), n


def test_only_outputs_get_their_own_allocation(module):
    # the 4-kernel chain: y and resid are outputs; n, a, the partials and the combine's row scale
    # are carved from one arena, without overlapping, and the outputs share nothing with it
    case = prepare("samples/prenorm_mlp.epi", "large_m", (300, 392, 200))
    inputs = harness.make_inputs(case, seed=11)
    with harness.one_torch_thread():
        kept, outputs = harness.run_compiled(case, inputs, module.Launcher())
    outs = {t.name for t in case.program.outputs()}
    inner = {n: x for n, x in kept.items() if n not in outs}
    assert len(inner) >= 4, sorted(inner)
    arena = {x.untyped_storage().data_ptr() for x in inner.values()}
    assert len(arena) == 1, "the intermediates are not one allocation"
    spans = sorted((x.data_ptr(), x.data_ptr() + x.numel() * x.element_size(), n) for n, x in inner.items())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        assert end <= start, f"{a} and {b} overlap in the arena"
    base = arena.pop()                # offsets from the arena's start (the CPU allocator aligns it to 64 only)
    assert all((x.data_ptr() - base) % 256 == 0 for x in inner.values())
    own = [kept[n].untyped_storage().data_ptr() for n in outs]       # the same call's outputs
    assert len(set(own)) == len(own) == 2 and base not in own, "an output shares its memory"
    assert set(outputs) == outs


def test_a_changed_scalar_reaches_the_kernel(module):
    case = prepare("tests/programs/every_primitive.epi", "small_m", (1, 392, 200))
    inputs = harness.make_inputs(case, seed=3)
    fast = module.Launcher()
    with harness.one_torch_thread():
        _, a = harness.run_compiled(case, dict(inputs, alpha=0.25), fast)
        _, b = harness.run_compiled(case, dict(inputs, alpha=4.0), fast)
    assert any(not torch.equal(a[n], b[n]) for n in a)


def _registered(module, name="samples/residual_rmsnorm.epi", shape=(77, 392, 200)):
    case = prepare(name, "small_m", shape)
    inputs = harness.make_inputs(case, seed=5)
    fast = module.Launcher()
    with harness.one_torch_thread():
        harness.run_compiled(case, inputs, fast)
    names = [t.name for t in case.program.inputs() if not t.is_scalar]
    tensors = [harness._host_tensor(case.program.tensors[n], inputs[n]) for n in names]
    return case, fast, tensors


def test_anything_but_the_bound_signature_is_no_plan(module):
    case, fast, tensors = _registered(module)
    scalars = [1e-6]
    assert fast.run(tensors, scalars, 0, False)[0] == 0
    x = tensors[0]
    changed = {
        "fewer tensors": tensors[:-1],
        "another dtype": [x.float(), *tensors[1:]],
        "another shape": [x[:-1].contiguous(), *tensors[1:]],
        "other strides": [x.t().contiguous().t(), *tensors[1:]],
        "misaligned": [torch.empty(x.numel() + 8, dtype=x.dtype)[1:x.numel() + 1].view(x.shape), *tensors[1:]],
    }
    for what, args in changed.items():
        assert fast.run(args, scalars, 0, False)[0] == -1, what
    with pytest.raises(TypeError):
        fast.run([None, *tensors[1:]], scalars, 0, False)


def test_several_signatures_and_the_newest_eight(module):
    case, fast, tensors = _registered(module)
    sizes = [(m, 392, 200) for m in (1, 2, 3, 5, 8, 13, 21, 34, 55)]
    for shape in sizes:
        other = prepare("samples/residual_rmsnorm.epi", "small_m", shape)
        with harness.one_torch_thread():
            harness.run_compiled(other, harness.make_inputs(other, seed=1), fast)
    assert len(fast) == 8                             # the first (M = 77) and M = 1 were dropped
    assert fast.run(tensors, [1e-6], 0, False)[0] == -1


def test_a_plan_that_points_outside_its_table_is_refused(module):
    with pytest.raises(RuntimeError, match="outside the table"):
        module.Launcher().add(0, -1, [torch.empty(0)], [[4]], [[1]], [], [], [], [_abs_address()], [[3]], [[1]],
                              [[]], [[]], [0], [-1], 0, [], [], [[]])


def test_an_arena_offset_outside_the_arena_is_refused(module):
    # the table's layout is the Executable's (runtime/executable.py): the launcher checks it, never makes one
    y = [torch.empty(0, dtype=torch.float16)]
    for offset, arena in ((16, 16), (8, 64), (-2, 64)):           # past the end, misaligned, nonsense
        with pytest.raises(RuntimeError, match="arena"):
            module.Launcher().add(0, -1, [torch.empty(0)], [[4]], [[1]], y, [[2, 3]], [offset], [], [], [], [],
                                  [], [], [], arena, [], [], [])
    for offset, arena in ((0, 32), (-1, 64)):                      # past the end, not placed at all
        with pytest.raises(RuntimeError, match="arena"):
            module.Launcher().add(0, -1, [torch.empty(0)], [[4]], [[1]], [], [], [], [_abs_address()], [[0]], [[1]],
                                  [[]], [[]], [64], [offset], arena, [], [], [[]])


def test_a_malformed_vendor_gemm_launch_is_refused(module):
    """A vendor gemm (runtime/vendor_gemm.py) has no launch function, two transposes and slots A, B,
    [C,] D, none empty: anything else is refused when the plan is added."""
    x = [torch.empty(0)] * 3
    shapes, strides = [[4, 4]] * 3, [[4, 1]] * 3
    for fn, slots, vendor in ((_abs_address(), [0, 1, 2], [0, 0]),   # a launch function too
                              (0, [0, 1], [0, 0]),                    # too few slots
                              (0, [0, -1, 2], [0, 0]),                # an empty slot
                              (0, [0, 1, 2], [0])):                   # one transpose
        with pytest.raises(RuntimeError, match="vendor gemm"):
            module.Launcher().add(0, -1, x, shapes, strides, [], [], [], [fn], [slots], [[4, 4, 4]], [[]], [[]],
                                  [0], [-1], 0, [2], [2], [vendor])
    with pytest.raises(RuntimeError, match="null launch function"):
        module.Launcher().add(0, -1, x, shapes, strides, [], [], [], [0], [[0, 1, 2]], [[4, 4, 4]], [[]], [[]],
                              [0], [-1], 0, [2], [2], [[]])


def _abs_address() -> int:
    return ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value


def test_a_failed_launch_names_the_launch_and_its_status(module):
    # libc's abs() as a "kernel": it returns |low 32 bits of the pointer array's address| != 0
    fast = module.Launcher()
    x = torch.zeros(4)
    plan = fast.add(0, -1, [x], [[4]], [[1]], [], [], [], [_abs_address()], [[0]], [[4]], [[]], [[]], [0], [-1], 0,
                    [0], [0], [[]])
    got, failed, rc, out = fast.run([x], [], 0, False)
    assert (got, failed, out) == (plan, 0, []) and rc != 0


# ---------------------------------------------------------------- call(): the caller's keywords as they are
def _bound_for_call(module, name, shape, seed=5):
    """A Launcher with the case's plan registered and its names given, as CompiledProgram does it,
    and the case's keyword arguments (tensors on the host, scalars left out)."""
    case = prepare(name, "small_m", shape)
    inputs = harness.make_inputs(case, seed=seed)
    fast = module.Launcher()
    with harness.one_torch_thread():
        harness.run_compiled(case, inputs, fast)
    program = case.program
    scalars = [t for t in program.inputs() if t.is_scalar]
    fast.names([t.name for t in program.inputs() if not t.is_scalar], [t.name for t in scalars],
               [float(t.default) if t.default is not None else float("nan") for t in scalars])
    kwargs = {t.name: harness._host_tensor(program.tensors[t.name], inputs[t.name])
              for t in program.inputs() if not t.is_scalar}
    return case, fast, kwargs


@pytest.mark.parametrize("name", ["samples/residual_rmsnorm.epi", "tests/programs/every_primitive.epi"])
def test_call_gives_what_run_gives_by_name(module, name):
    case, fast, kwargs = _bound_for_call(module, name, (77, 392, 200))
    scalars = {t.name: 0.75 for t in case.program.inputs() if t.is_scalar}   # not their defaults
    names = [t.name for t in case.program.inputs() if not t.is_scalar]
    with harness.one_torch_thread():
        for keep in (False, True):
            got = fast.call({**kwargs, **scalars}, keep)
            want = fast.run([kwargs[n] for n in names], list(scalars.values()), 0, keep)
            assert want[1:3] == (-1, 0)
            assert type(got) is dict and len(got) == len(want[3])
            for (n, x), y in zip(got.items(), want[3]):
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), n
            expected = {t.name for t in case.program.outputs()}
            assert expected <= set(got) if keep else set(got) == expected


def test_call_defaults_a_left_out_scalar_and_takes_ints(module):
    case, fast, kwargs = _bound_for_call(module, "tests/programs/every_primitive.epi", (1, 392, 200))
    (alpha,) = [t for t in case.program.inputs() if t.is_scalar and t.name == "alpha"]
    others = {t.name: float(t.default) for t in case.program.inputs() if t.is_scalar and t.name != "alpha"}
    with harness.one_torch_thread():
        as_int = fast.call({**kwargs, **others, "alpha": 2}, False)
        as_float = fast.call({**kwargs, **others, "alpha": 2.0}, False)
        other = fast.call({**kwargs, **others, "alpha": -3.5}, False)
        if alpha.default is not None:
            left_out = fast.call({**kwargs, **others}, False)
            given = fast.call({**kwargs, **others, "alpha": float(alpha.default)}, False)
            assert all(torch.equal(left_out[n], given[n]) for n in given)
        as_tensor = fast.call({**kwargs, **others, "alpha": torch.tensor(2.0, dtype=torch.float64)}, False)
    assert all(torch.equal(as_int[n], as_float[n]) for n in as_float)
    assert all(torch.equal(as_tensor[n], as_float[n]) for n in as_float)
    assert any(not torch.equal(as_float[n], other[n]) for n in other)


def test_call_leaves_anything_it_cannot_take_to_python(module):
    case, fast, kwargs = _bound_for_call(module, "samples/residual_rmsnorm.epi", (77, 392, 200))
    assert type(fast.call(kwargs, False)) is dict
    first = next(iter(kwargs))
    x = kwargs[first]
    cases = {
        "unknown name": dict(kwargs, zz=torch.zeros(1)),
        "missing tensor": {k: v for k, v in kwargs.items() if k != first},
        "not a tensor": dict(kwargs, **{first: [1.0, 2.0]}),
        "nan scalar": dict(kwargs, eps=float("nan")),
        "inf scalar": dict(kwargs, eps=float("inf")),
        "bool scalar": dict(kwargs, eps=True),
        "bool tensor scalar": dict(kwargs, eps=torch.tensor(True)),
        "two-number scalar": dict(kwargs, eps=torch.tensor([0.5, 0.5])),
        "meta scalar": dict(kwargs, eps=torch.empty((), device="meta")),
        "int beyond double": dict(kwargs, eps=10 ** 400),
        "another shape": dict(kwargs, **{first: x[:-1].contiguous()}),
        "misaligned": dict(kwargs, **{first: torch.empty(x.numel() + 8, dtype=x.dtype)[1:x.numel() + 1].view(x.shape)}),
    }
    # tensors whose sizes, strides or data pointer throw: sparse, nested, vmap's batched (no storage)
    cases["sparse"] = dict(kwargs, **{first: x.to_sparse()})
    cases["nested"] = dict(kwargs, **{first: torch.nested.nested_tensor([x[0], x[1]])})
    for what, args in cases.items():
        assert fast.call(args, False) is None, what
    seen = []

    def under_vmap(xb):
        seen.append(fast.call(dict(kwargs, **{first: xb}), False))
        return xb
    torch.func.vmap(under_vmap)(x.unsqueeze(0))
    assert seen == [None]
    nameless = module.Launcher()                      # registered plans, but never told the names
    assert nameless.call(kwargs, False) is None


def test_call_leaves_a_missing_required_scalar_to_python(module):
    fast = module.Launcher()
    x = torch.zeros(4)
    plan = fast.add(0, -1, [x], [[4]], [[1]], [torch.empty(0, dtype=torch.float16)], [[2, 3]], [-1],
                    [], [], [], [], [], [], [], 0, [1], [0, 1], [])   # no launches: y is a fresh buffer
    fast.names(["x"], ["s"], [float("nan")])           # s has no default
    fast.label(plan, ["y"], ["x", "y"])
    assert fast.call({"x": x}, False) is None
    out = fast.call({"x": x, "s": 1.0}, False)
    assert list(out) == ["y"] and out["y"].shape == (2, 3) and out["y"].dtype == torch.float16
    kept = fast.call({"x": x, "s": 1.0}, True)
    assert list(kept) == ["x", "y"] and kept["x"] is x


def test_call_reports_a_failed_launch_by_plan_and_status(module):
    fast = module.Launcher()
    x = torch.zeros(4)
    plan = fast.add(0, -1, [x], [[4]], [[1]], [], [], [], [_abs_address()], [[0]], [[4]], [[]], [[]], [0], [-1], 0,
                    [0], [0], [[]])
    fast.names(["x"], [], [])
    fast.label(plan, ["x"], ["x"])
    got, failed, rc = fast.call({"x": x}, False)
    assert (got, failed) == (plan, 0) and rc != 0


def test_labels_must_fit_their_plan(module):
    fast = module.Launcher()
    x = torch.zeros(4)
    plan = fast.add(0, -1, [x], [[4]], [[1]], [], [], [], [], [], [], [], [], [], [], 0, [0], [0], [])
    with pytest.raises(RuntimeError, match="another plan"):
        fast.label(plan, ["x", "y"], ["x"])
    with pytest.raises(RuntimeError, match="no plan"):
        fast.label(plan + 1, ["x"], ["x"])
    with pytest.raises(RuntimeError):
        fast.names(["x"], ["s"], [])


# ---------------------------------------------------------------- the Python side of a call
class _Library:
    def __init__(self):
        self.errors = []

    def launch_error(self, rc):
        self.errors.append(rc)
        return EpicError([])


class _Fake:
    """A Launcher whose call() answers what it is told to, recording its calls."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def call(self, args, keep):
        self.calls.append((args, keep))
        return self.answer


def _program_with_fake(answer):
    import epic
    from epic.runtime import executable
    prog = epic.compile("samples/residual_rmsnorm.epi")
    lib = _Library()
    bound = executable.Executable("cpu", [], [], [], [], [executable.Launch(lib, [], [], [], 0)], ["y"],
                                  ["y", "part"], None)
    fake = _Fake(answer)
    prog._fast, prog._fast_bound = fake, {4: bound}
    return prog, fake, lib


def _args(prog, **extra):
    return {**{t.name: torch.zeros(2) for t in prog.inputs if not t.is_scalar}, **extra}


def test_the_call_hands_its_keywords_over_and_returns_the_answer():
    a = torch.ones(1)
    prog, fake, _ = _program_with_fake({"y": a})
    args = _args(prog, eps=0.5)
    out = prog(keep=True, **args)
    assert out == {"y": a}
    given, keep = fake.calls[-1]
    assert given == args and keep is True


def test_a_failed_launch_raises_its_librarys_error():
    prog, fake, lib = _program_with_fake((4, 0, 7))
    with pytest.raises(EpicError):
        prog(**_args(prog))
    assert lib.errors == [7]


def test_keep_reaches_the_launcher_as_a_bool():
    prog, fake, _ = _program_with_fake({"y": torch.ones(1)})
    prog(keep=1, **_args(prog))
    prog(keep=[], **_args(prog))
    assert [keep for _, keep in fake.calls] == [True, False]


def test_poison_never_reaches_the_launcher():
    prog, fake, _ = _program_with_fake({"y": torch.ones(1)})
    with pytest.raises(EpicError) as e:            # CPU tensors: the Python path refuses them (E604)
        prog(poison=True, **_args(prog))
    assert e.value.codes[0].startswith("E6") and fake.calls == []


def test_what_the_launcher_leaves_goes_to_the_python_path():
    prog, fake, _ = _program_with_fake(None)
    with pytest.raises(EpicError) as e:             # CPU tensors: the Python path refuses them (E604)
        prog(**_args(prog))
    assert len(fake.calls) == 1 and e.value.codes[0].startswith("E6")


# ---------------------------------------------------------------- building and the cache
def test_the_launcher_is_a_sound_cache_entry(module):
    target = fastcall.library()
    assert target == fastcall.library_path(fastcall.compiler())
    assert cache.problem(target) is None
    report = cache.scan()
    assert target in report.entries and target not in [b for b, _ in report.bad]
    assert cache.read_manifest(target)["kind"] == "launcher"


def test_a_damaged_launcher_is_never_loaded(module, tmp_path, monkeypatch):
    # a truncated library whose manifest matches it: dlopen of it could kill the process (SIGBUS)
    monkeypatch.setenv("EPIC_CACHE_DIR", str(tmp_path))
    target = fastcall.library_path(fastcall.compiler())
    target.parent.mkdir(parents=True)
    data = b"\x7fELF" + b"\0" * 60
    target.write_bytes(data)
    cache.manifest_path(target).write_text(
        '{"library": "%s", "key": "%s", "size": %d, "sha256": "%s", "kind": "launcher"}'
        % (target.name, target.parent.name, len(data), hashlib.sha256(data).hexdigest()))
    assert cache.problem(target) is not None
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
    monkeypatch.setenv("EPIC_NO_BUILD", "1")
    with pytest.warns(RuntimeWarning, match="EPIC_NO_BUILD"):
        assert fastcall.launcher() is None


def test_epic_launcher_ctypes_turns_it_off_and_nonsense_is_e706(monkeypatch):
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
    monkeypatch.setenv("EPIC_LAUNCHER", "ctypes")
    assert fastcall.launcher() is None and fastcall.why_not() == "EPIC_LAUNCHER=ctypes"
    monkeypatch.setenv("EPIC_LAUNCHER", "fast please")
    with pytest.raises(EpicError) as e:
        fastcall.mode()
    assert e.value.codes == ["E706"]


def test_without_a_compiler_calls_warn_once_and_take_the_ctypes_path(monkeypatch):
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.warns(RuntimeWarning, match="ctypes path: no C\\+\\+ compiler"):
        assert fastcall.launcher() is None
    assert fastcall.launcher() is None               # no second warning (pytest.warns would not mind;
    assert "compiler" in fastcall.why_not()          # the state says it was decided once)


def test_epic_build_reports_the_launcher(monkeypatch, capsys, tmp_path):
    from epic_cli import commands
    monkeypatch.setattr(fastcall, "library", lambda: tmp_path / "epic_launcher.so")
    commands._build_launcher()
    assert capsys.readouterr().out == f"built {tmp_path / 'epic_launcher.so'} (the compiled call path)\n"
    monkeypatch.setattr(fastcall, "library", lambda: None)
    monkeypatch.setattr(fastcall, "why_not", lambda: "no C++ compiler to build the launcher (set CXX)")
    commands._build_launcher()
    err = capsys.readouterr().err
    assert err == "epic: note: calls will take the ctypes path: no C++ compiler to build the launcher (set CXX)\n"
    monkeypatch.setattr(fastcall, "why_not", lambda: "EPIC_LAUNCHER=ctypes")
    commands._build_launcher()
    assert capsys.readouterr() == ("", "")


# ---------------------------------------------------------------- a call never waits for the compiler
class _SlowModule:
    """A launcher module whose 'build' (fastcall._load) waits until the test lets it finish."""

    class Launcher:
        def names(self, *a):
            self.named = a

    ABI = fastcall.ABI


@pytest.fixture
def slow_build(monkeypatch):
    import threading
    monkeypatch.setattr(fastcall, "_STATE", {"module": None, "why": None, "path": None})
    monkeypatch.setattr(fastcall, "_BUILDER", {"thread": None})
    monkeypatch.setenv("EPIC_LAUNCHER", "compiled")
    monkeypatch.setattr(fastcall, "_must_compile", lambda: True)
    release, started = threading.Event(), threading.Event()
    outcome = {"fail": None, "loads": 0}

    def load():
        outcome["loads"] += 1
        started.set()
        assert release.wait(30)
        if outcome["fail"]:
            raise fastcall._Unavailable(outcome["fail"])
        return _SlowModule

    monkeypatch.setattr(fastcall, "_load", load)
    yield release, started, outcome
    release.set()
    if fastcall._BUILDER["thread"] is not None:
        fastcall._BUILDER["thread"].join(30)


def test_while_the_launcher_builds_calls_get_none_and_later_a_launcher(slow_build):
    release, started, outcome = slow_build
    assert fastcall.launcher(["x"], [], wait=False) is None      # returns at once, the build started
    assert started.wait(30) and fastcall.building()
    assert fastcall.launcher(["x"], [], wait=False) is None and fastcall.why_not() is None
    release.set()
    fastcall._BUILDER["thread"].join(30)
    assert not fastcall.building()
    fast = fastcall.launcher(["x"], [], wait=False)
    assert isinstance(fast, _SlowModule.Launcher) and fast.named[0] == ["x"]
    assert outcome["loads"] == 1                                  # one build, not one per call


def test_a_failed_background_build_leaves_the_ctypes_path_with_its_reason(slow_build):
    release, started, outcome = slow_build
    outcome["fail"] = "building the launcher failed (exit status 1)"
    fastcall.start()
    assert started.wait(30)
    with pytest.warns(RuntimeWarning, match="ctypes path: building the launcher failed"):
        release.set()
        fastcall._BUILDER["thread"].join(30)
    assert fastcall.launcher(wait=False) is None and "failed" in fastcall.why_not()


def test_library_waits_for_the_background_build(slow_build):
    import threading
    release, started, outcome = slow_build
    fastcall.start()
    assert started.wait(30)
    threading.Timer(0.2, release.set).start()
    assert fastcall._module() is _SlowModule                      # blocks on the build's lock, then has it
    assert outcome["loads"] == 1                                  # the background build's, not a second one


def test_a_signature_bound_during_the_build_is_registered_once_it_is_done(monkeypatch):
    """The program's first call (CUDA) binds while the launcher builds: it takes the ctypes path and keeps
    the Executable with meta tensors; the first call after the build registers it and takes the launcher."""
    prog, fake, _ = _program_with_fake({"y": torch.ones(1)})
    bound = prog._fast_bound[4]
    prog._fast, prog._fast_bound = None, {}
    state = {"building": True}
    registered = []
    monkeypatch.setattr(fastcall, "building", lambda: state["building"])
    monkeypatch.setattr(fastcall, "why_not", lambda: None)
    monkeypatch.setattr(fastcall, "launcher", lambda *a, wait=True: None if state["building"] else fake)
    monkeypatch.setattr(fastcall, "register", lambda f, exe, ts: registered.append((f, exe, ts)) or 9)
    x = torch.zeros(3, 5)[:, 1:]                                   # strided: the layout must survive
    prog._register_fast(bound, [x])
    assert prog._fast is None and registered == []
    [(exe, metas)] = prog._fast_pending
    assert exe is bound and metas[0].device.type == "meta"
    assert (metas[0].shape, metas[0].stride(), metas[0].dtype) == (x.shape, x.stride(), x.dtype)
    with pytest.raises(EpicError):                    # still building: the Python path (which refuses CPU tensors)
        prog(**_args(prog))
    assert fake.calls == [] and prog._fast_pending
    state["building"] = False
    assert prog(**_args(prog)) == {"y": fake.answer["y"]}         # now the launcher takes the call
    assert registered == [(fake, bound, metas)] and prog._fast_bound == {9: bound}
    assert prog._fast_pending == [] and id(bound) in prog._fast_ids


def test_a_signature_bound_when_the_launcher_is_refused_is_not_kept(monkeypatch):
    prog, _, _ = _program_with_fake(None)
    bound = prog._fast_bound[4]
    prog._fast = None
    monkeypatch.setattr(fastcall, "launcher", lambda *a, wait=True: None)
    monkeypatch.setattr(fastcall, "why_not", lambda: "no C++ compiler to build the launcher (set CXX)")
    prog._register_fast(bound, [torch.zeros(2)])
    assert prog._fast is None and prog._fast_pending == []


def test_a_child_forked_during_the_build_neither_waits_for_it_nor_forgets_to_build(slow_build):
    import os
    release, started, _ = slow_build
    fastcall.start()
    assert started.wait(30) and fastcall._LOCK.locked()          # the build holds the lock
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                                  # the child: its own lock, no build running
        ok = not fastcall._LOCK.locked() and fastcall._BUILDER["thread"] is None and not fastcall.building()
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
