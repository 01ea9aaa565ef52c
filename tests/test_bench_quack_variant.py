"""bench/quack_variant.py and bench/quack_variants_ab.py on a small package written here in QuACK's shape:
what a renamed copy changes (its imports, the TMA loads' policy, the serpentine), the QuACK and the
arguments they refuse, and the candidate list the A/B script hands the peer harness."""
import subprocess
import sys
import types

import pytest

from .conftest import ROOT, bench_module

GEMM_SM90 = '''import cutlass
from quack import copy_utils
from quack.pipeline import make_pipeline_state


def load(self):
                    if const_expr(not self.gather_A):
                        copy_A = copy_utils.tma_get_block_copy_fn(
                            tma_atom_a,
                            src_tensor=gA_mk,
                            dst_tensor=sA,
                            tma_multicast=a_tma_multicast,
                        )
                    else:
                        copy_A = None
                    copy_B = copy_utils.tma_get_block_copy_fn(
                        tma_atom_b,
                        src_tensor=gB_nk,
                        dst_tensor=sB,
                        tma_multicast=b_tma_multicast,
                    )
'''


TILE_SCHEDULER = '''from cutlass import Int32, const_expr


class TileScheduler:
    def _swizzle_cta(self, group_id, cid_slow):
        if group_id % 2 == 1:  # serpentine order
            cid_slow = 7 - cid_slow
        return cid_slow


class TriangularTileScheduler(TileScheduler):
    def _swizzle_cta(self, group_id, cid_slow):
        if group_id % 2 == 1:  # serpentine order
            cid_slow = 3 - cid_slow
        return cid_slow
'''


def fake_quack(root):
    pkg = root / "quack"
    (pkg / "cache").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.6.5"\nfrom quack.gemm_sm90 import load\n')
    (pkg / "gemm_sm90.py").write_text(GEMM_SM90)
    (pkg / "tile_scheduler.py").write_text(TILE_SCHEDULER)
    (pkg / "cache" / "jit.py").write_text("def fingerprint():\n    import quack as _quack\n    return _quack\n")
    (pkg / "autotuner.py").write_text('PACKAGE_NAME = "quack"\n')
    (pkg / "ops.py").write_text('@cute_op("quack::_topk_fwd")\ndef f(module):\n    return module == "quack"\n')
    return pkg


def test_the_copy_renames_every_import_and_gives_both_loads_the_policy(tmp_path):
    qv = bench_module("quack_variant")
    dst = qv.make(fake_quack(tmp_path / "src"), tmp_path / "out", "quack_ev", ["policy"])
    assert dst == tmp_path / "out" / "quack_ev"
    assert (dst / "tile_scheduler.py").read_text() == TILE_SCHEDULER
    assert (dst / "__init__.py").read_text() == '__version__ = "0.6.5"\nfrom quack_ev.gemm_sm90 import load\n'
    assert "import quack_ev as _quack" in (dst / "cache" / "jit.py").read_text()
    assert (dst / "autotuner.py").read_text() == 'PACKAGE_NAME = "quack_ev"\n'
    ops = (dst / "ops.py").read_text()
    assert '"quack_ev::_topk_fwd"' in ops and 'module == "quack_ev"' in ops
    gemm = (dst / "gemm_sm90.py").read_text()
    assert gemm.startswith("import cutlass\nfrom quack_ev import copy_utils\nfrom quack_ev.pipeline import")
    policy = "cache_policy=cutlass.Int64(0x1000000000000000),"
    assert gemm.count(policy) == 2
    assert ("                            tma_multicast=a_tma_multicast,\n"
            f"                            {policy}\n                        )") in gemm
    assert f"tma_multicast=b_tma_multicast,\n                        {policy}\n                    )" in gemm
    # the original is untouched, and a second run replaces the copy
    assert "cache_policy" not in (tmp_path / "src" / "quack" / "gemm_sm90.py").read_text()
    (dst / "stale.py").write_text("")
    assert not (qv.make(tmp_path / "src" / "quack", tmp_path / "out", "quack_ev", ["policy"]) / "stale.py").exists()


