"""The front-end commands never import torch (it costs seconds per `epic check`): run in a fresh
interpreter, since this test process has torch loaded already."""
import json
import subprocess
import sys

from .conftest import ROOT, SAMPLES

PRENORM = str(ROOT / "samples" / "prenorm_mlp.epi")

# runs the commands in turn; reports each one's exit code and whether torch is loaded after it
SCRIPT = """
import contextlib, io, json, sys
from epic_cli.main import main
codes, loaded = [], []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        codes.append(main(argv))
    loaded.append("torch" in sys.modules)
print(json.dumps({"codes": codes, "torch": loaded}))
"""


def test_front_end_commands_do_not_import_torch(tmp_path):
    front_end = [["check", str(s)] for s in SAMPLES]
    front_end += [["ir", PRENORM], ["ir", PRENORM, "--json"], ["ir", PRENORM, "--dot"],
                  ["ir", PRENORM, "--after-all", "--rules"], ["ir", "--list-passes"],
                  ["plan", PRENORM, "--shape", "M=8192,D=4096,F=14336"],
                  ["plan", PRENORM, "--shape", "M=8192,D=4096,F=14336", "--tuned", "--db", str(tmp_path / "db.json")],
                  ["ops"], ["ops", "--markdown"]]
    front_end += [["compile", str(s), "-o", str(tmp_path / s.stem)] for s in SAMPLES]
    needs_torch = [["ref", PRENORM, "--shape", "M=16,D=64,F=32"]]     # the control: the probe sees torch
    commands = front_end + needs_torch
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["codes"] == [0] * len(commands), r.stderr
    first = next((" ".join(c) for c, loaded in zip(commands, result["torch"]) if loaded), None)
    assert first == " ".join(needs_torch[0]), f"`epic {first}` imported torch (a module-level `import torch`?)"
