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
        module.Launcher().add(0, -1, [torch.empty(0)], [[4]], [[1]], [], [], [_abs_address()], [[3]], [[1]],
                              [[]], [[]], [0], [], [])


def _abs_address() -> int:
    return ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p).value


def test_a_failed_launch_names_the_launch_and_its_status(module):
    # libc's abs() as a "kernel": it returns |low 32 bits of the pointer array's address| != 0
    fast = module.Launcher()
    x = torch.zeros(4)
    plan = fast.add(0, -1, [x], [[4]], [[1]], [], [], [_abs_address()], [[0]], [[4]], [[]], [[]], [0], [0], [0])
    got, failed, rc, out = fast.run([x], [], 0, False)
    assert (got, failed, out) == (plan, 0, []) and rc != 0


# ---------------------------------------------------------------- the Python side of a call
class _Library:
    def __init__(self):
        self.errors = []

    def launch_error(self, rc):
        self.errors.append(rc)
        return EpicError([])


class _Fake:
    """A Launcher that answers what it is told to, recording its calls."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def run(self, tensors, scalars, stream, keep):
        self.calls.append((tensors, scalars, stream, keep))
        return self.answer


def _program_with_fake(answer):
    import epic
    from epic.runtime import binding
    prog = epic.compile("samples/residual_rmsnorm.epi")
    lib = _Library()
    bound = binding.Bound("cpu", [], [], [], [binding.Launch.__new__(binding.Launch)], ["y"], ["y", "part"], None)
    bound.launches[0].library = lib
    fake = _Fake(answer)
    prog._fast, prog._fast_bound = fake, {4: bound}
    return prog, fake, lib


def _args(prog, **extra):
    return {**{t.name: torch.zeros(2) for t in prog.inputs if not t.is_scalar}, **extra}


def test_the_call_maps_outputs_and_keep_by_the_plan_it_ran():
    a, b = torch.ones(1), torch.zeros(1)
    prog, fake, _ = _program_with_fake((4, -1, 0, [a]))
    out = prog(**_args(prog))
    assert list(out) == ["y"] and out["y"] is a
    assert fake.calls[-1][1:] == ([1e-6], 0, False)            # eps's default
    fake.answer = (4, -1, 0, [a, b])
    args = _args(prog, eps=0.5)
    out = prog(keep=True, **args)
    assert list(out) == ["y", "part"] and out["part"] is b
    tensors, scalars, stream, keep = fake.calls[-1]
    assert scalars == [0.5] and stream == 0 and keep is True
    names = [t.name for t in prog.inputs if not t.is_scalar]
    assert len(tensors) == len(names) and all(t is args[n] for t, n in zip(tensors, names))


def test_a_failed_launch_raises_its_librarys_error():
    prog, fake, lib = _program_with_fake((4, 0, 7, []))
    with pytest.raises(EpicError):
        prog(**_args(prog))
    assert lib.errors == [7]


@pytest.mark.parametrize("how", ["unknown name", "missing tensor", "not a tensor", "bad scalar", "poison"])
def test_what_the_launcher_cannot_take_goes_to_the_python_path(how):
    prog, fake, _ = _program_with_fake((4, -1, 0, []))
    args = _args(prog)
    first = next(iter(args))
    kwargs = {"unknown name": dict(args, zz=torch.zeros(1)), "missing tensor": {k: v for k, v in args.items() if k != first},
              "not a tensor": dict(args, **{first: [1.0, 2.0]}), "bad scalar": dict(args, eps=float("nan")),
              "poison": dict(args, poison=True)}[how]
    with pytest.raises(EpicError) as e:            # the Python path's own diagnostic (E601/E603/E602, E604)
        prog(**kwargs)
    assert e.value.codes[0].startswith("E6")
    assert fake.calls == []


def test_no_plan_goes_to_the_python_path():
    prog, fake, _ = _program_with_fake((-1, -1, 0, []))
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
