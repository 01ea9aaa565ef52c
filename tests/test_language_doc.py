"""docs/LANGUAGE.md names everything a program may spell: every prelude definition with its
parameters, every other spelling of a type (epic/dtypes.py's ALIASES), and every kernel option with
its values (epic/ir/options.py)."""
import re

from epic import dtypes

from .conftest import ROOT

DOC = (ROOT / "docs" / "LANGUAGE.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(title)
    end = DOC.find("\n## ", start + len(title))
    return DOC[start:end if end >= 0 else len(DOC)]


def test_every_prelude_definition_is_in_the_prelude_table():
    prelude = (ROOT / "epic" / "prelude.epi").read_text()
    defs = [(name, ", ".join(p.strip() for p in params.split(",")) if params.strip() else "")
            for name, params in re.findall(r"^def\s+(\w+)\s*\(([^)]*)\)", prelude, re.M)]
    assert len(defs) >= 20
    table = _section("**Prelude**")
    documented = re.findall(r"^\| `(\w+)\(([^)]*)\)` \|", table, re.M)
    missing = [f"{n}({p})" for n, p in defs if (n, p) not in documented]
    assert not missing, (f"docs/LANGUAGE.md's prelude table lacks (or gives other parameters for) {missing}: "
                         "add a row `| `name(params)` | meaning |` for each")
    stale = [f"{n}({p})" for n, p in documented if (n, p) not in defs]
    assert not stale, f"docs/LANGUAGE.md's prelude table names definitions epic/prelude.epi lacks: {stale}"


def test_every_type_alias_is_documented_with_its_type():
    rows = re.findall(r"^\| `(\w+)` \| (`[^|]*`) \|$", _section("## Types"), re.M)
    documented = {t: set(re.findall(r"`(\w+)`", spellings)) for t, spellings in rows}
    expected: dict[str, set] = {}
    for alias, dt in dtypes.ALIASES.items():
        expected.setdefault(dt.name, set()).add(alias)
    assert documented == expected, "docs/LANGUAGE.md's table of other type spellings differs from dtypes.ALIASES"


def test_every_kernel_option_is_in_the_options_table_with_its_values():
    from epic.ir import options as vocab
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", _section("## Kernel options"), re.M))
    assert set(rows) == set(vocab.ALL_OPTIONS), (
        f"docs/LANGUAGE.md's kernel options table names {sorted(rows)}, epic/ir/options.py {sorted(vocab.ALL_OPTIONS)}")
    choices = {**vocab.CHOICE_OPTIONS, **vocab.SEMANTIC_OPTIONS}
    for key, values in choices.items():
        listed = {v.strip() for v in rows[key].split(",")}
        assert listed == {str(v) for v in values}, f"'{key}' lists {sorted(listed)}, epic/ir/options.py accepts {list(values)}"
