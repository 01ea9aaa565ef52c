"""The training benchmarks' CPU-checkable parts (issue 24; the H200 runs them for real):
bench/train_step.py's candidates and checks, bench/train_llama.py's variants, bench/fsdp2_gpus.py on
two gloo processes. The peers (QuACK, Liger) are not installed here: stand-ins with their documented
signatures and semantics show that each is called the way its API says, on the same operands."""
import importlib.util
import json
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from .conftest import ROOT, bench_module


ts = bench_module("train_step")
SMALL = {"ce": dict(D=64, V=256), "mlp": dict(D=64, F=96)}
CHECK_TOL = 3e-2          # ||a - b|| / ||b|| against eager in bf16; a wrong gradient reads ~1


def _run(work, names, rounds=2):
    return ts.run(work, 32, rounds, names, device="cpu", shapes=SMALL[work])


@pytest.mark.parametrize("work", ["ce", "mlp"])
def test_each_candidate_is_timed_against_cublas_and_checked_against_eager(work):
    r = _run(work, ["epic", "eager"], rounds=3)
    assert list(r.median_ms) == ["cublas", "epic", "eager"]
    assert r.ratio_to_cublas["cublas"] == 1.0
    assert "cublas" not in r.check, "the bare gemms compute no loss: nothing to check"
    grads = {"ce": {"x", "w"}, "mlp": {"x", "wg", "wu", "wd"}}[work]
    assert set(r.check["epic"]) == {"out"} | grads
    assert max(r.check["epic"].values()) < CHECK_TOL, r.check


def _stand_ins(monkeypatch, gate_up="interleaved"):
    """quack and liger_kernel modules with the peers' call signatures and what they compute."""
    lce = types.ModuleType("quack.linear_cross_entropy")

    def chunked_linear_cross_entropy(x, weight, target, chunk_size=4096, ignore_index=-100, reduction="mean",
                                     tuned=True, use_scaled_exp=None):      # weight (V, d), target (B*L,)
        return F.cross_entropy(F.linear(x, weight).float(), target, ignore_index=ignore_index, reduction=reduction)
    lce.chunked_linear_cross_entropy = chunked_linear_cross_entropy
    lce.scaled_exp_lce_supported = lambda x, weight, chunk_size, reduction: False
    mlp = types.ModuleType("quack.mlp")

    def mlp_func(x, weight1, weight2, activation, bias1=None, bias2=None, fuse_grad_accum=False, tuned=True,
                 recompute=False, concat_layout=False):      # QuACK's MLP: fc1's rows (d two) interleaved
        y = x @ weight1.t()
        gate, up = (y[..., ::2], y[..., 1::2]) if gate_up == "interleaved" else y.chunk(2, dim=-1)
        return (F.silu(gate) * up) @ weight2.t()
    mlp.mlp_func = mlp_func
    liger = types.ModuleType("liger_kernel.transformers")

    class LigerFusedLinearCrossEntropyLoss(torch.nn.Module):
        def __init__(self, reduction="mean"):
            super().__init__()
            self.reduction = reduction

        def forward(self, lin_weight, _input, target):
            return F.cross_entropy(F.linear(_input, lin_weight).float(), target, reduction=self.reduction)
    liger.LigerFusedLinearCrossEntropyLoss = LigerFusedLinearCrossEntropyLoss
    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_swiglu = lambda a, b: F.silu(a) * b
    for module in (lce, mlp, liger, functional):
        monkeypatch.setitem(sys.modules, module.__name__, module)


@pytest.mark.parametrize("work", ["ce", "mlp"])
def test_the_peers_run_on_the_same_operands_through_their_apis(monkeypatch, work):
    _stand_ins(monkeypatch)
    r = _run(work, ["quack", "liger"])
    assert set(r.check) == {"quack", "liger"}, r.notes
    for name in ("quack", "liger"):
        assert max(r.check[name].values()) < CHECK_TOL, (name, r.check[name])


def test_the_check_shows_a_peer_given_gate_and_up_in_another_layout(monkeypatch):
    _stand_ins(monkeypatch, gate_up="concatenated")
    r = _run("mlp", ["quack"])
    assert r.check["quack"]["out"] > 0.5 and r.check["quack"]["wd"] > 0.5, r.check


