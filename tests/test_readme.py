"""What README.md shows works as shown: its error example is what `epic check` prints, and every
`epic.X.Y` it names is reachable after a plain `import epic`."""
import re
import shlex
import subprocess
import sys

from epic_cli.main import main

from .conftest import ROOT

README = (ROOT / "README.md").read_text()


def _error_example() -> tuple[str, str]:
    """The README's code block that starts with `$ epic check`: (command line, what it prints)."""
    blocks = re.findall(r"```\n(\$ epic check [^\n]*)\n(.*?)```", README, re.S)
    assert len(blocks) == 1, "README.md should show one `$ epic check` example"
    return blocks[0]


def test_the_error_example_is_what_epic_prints(monkeypatch, capsys):
    command, shown = _error_example()
    monkeypatch.chdir(ROOT)          # the README's path is relative to the repository
    code = main(shlex.split(command)[2:])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err == shown


def test_every_name_the_readme_uses_resolves_after_import_epic():
    names = sorted(set(re.findall(r"\bepic(?:\.[a-z_][a-z0-9_]*)+", README)))
    assert "epic.weights.interleave_gate_up" in names and "epic.compile" in names
    script = ("import functools, sys, epic\n"
              "for name in sys.argv[1:]:\n"
              "    functools.reduce(getattr, name.split('.')[1:], epic)\n")
    r = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
