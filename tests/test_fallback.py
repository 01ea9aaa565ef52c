"""The unfused torch form of a program (runtime/unfused.py) and the fallback policy that runs it:
its outputs against the reference interpreter (float64, every store rounded) and as the caller
receives them from the kernels (dtypes, packed int4), the compiled (traced + torch.compile) form, the
tuner's record of it, `epic plan --tuned`, and fallback="auto" choosing from the database. All on the
CPU; tests/test_gpu.py runs the eager form against the kernels on the H200."""
import json

import pytest
import torch

import epic
from epic import reference
from epic.diagnostics import EpicError
from epic.runtime import compiled as compiled_mod
from epic.runtime import tuning_db as database
from epic.tuning import tuner

from .conftest import ROOT
from .gpu_cases import PROGRAMS, make_inputs

CASES = ["samples/residual_rmsnorm.epi", "samples/int4_pack.epi", "samples/cross_entropy.epi",
         "samples/prenorm_mlp.epi", "samples/qk_norm_rope.epi", "tests/programs/whole_tensor.epi",
         "samples/fp8_delayed_scaling.epi", "samples/w8a8.epi"]


def _inputs(name, m=77, n=256, k=128, seed=1):
    prog = epic.compile(str(ROOT / name), fallback="eager")
    src = prog.analysis.source_program
    sizes = PROGRAMS[name](m, n, k)
    inputs = make_inputs(src, sizes, seed=seed)
    args = {n_: (x.t().contiguous().t() if src.tensors[n_].layout == "kmajor" else x) for n_, x in inputs.items()}
    return prog, src, sizes, inputs, args


def _close(name, got, want, dtype, chain=False):
    """f32 math against float64: 1e-5 relative to the output's size; one step of a 16/8-bit type. In a
    chain (chain=True), an intermediate stored in bf16 can round one step apart at a tie and carry it
    through the next gemm: 2^-7 of the output's size."""
    scale = want.abs().max().item() + 1e-30
    step = {"bf16": 2 ** -7, "f16": 2 ** -10, "e4m3": 2 ** -3, "e5m2": 2 ** -2}.get(dtype, 1e-5)
    bad = (got - want).abs() > step * want.abs() + (2 ** -7 if chain else 1e-5) * scale
    assert not bad.any(), f"{name}: {int(bad.sum())} elements off, max {(got - want).abs().max().item():.3g}"


@pytest.mark.parametrize("name", CASES)
def test_the_eager_form_computes_what_the_program_means(name):
    prog, src, sizes, inputs, args = _inputs(name)
    out = prog(**args)
    want = reference.Interpreter(src, sizes, exact=False).run(inputs)
    assert set(out) == {t.name for t in src.outputs()}
    for t in src.outputs():
        got, w = out[t.name], want[t.name]
        if t.dtype.name == "i4":       # as the kernels return it: packed uint8 [M, N/2]
            assert got.dtype == torch.uint8 and got.shape[-1] * 2 == w.shape[-1]
            got = reference.unpack_int4(got)
            assert (got.double() - w).abs().max() <= 1      # an integer at a rounding boundary
            continue
        assert got.dtype == getattr(torch, t.dtype.torch_name) and tuple(got.shape) == tuple(w.shape)
        if t.dtype.is_int:
            assert (got.double() - w).abs().max() <= 1
        else:
            _close(t.name, got.double(), w, t.dtype.name, chain=any(x.role == "tmp" for x in src.tensors.values()))


def test_the_compiled_form_is_one_traced_graph_with_scalars_as_inputs():
    prog, src, sizes, inputs, args = _inputs("samples/residual_rmsnorm.epi")
    compiled = epic.compile(str(ROOT / "samples/residual_rmsnorm.epi"), fallback="compiled")
    eager = prog(**args)
    first = compiled(**args)
    for k in eager:
        _close(k, first[k].double(), eager[k].double(), src.tensors[k].dtype.name)
    # a different eps must reach the graph (a scalar baked in as a constant would not change r)
    other = compiled(**{**args, "eps": 0.5})
    assert not torch.equal(other["r"], first["r"])
    want = epic.compile(str(ROOT / "samples/residual_rmsnorm.epi"), fallback="eager")(**{**args, "eps": 0.5})
    _close("r", other["r"].double(), want["r"].double(), "f32")
    assert len(compiled.unfused._graphs) == 1            # one signature, traced once
    # another row count is another graph (a graph traced for one shape must not run another)
    _, _, _, inputs2, args2 = _inputs("samples/residual_rmsnorm.epi", m=33, seed=2)
    got = compiled(**args2)
    want = prog(**args2)
    assert got["resid"].shape[0] == 33
    for k in want:
        _close(k, got[k].double(), want[k].double(), src.tensors[k].dtype.name)
    assert len(compiled.unfused._graphs) == 2
    # the form itself, called directly, is eager unless asked
    prog.unfused(**args)
    assert prog.unfused._graphs == {}