def test_a_missing_peer_is_skipped_and_a_failing_one_recorded_while_the_rest_run(monkeypatch):
    _stand_ins(monkeypatch)
    monkeypatch.setitem(sys.modules, "quack.mlp", None)            # what an absent package raises on import

    def broken(a, b):
        raise RuntimeError("no kernel for this GPU")
    monkeypatch.setattr(sys.modules["liger_kernel.transformers.functional"], "liger_swiglu", broken)
    r = _run("mlp", ["quack", "liger", "eager"])
    assert r.notes["quack"].startswith("skipped: quack not installed")
    assert r.notes["liger"] == "failed: RuntimeError: no kernel for this GPU"
    assert list(r.median_ms) == ["cublas", "eager"]


def test_a_candidate_is_one_builder_in_its_work_s_dict(monkeypatch):
    monkeypatch.setitem(ts.CE, "eager-again", ts.ce_eager)
    assert "eager-again" in _run("ce", ["eager-again"]).check
    assert _run("mlp", ["eager-again"]).notes == {"eager-again": "skipped: not a candidate of mlp"}


def test_train_step_candidates_option():
    assert ts.parse_args(["--candidates", "epic,quack,epic", "--compile"]).candidates == ["epic", "quack", "compile"]
    with pytest.raises(SystemExit) as e:
        ts.parse_args(["--candidates", "epic,cutlass"])
    assert e.value.code == 2


# ---- bench/train_llama.py ------------------------------------------------------------------------------

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed")
TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "96", "--heads", "4", "--vocab", "128", "--seq", "32",
        "--batch", "2"]


@needs_transformers
def test_train_llama_variants():
    tl = bench_module("train_llama")
    assert tl.parse_args(["--variants", "liger,hf_compile"]).variants == ["hf", "liger", "hf_compile"]
    assert tl.parse_args(["--variants", "compile"]).variants == ["hf", "hf_compile"], "the older name"
    assert tl.parse_args([]).variants == ["hf", "hf_compile", "epic", "epic_compile", "liger"]
    assert tl.parse_args([]).steps == 50
    with pytest.raises(SystemExit) as e:
        tl.parse_args(["--variants", "hf,deepspeed"])
    assert e.value.code == 2


@needs_transformers
def test_train_llama_compares_each_variant_with_hf_and_puts_liger_s_patch_back(monkeypatch, tmp_path):
    """Liger's apply_liger_kernel_to_llama also replaces functions of transformers' Llama module; the
    stand-in does the same (its RoPE counts its calls and computes HF's): it must be live during the
    liger run only."""
    from transformers.models.llama import modeling_llama as m
    tl = bench_module("train_llama")
    original_rope, original_mlp = m.apply_rotary_pos_emb, m.LlamaMLP
    monkeypatch.setattr(m, "apply_rotary_pos_emb", original_rope)     # put back at teardown even if this fails
    monkeypatch.setattr(m, "LlamaMLP", original_mlp)
    calls = []

    def apply_liger_kernel_to_llama(model=None, **kw):
        def rope(*a, **k):
            calls.append(1)
            return original_rope(*a, **k)
        m.apply_rotary_pos_emb = rope
        m.LlamaMLP = type("PatchedMLP", (original_mlp,), {})
    liger = types.ModuleType("liger_kernel.transformers")
    liger.apply_liger_kernel_to_llama = apply_liger_kernel_to_llama
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", liger)
    out = tmp_path / "train_llama.json"
    assert tl.main(["--device", "cpu", "--steps", "3", "--warmup", "1", "--variants", "hf,epic,liger",
                    "--out", str(out), *TINY]) == 0
    assert m.apply_rotary_pos_emb is original_rope and m.LlamaMLP is original_mlp
    assert calls, "the patch was live while the liger variant trained"
    runs = json.loads(out.read_text())["variants"]
    assert "loss_abs_diff" not in runs["hf"]
    for name in ("epic", "liger"):
        assert len(runs[name]["loss"]) == len(runs[name]["loss_abs_diff"]) == 3
        assert runs[name]["max_loss_abs_diff"] == max(runs[name]["loss_abs_diff"])
        assert set(runs[name]["grad_rel_diff"]) == set(runs["epic"]["grad_rel_diff"])
    assert runs["liger"]["max_loss_abs_diff"] == 0, "the stand-in computes HF's model"
    assert 0 < runs["epic"]["max_loss_abs_diff"] < 1e-2 and max(runs["epic"]["grad_rel_diff"].values()) < 4e-2