def test_the_linear_copy_turns_off_the_serpentine_of_the_static_scheduler_only(tmp_path):
    qv = bench_module("quack_variant")
    src = fake_quack(tmp_path / "src")
    dst = qv.make(src, tmp_path / "out", "quack_lin", ["linear"])
    text = (dst / "tile_scheduler.py").read_text()
    static, _, triangular = text.partition("class TriangularTileScheduler")
    assert "if const_expr(False):  # serpentine order: off" in static and "group_id % 2" not in static
    assert "if group_id % 2 == 1:  # serpentine order" in triangular
    assert "cache_policy" not in (dst / "gemm_sm90.py").read_text()
    both = qv.make(src, tmp_path / "out", "quack_both", ["policy", "linear"])
    assert "cache_policy" in (both / "gemm_sm90.py").read_text()
    assert "const_expr(False)" in (both / "tile_scheduler.py").read_text()
    assert (both / "__init__.py").read_text().endswith("from quack_both.gemm_sm90 import load\n")


def test_a_quack_without_the_expected_loads_is_refused(tmp_path):
    qv = bench_module("quack_variant")
    pkg = fake_quack(tmp_path / "src")
    (pkg / "gemm_sm90.py").write_text(GEMM_SM90.replace("dst_tensor=sB,", "dst_tensor=sB2,"))
    with pytest.raises(ValueError, match="A and B loads of quack-kernels 0.6.5"):
        qv.make(pkg, tmp_path / "out", "quack_ev", ["policy"])
    (pkg / "tile_scheduler.py").write_text(TILE_SCHEDULER.replace("  # serpentine order", ""))
    with pytest.raises(ValueError, match="serpentine of quack-kernels 0.6.5"):
        qv.make(pkg, tmp_path / "out", "quack_lin", ["linear"])
    with pytest.raises(ValueError, match="changes are policy, linear"):
        qv.make(pkg, tmp_path / "out", "quack_x", ["faster"])
    with pytest.raises(ValueError, match="a copy's name is quack_"):
        qv.make(pkg, tmp_path / "out", "../evil", ["linear"])


def test_without_quack_both_scripts_say_so_in_one_line(tmp_path):
    for script, args in (("quack_variant.py", ["--into", str(tmp_path), "--name", "quack_ev", "--change", "policy"]),
                         ("quack_variants_ab.py", ["--variant", "quack_ev", "--harness", str(tmp_path / "h.py")])):
        out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / script), *args], capture_output=True,
                             text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert ab_missing_harness(tmp_path) == "quack_variants_ab: no harness at " + str(tmp_path / "h.py")
    for args in (["--rows", "64"], ["--harness", "h.py"], ["--variant", "quack_ev"]):
        out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_variants_ab.py"), *args],
                             capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.startswith("usage: quack_variants_ab.py --variant"), args


def fake_copies(root, *names):
    """Packages named like copies of QuACK, with the functions the A/B script takes from them; returns
    the folder to put on PYTHONPATH."""
    for name in names:
        for mod in ("gemm_interface", "linear_cross_entropy", "epilogue/library", "epilogue/rotary"):
            (root / name / mod).parent.mkdir(parents=True, exist_ok=True)
            (root / name / f"{mod}.py").write_text(
                "gemm = gemm_act = gemm_rms = gemm_norm_act = chunked_linear_cross_entropy = None\n"
                "lse_target_epi = rope_posfreq_epi = make_interleaved_inv_freq = None\n")
    return root