def test_wrong_tensors_are_refused_as_the_kernels_refuse_them():
    prog, src, sizes, inputs, args = _inputs("samples/residual_rmsnorm.epi")
    with pytest.raises(EpicError) as info:
        prog(**{**args, "x": args["x"].float()})
    assert info.value.codes == ["E603"]
    with pytest.raises(EpicError) as info:
        prog(**{k: v for k, v in args.items() if k != "x"})
    assert info.value.codes == ["E601"]


@pytest.mark.parametrize("policy", ["sometimes", None, 1, "EAGER", ""])
def test_an_unknown_policy_is_e608(policy):
    with pytest.raises(EpicError) as info:
        epic.compile(str(ROOT / "samples/bias_gelu.epi"), fallback=policy)
    assert info.value.codes == ["E608"] and "never, auto, eager, compiled" in str(info.value)


# ---------------------------------------------------------------- the database's verdict
@pytest.mark.parametrize("entry, verdict", [
    ({"ms": 1.0, "unfused": {"eager_ms": 3.0, "compiled_ms": 1.5}}, ("fused", 1.5)),
    ({"ms": 1.0, "unfused": {"eager_ms": 3.0, "compiled_ms": 0.8}}, ("compiled", 1.25)),
    ({"ms": 1.0, "unfused": {"eager_ms": 0.5, "compiled_error": "x"}}, ("eager", 2.0)),
    ({"ms": 1.0}, None),
    ({"ms": 1.0, "unfused": {"eager_error": "x", "compiled_error": "y"}}, None),
    ({"ms": "fast", "unfused": {"eager_ms": 0.5}}, None),                       # a user's file: never trusted
    ({"ms": 1.0, "unfused": {"eager_ms": -1, "compiled_ms": True}}, None),
    ({"ms": 1.0, "unfused": ["eager", 0.1]}, None),
])
def test_the_verdict(entry, verdict):
    got = database.verdict(entry)
    assert (got[0], round(got[1], 6)) == verdict if verdict else got is None


@pytest.fixture
def db(tmp_path):
    return tmp_path / "tuning.json"


def _store(db, path, sizes, gpu, fused, eager, compiled_ms):
    prog = epic.compile(path)
    database.store(prog.program, sizes, gpu, {"configs": {}, "ms": fused, "measured": "2026-11-30",
                                              "unfused": {"eager_ms": eager, "compiled_ms": compiled_ms}}, db)


def test_auto_runs_the_unfused_form_only_where_the_database_says_it_wins(db, monkeypatch):
    path = str(ROOT / "samples/residual_rmsnorm.epi")
    monkeypatch.setenv("EPIC_TUNING", str(db))
    monkeypatch.setattr(compiled_mod.torch.cuda, "get_device_name", lambda device=None: "GPU-A")
    _store(db, path, dict(M=64, D=4096), "GPU-A", 0.02, 0.018, 0.03)          # unfused eager wins at M <= 64
    _store(db, path, dict(M=8192, D=4096), "GPU-A", 0.4, 1.2, 0.5)            # fusion wins at M = 8192
    auto = epic.compile(path, fallback="auto")
    assert auto.unfused_choice(dict(M=64, D=4096), "cuda:0") == "eager"
    assert auto.unfused_choice(dict(M=33, D=4096), "cuda:0") == "eager"       # same bucket
    assert auto.unfused_choice(dict(M=8192, D=4096), "cuda:0") is None
    assert auto.unfused_choice(dict(M=64, D=2048), "cuda:0") is None          # no entry
    monkeypatch.setattr(compiled_mod.torch.cuda, "get_device_name", lambda device=None: "GPU-B")
    assert auto.unfused_choice(dict(M=64, D=4096), "cuda:0") is None          # another GPU's entry
    never = epic.compile(path)
    monkeypatch.setattr(compiled_mod.torch.cuda, "get_device_name", lambda device=None: "GPU-A")
    assert never.unfused_choice(dict(M=64, D=4096), "cuda:0") is None
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    assert auto.unfused_choice(dict(M=64, D=4096), "cuda:0") is None