@needs_transformers
@pytest.mark.parametrize("policy, chunk_rows, runs", [
    ("fused", None, [("forward", 64)]),
    ("fused", 24, [("forward", 24), ("later", 24), ("later", 16)]),     # 64 rows: chunks of 24, 24, 16
    ("save", None, [("forward", 64), ("backward", 64)]),
    ("save", 24, [("forward", 64), ("backward", 24), ("backward", 16)])])
def test_prebuild_lists_each_lm_head_program_at_the_rows_it_runs_at(monkeypatch, policy, chunk_rows, runs):
    import epic.runtime.build
    from epic.integrations import programs
    tl = bench_module("train_llama")
    built = []
    monkeypatch.setattr(epic.runtime.build, "build_all", built.extend)
    cfg = tl.config(tl.parse_args(TINY))
    tl.build_epic_kernels(cfg, 64, chunk_rows, policy)
    head = programs.lm_head_loss("never", chunk_rows, policy)
    dims = dict(D=64, V=128)
    for attr, m in runs:
        prog = getattr(head, attr)
        want = {(u.name, u.source) for _, u in prog.units({k: v for k, v in {**dims, "M": m}.items()
                                                           if k in prog.program.dims})}
        assert want <= {(u.name, u.source) for u in built}, (attr, m)


# ---- bench/fsdp2_gpus.py -------------------------------------------------------------------------------

@needs_transformers
def test_fsdp2_script_on_two_gloo_processes_matches_one(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch was built without gloo")
    out = tmp_path / "fsdp2.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fsdp2_gpus.py"), "--backend", "gloo", "--device", "cpu",
                           "--steps", "2", "--warmup", "1", "--out", str(out), *TINY],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert len(r["sharded_loss"]) == len(r["single_loss"]) == 2
    assert r["single_loss"][0] != r["single_loss"][1], "the step must change the loss"
    assert r["max_loss_abs_diff"] < 1e-2 * abs(r["single_loss"][0])
    assert "max |diff|" in proc.stdout


@needs_transformers
@pytest.mark.parametrize("argv", [["--world", "2", "--batch", "3"], ["--backend", "gloo"],
                                  ["--device", "cpu", "--backend", "nccl"]])
def test_fsdp2_script_refuses_inconsistent_options(argv):
    with pytest.raises(SystemExit) as e:
        bench_module("fsdp2_gpus").parse_args(argv)
    assert e.value.code == 2


# ---- bench/peers_fetch.sh and bench/peers_install.sh ------------------------------------------------------

def _wheel(folder, name: str, payload: bytes):
    """A minimal pure-Python wheel whose module holds `payload` (stored: its size is the wheel's)."""
    import base64
    import hashlib
    import zipfile
    files = {f"{name}/__init__.py": b"import os\nDATA = open(os.path.join(os.path.dirname(__file__), 'data.bin'), 'rb').read()\n",
             f"{name}/data.bin": payload,
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                     for p, b in files.items()) + f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w", zipfile.ZIP_STORED) as z:
        for p, b in {**files, f"{name}-1.0.dist-info/RECORD": record.encode()}.items():
            z.writestr(p, b)


