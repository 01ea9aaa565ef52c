"""bench/quack_variant.py and bench/quack_policy_ab.py on a small package written here in QuACK's shape:
what the renamed copy changes, the TMA loads it gives a policy, the QuACK it refuses, and the candidate
list the A/B harness hands the peer harness."""
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


def fake_quack(root):
    pkg = root / "quack"
    (pkg / "cache").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0.6.5"\nfrom quack.gemm_sm90 import load\n')
    (pkg / "gemm_sm90.py").write_text(GEMM_SM90)
    (pkg / "cache" / "jit.py").write_text("def fingerprint():\n    import quack as _quack\n    return _quack\n")
    (pkg / "autotuner.py").write_text('PACKAGE_NAME = "quack"\n')
    (pkg / "ops.py").write_text('@cute_op("quack::_topk_fwd")\ndef f(module):\n    return module == "quack"\n')
    return pkg


def test_the_copy_renames_every_import_and_gives_both_loads_the_policy(tmp_path):
    qv = bench_module("quack_variant")
    dst = qv.make(fake_quack(tmp_path / "src"), tmp_path / "out")
    assert dst == tmp_path / "out" / "quack_ev"
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
    assert not (qv.make(tmp_path / "src" / "quack", tmp_path / "out") / "stale.py").exists()


def test_a_quack_without_the_expected_loads_is_refused(tmp_path):
    qv = bench_module("quack_variant")
    pkg = fake_quack(tmp_path / "src")
    (pkg / "gemm_sm90.py").write_text(GEMM_SM90.replace("dst_tensor=sB,", "dst_tensor=sB2,"))
    with pytest.raises(ValueError, match="A and B loads of quack-kernels 0.6.5"):
        qv.make(pkg, tmp_path / "out")


def test_without_quack_both_scripts_say_so_in_one_line(tmp_path):
    for script, args in (("quack_variant.py", ["--into", str(tmp_path)]),
                         ("quack_policy_ab.py", ["--harness", str(tmp_path / "h.py")])):
        out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / script), *args], capture_output=True,
                             text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert ab_missing_harness(tmp_path) == "quack_policy_ab: no harness at " + str(tmp_path / "h.py")
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_policy_ab.py"), "--rows", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("usage: quack_policy_ab.py --harness")


def ab_missing_harness(tmp_path):
    """quack_policy_ab's answer to a harness path with nothing there, the variant importable (faked)."""
    fake = tmp_path / "fakevariant"
    for mod in ("gemm_interface", "linear_cross_entropy", "epilogue/library", "epilogue/rotary"):
        (fake / "quack_ev" / mod).parent.mkdir(parents=True, exist_ok=True)
        (fake / "quack_ev" / f"{mod}.py").write_text(
            "gemm = gemm_act = gemm_rms = gemm_norm_act = chunked_linear_cross_entropy = None\n"
            "lse_target_epi = rope_posfreq_epi = make_interleaved_inv_freq = None\n")
    out = subprocess.run([sys.executable, "-S", str(ROOT / "bench" / "quack_policy_ab.py"), "--harness",
                          str(tmp_path / "h.py")], capture_output=True, text=True, env={"PYTHONPATH": str(fake)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    return out.stderr.strip()


def test_the_ab_harness_times_each_quack_candidate_twice_under_two_labels():
    ab = bench_module("quack_policy_ab")
    seen = []

    def candidates(Q, name, inputs, graphed, notes):
        seen.append(Q)
        return [("quack", Q.fn, None), ("quack-chunked-mean", Q.fn, "check")]

    quack, variant = types.SimpleNamespace(fn=lambda: 1), types.SimpleNamespace(fn=lambda: 2)
    out = ab.doubled(candidates, variant)(quack, "xent", {}, None, [])
    assert seen == [quack, variant]
    assert [fn() for _, fn, _ in out] == [1, 1, 2, 2]
    assert [label for label, _, _ in out] == ["quack", "quack-chunked-mean", "quack-evn", "quack-evn-chunked-mean"]
    assert out[3][2] == "check"
