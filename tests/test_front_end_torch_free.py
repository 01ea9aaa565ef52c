"""The front-end commands never import torch (it costs seconds per `epic check`): run in a fresh
interpreter, since this test process has torch loaded already."""
import json
import subprocess
import sys

from .conftest import ROOT, SAMPLES

PRENORM = str(ROOT / "samples" / "prenorm_mlp.epi")

SCRIPT = """
import contextlib, io, json, sys
from epic_cli.main import main
codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


def _run(commands):
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_front_end_commands_do_not_import_torch(tmp_path):
    commands = [["check", *map(str, SAMPLES)],
                ["ir", PRENORM], ["ir", PRENORM, "--json"], ["ir", PRENORM, "--dot"],
                ["ir", PRENORM, "--after-all", "--rules"], ["ir", "--list-passes"],
                ["plan", PRENORM, "--shape", "M=8192,D=4096,F=14336"],
                ["plan", PRENORM, "--shape", "M=8192,D=4096,F=14336", "--tuned", "--db", str(tmp_path / "db.json")],
                ["ops"], ["ops", "--markdown"]]
    commands += [["compile", str(s), "-o", str(tmp_path / s.stem)] for s in SAMPLES]
    result = _run(commands)
    assert result["codes"] == [0] * len(commands)
    assert not result["torch"]


def test_the_probe_sees_torch_where_it_is_needed():
    """The same probe reports torch once a command runs tensors (so the test above can fail)."""
    result = _run([["ref", PRENORM, "--shape", "M=16,D=64,F=32"]])
    assert result["codes"] == [0] and result["torch"]