def _sh(script, env, *args):
    import os
    return subprocess.run(["bash", str(ROOT / "bench" / script), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_the_peers_wheels_travel_in_two_parts_and_install_as_one(tmp_path):
    """peers_fetch.sh splits what exceeds one device call; peers_install.sh, in two calls (part 1 stashed
    in PQ by the first), joins the wheel, checks its sha256 and installs everything with one pip."""
    index, dest, pq = tmp_path / "index", tmp_path / ".whl", tmp_path / "pq"
    index.mkdir()
    payload = torch.randint(0, 256, (300_000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    _wheel(index, "fakebig", bytes(payload.tolist()))
    _wheel(index, "fakesmall", b"small")
    env = {"PEERS_DIR": str(dest), "PQ": str(pq), "PEERS_BUDGET_BYTES": "200000",
           "PEERS_SPECS": "fakebig==1.0 fakesmall==1.0"}
    fetch = _sh("peers_fetch.sh", env, "--no-index", "--find-links", str(index))
    assert fetch.returncode == 0, fetch.stderr
    part1 = sorted(p.name for p in (dest / "peers").iterdir())
    assert part1 == ["fakebig-1.0-py3-none-any.whl.part1", "fakesmall-1.0-py3-none-any.whl"]
    assert sorted(p.name for p in (dest / "peers-part2").iterdir()) == [
        "fakebig-1.0-py3-none-any.whl.part2", "fakebig-1.0-py3-none-any.whl.sha256"]
    for folder in ("peers", "peers-part2"):
        assert sum(p.stat().st_size for p in (dest / folder).iterdir()) <= 200_000
    (dest / "peers-part2").rename(tmp_path / "later")             # call 1 carries .whl/peers only
    first = _sh("peers_install.sh", env)
    assert first.returncode == 0 and "part 1 stashed" in first.stdout, first.stdout + first.stderr
    assert not (pq / "site-packages").exists()
    (dest / "peers").rename(tmp_path / "earlier")                 # call 2 carries .whl/peers-part2 only
    (tmp_path / "later").rename(dest / "peers-part2")
    second = _sh("peers_install.sh", env)
    assert second.returncode == 0, second.stdout + second.stderr
    check = subprocess.run(["bash", "-c", f"source {pq}/env.sh && {sys.executable} -c "
                            "'import fakebig, fakesmall, hashlib; print(hashlib.sha256(fakebig.DATA).hexdigest())'"],
                           capture_output=True, text=True)
    import hashlib
    assert check.stdout.strip() == hashlib.sha256(bytes(payload.tolist())).hexdigest(), check.stderr


def test_a_part_that_does_not_belong_is_refused(tmp_path):
    index, dest, pq = tmp_path / "index", tmp_path / ".whl", tmp_path / "pq"
    index.mkdir()
    _wheel(index, "fakebig", bytes(range(256)) * 1000)
    env = {"PEERS_DIR": str(dest), "PQ": str(pq), "PEERS_BUDGET_BYTES": "200000", "PEERS_SPECS": "fakebig==1.0"}
    assert _sh("peers_fetch.sh", env, "--no-index", "--find-links", str(index)).returncode == 0
    part2 = dest / "peers-part2" / "fakebig-1.0-py3-none-any.whl.part2"
    data = part2.read_bytes()
    part2.write_bytes(bytes([data[0] ^ 1]) + data[1:])          # as if from another download
    install = _sh("peers_install.sh", env)
    assert install.returncode == 1 and "does not match its sha256" in install.stderr, install.stdout + install.stderr
    assert not (pq / "site-packages").exists()


def test_the_report_shows_how_far_the_rounds_spread():
    r = _run("ce", ["eager"], rounds=4)
    assert len(r.round_ms["eager"]) == 4 == len(r.round_ms["cublas"])
    ratios = sorted(t / c for t, c in zip(r.round_ms["eager"], r.round_ms["cublas"]))
    lo, hi = r.ratio_quartiles["eager"]
    assert ratios[0] <= lo <= r.ratio_to_cublas["eager"] <= hi <= ratios[-1]
    assert ts._quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert "rounds' middle half" in ts.report(r)


def test_the_report_names_a_candidate_that_allocated_device_memory_inside_a_timed_step():
    """A cudaMalloc inside the timed events synchronizes and is timed with the step: the report says
    which candidate paid it (counted on the GPU only; none on the CPU)."""
    r = _run("ce", ["eager"], rounds=2)
    assert r.device_allocs == {}
    assert "cudaMalloc" not in ts.report(r)
    r.device_allocs = {"cublas": 0, "eager": 3}
    lines = [line for line in ts.report(r).splitlines() if "cudaMalloc" in line]
    assert lines == ["  note eager: 3 cudaMalloc calls inside its timed steps (2 rounds)"]