def test_tune_records_the_unfused_form_and_plan_tuned_prints_the_comparison(db, monkeypatch, capsys):
    from cli.main import main
    monkeypatch.setenv("EPIC_NO_TUNING", "1")
    path = str(ROOT / "samples/residual_rmsnorm.epi")
    sizes = dict(M=64, D=4096)
    seen = []

    def unfused_timer(unfused, inputs):
        seen.append(unfused)
        return {"eager_ms": 0.05, "compiled_ms": 0.01, "compile_s": 3.0}
    lines = []
    tuner.tune(path, sizes, limit=2, database_file=db, gpu="GPU-A", timer=lambda prog, inputs: 0.02,
               builder=lambda units: None, report=lines.append, unfused_timer=unfused_timer)
    assert len(seen) == 1 and seen[0].source.kernels            # the source program, before rewrites
    entry = next(iter(json.loads(db.read_text())["entries"].values()))
    assert entry["unfused"] == {"eager_ms": 0.05, "compiled_ms": 0.01, "compile_s": 3.0}
    assert any(line.startswith("unfused torch form, compiled: 0.010 ms (0.500x the fused)") for line in lines)
    assert main(["plan", path, "--shape", "M=64,D=4096", "--tuned", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "GPU-A, measured" in out and "unfused torch form, eager" in out
    assert "fusion LOSES: the unfused compiled form is 2.000x faster" in out
    assert main(["plan", path, "--shape", "M=8192,D=4096", "--tuned", "--db", str(db)]) == 0
    assert "has no entry for this program at M<=8192,D=4096" in capsys.readouterr().out


def test_plan_tuned_prints_a_hostile_database_harmlessly(db, capsys):
    """The database is a user's file: its text never reaches the terminal raw, and nothing in it crashes."""
    from cli.main import main
    path = str(ROOT / "samples/residual_rmsnorm.epi")
    prog = epic.compile(path)
    sizes = dict(M=64, D=4096)
    for gpu, entry in [("GPU\x1b[2J", {"ms": 0.02, "measured": "\x1b]0;pwned\x07" + "x" * 500,
                                       "configs": {"o_proj\x1b[31m": {"tile": "\x1b[0m"}},
                                       "unfused": {"eager_error": "\r\x1b[K", "compiled_ms": "fast"}}),
                       ("GPU-B", {"ms": None, "configs": ["x"], "unfused": 3}),
                       ("GPU-C", {"ms": 0.02, "configs": {"o_proj": 5}, "unfused": {"eager_ms": 1e300}})]:
        database.store(prog.program, sizes, gpu, entry, db)
    assert main(["plan", path, "--shape", "M=64,D=4096", "--tuned", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "GPU\\x1b[2J" in out and "GPU-B" in out and "no usable fused time" in out


def test_a_torch_compile_failure_is_e708_not_a_traceback(monkeypatch):
    prog, src, sizes, inputs, args = _inputs("samples/bias_gelu.epi")
    compiled = epic.compile(str(ROOT / "samples/bias_gelu.epi"), fallback="compiled")

    def broken(*a, **k):
        raise RuntimeError("InductorError: no working C++ compiler found\nmore")
    monkeypatch.setattr(torch, "compile", broken)
    with pytest.raises(EpicError) as info:
        compiled(**args)
    assert info.value.codes == ["E708"] and "no working C++ compiler" in str(info.value)
    assert 'fallback="eager"' in info.value.diagnostics[0].hint


def test_a_database_warning_on_the_command_line_is_one_line(tmp_path, capsys):
    from cli.main import main
    assert main(["plan", str(ROOT / "samples/bias_gelu.epi"), "--shape", "M=64,K=128,N=256", "--tuned",
                 "--db", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("epic: tuning database: ") and "cannot be read" in err and "ignored" in err
    assert ".py" not in err and len(err.strip().splitlines()) == 1