def ab_missing_harness(tmp_path):
    """quack_variants_ab's answer to a harness path with nothing there, the variant importable (faked)."""
    fake = fake_copies(tmp_path / "fakevariant", "quack_ev")
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_variants_ab.py"), "--variant",
                          "quack_ev:evn", "--harness", str(tmp_path / "h.py")], capture_output=True, text=True,
                         env={"PYTHONPATH": str(fake)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr.strip()


def test_the_ab_script_times_each_quack_candidate_once_per_copy_under_its_label():
    ab = bench_module("quack_variants_ab")
    seen = []

    def candidates(Q, name, inputs, graphed, notes):
        seen.append(Q)
        return [("quack", Q.fn, None), ("quack-chunked-mean", Q.fn, "check")]

    quack, ev, lin = (types.SimpleNamespace(fn=lambda v=v: v) for v in (1, 2, 3))
    out = ab.with_variants(candidates, [("evn", ev), ("lin", lin)])(quack, "xent", {}, None, [])
    assert seen == [quack, ev, lin]
    assert [fn() for _, fn, _ in out] == [1, 1, 2, 2, 3, 3]
    assert [label for label, _, _ in out] == ["quack", "quack-chunked-mean", "quack-evn", "quack-evn-chunked-mean",
                                              "quack-lin", "quack-lin-chunked-mean"]
    assert out[3][2] == "check"


def test_the_ab_script_adds_epic_with_a_configuration_under_its_label(monkeypatch):
    """--epic serp: epic's workload program with tile_order=serpentine on every gemm, compiled at its first
    call (the harness's guarded one), its check the first output under that output's name."""
    ab = bench_module("quack_variants_ab")
    bench = bench_module("bench")
    monkeypatch.setitem(sys.modules, "bench", bench)
    calls = []

    class Prog:
        def __init__(self, config):
            self.config = config
            self.program = types.SimpleNamespace(kernels=[types.SimpleNamespace(name="up", kind="gemm"),
                                                          types.SimpleNamespace(name="up__row", kind="combine")])

        def __call__(self, **inputs):
            calls.append((self.config, inputs))
            return {"y": "Y", "z": "Z"}

    import epic
    monkeypatch.setattr(epic, "compile", lambda path, config=None: Prog(config))
    makers = [ab.epic_candidate("serp", "serp"), ab.epic_candidate("rn_s4", "rn_s4")]
    out = ab.with_variants(lambda *a: [("quack", None, None)], [], makers)(None, "bias_gelu", {"x": 1}, None, [])
    assert [label for label, _, _ in out] == ["quack", "epic-serp", "epic-rn_s4"]
    assert calls == []                                           # nothing compiled before the first call
    assert out[1][1]() == {"y": "Y", "z": "Z"} and out[1][2]() == ("Y", "y")
    assert calls[0] == ({"up": {"tile_order": "serpentine"}}, {"x": 1})
    out[2][1]()
    assert calls[-1][0] == {"up": {"raster": "n", "swizzle": 4}}


def test_the_ab_script_hands_the_harness_its_arguments_and_the_variants_candidates(tmp_path):
    fake = fake_copies(tmp_path / "fakevariant", "quack_ev", "quack_lin")
    harness = tmp_path / "harness.py"
    harness.write_text(
        "import sys, types\n"
        "def quack_candidates(Q, name, inputs, graphed, notes):\n"
        "    return [('quack', Q.gemm, None)]\n"
        "def main():\n"
        "    print(' '.join(sys.argv[1:]))\n"
        "    q = types.SimpleNamespace(gemm=None)\n"
        "    print(' '.join(l for l, _, _ in quack_candidates(q, 'plain', {}, None, [])))\n"
        "    return 3\n")
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_variants_ab.py"), "--work", "plain",
                          "--variant", "quack_ev:evn", "--harness", str(harness), "--variant", "quack_lin",
                          "--rows", "8192"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(fake)})
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == ["--work plain --rows 8192", "quack quack-evn quack-lin"]
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_variants_ab.py"), "--epic", "serp",
                          "--harness", str(harness), "--rows", "8192"], capture_output=True, text=True,
                         env={"PYTHONPATH": str(fake)})
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == ["--rows 8192", "quack epic-serp"]
