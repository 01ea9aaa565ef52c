"""bench/results/INDEX.md has one line per result file, and every line names a file that exists,
so the index cannot drift from the folder (docs cite results by file name)."""
import re
from collections import Counter

from .conftest import ROOT

RESULTS = ROOT / "bench" / "results"
INDEX = RESULTS / "INDEX.md"


def indexed_names(text: str) -> list[str]:
    """The file column of the index's table rows (the header and its rule excluded)."""
    rows = re.findall(r"^\|\s*([^|]+?)\s*\|\s*[^|\n]*\S[^|\n]*\|\s*$", text, re.M)
    return [r for r in rows if r != "file" and not set(r) <= set("-: ")]


def test_index_rows_parse_a_table():
    text = "| file | what |\n|---|---|\n| a.json | x |\n| b.log | y |\n| c.txt |  |\n"
    assert indexed_names(text) == ["a.json", "b.log"]       # a row with no description does not count


def test_every_result_file_has_exactly_one_line():
    names = indexed_names(INDEX.read_text())
    files = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "INDEX.md"}
    missing = sorted(files - set(names))
    assert not missing, f"bench/results/INDEX.md has no line for {missing}"
    twice = sorted(n for n, c in Counter(names).items() if c > 1)
    assert not twice, f"bench/results/INDEX.md lists {twice} more than once"


def test_every_line_names_an_existing_file():
    stale = sorted(n for n in indexed_names(INDEX.read_text()) if not (RESULTS / n).is_file())
    assert not stale, f"bench/results/INDEX.md names files that are not in bench/results/: {stale}"
