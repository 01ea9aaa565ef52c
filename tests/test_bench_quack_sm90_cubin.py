"""bench/quack_sm90_cubin.py where QuACK and the CUTLASS DSL are not installed (CI): its usage errors and
the missing packages are said in one line, not a traceback."""
import subprocess
import sys

from .conftest import ROOT


def test_the_quack_compile_script_says_what_is_missing_instead_of_a_traceback(tmp_path):
    script = str(ROOT / "bench" / "quack_sm90_cubin.py")
    out = subprocess.run([sys.executable, script, "--out", str(tmp_path / "q"), "--tile", "128"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--tile and --cluster take two numbers" in out.stderr
    # -S: no site-packages, so the DSL is missing wherever the test runs
    out = subprocess.run([sys.executable, "-S", script, "--out", str(tmp_path / "q")], capture_output=True, text=True)
    assert out.returncode == 2 and "install QuACK and the CUTLASS DSL" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "q").exists()
