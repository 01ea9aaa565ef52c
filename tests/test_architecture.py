"""The structure the code must keep (read from the source, nothing imported):

- layers: no module imports a module of a higher layer (data flows one way: the IR definitions,
  the front end that produces them, checks, the interpreter, passes, the plan, code generation,
  the runtime, the command line);
- one record per primitive: no code outside the records (epic/ir/primitives.py) and the node
  registry (epic/codegen/nodes/) tests op names as strings;
- docs/LANGUAGE.md's table of primitives is the one the records make (`epic ops --markdown`);
- every subpackage is listed in pyproject.toml, so it ships.
"""
import ast
import pathlib
import re

import pytest

from .conftest import ROOT

# layer of each module (by dotted prefix; the longest prefix wins), lowest first
LAYERS = [
    ("epic.diagnostics", 0), ("epic.dtypes", 0), ("epic.shapes", 0), ("epic.layouts", 0), ("epic.trampoline", 0),
    ("epic.envflags", 0), ("epic.version", 0), ("epic.lazy", 0),
    ("epic.ir", 1), ("epic.sizes", 1),
    ("epic.frontend", 2),
    ("epic.checks", 3),
    ("epic.reference", 4),
    ("epic.passes", 5),
    ("epic.pipeline", 6),
    ("epic.plan", 7),
    ("epic.codegen", 8),
    ("epic.runtime", 9), ("epic.weights", 9), ("epic.distributed", 9),
    ("epic.tuning", 10),
    ("epic", 10),
    ("epic_cli", 11),
]


def _layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def _modules():
    for base, package in ((ROOT / "epic", "epic"), (ROOT / "cli", "epic_cli")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [package, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(module: str, path: pathlib.Path) -> list[str]:
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out += [f"{target}.{a.name}" if not node.module or node.level else target for a in node.names]
    return [m for m in out if m.split(".")[0] in ("epic", "epic_cli")]


def test_no_module_imports_a_higher_layer():
    wrong = []
    for module, path in _modules():
        for target in _imports(module, path):
            if _layer(target) > _layer(module):
                wrong.append(f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})")
    assert not wrong, "\n".join(wrong)


def _import_graph() -> dict[str, set[str]]:
    """module -> the epic modules it imports (anywhere in it, a function's body too); an imported name
    counts as the module that holds it, and a package as its __init__ (so its re-exports count)."""
    paths = dict(_modules())
    graph = {}
    for module, path in paths.items():
        graph[module] = set()
        for target in _imports(module, path):
            holders = [m for m in paths if target == m or target.startswith(m + ".")]
            if holders:
                graph[module].add(max(holders, key=len))
        graph[module].discard(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_loop():
    """Modules that import each other (directly or round a ring) cannot be read, tested or moved one
    at a time; a loop Python tolerates only because one side imports late is still one."""
    loops = _cycles(_import_graph())
    assert not loops, "\n".join(" <-> ".join(c) for c in loops)


def test_the_loop_finder_sees_loops():
    """The search above must find a ring of three and a pair (or the test above proves nothing)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# an op name compared as a string: v.op == "add", v.op in ("even", "odd"), "acc" == v.op, op == "mul"
OP_STRING_TEST = re.compile(r"""\.op\s*(==|!=)\s*["']|\.op\s+(not\s+)?in\s*[(\[{]\s*["']|["']\w+["']\s*(==|!=)\s*\w+\.op\b"""
                            r"""|\bop\s*(==|!=)\s*["']\w+["']|\bop\s+(not\s+)?in\s*[(\[{]\s*["']""")
ALLOWED = ("epic/ir/primitives.py",)      # only the records name ops


def test_only_records_and_registry_test_op_names():
    found = []
    for _, path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
                  if OP_STRING_TEST.search(line)]
    assert not found, "\n".join(found)


def test_the_detector_sees_op_name_tests():
    """The pattern above must catch the forms it is meant for (or the test above proves nothing)."""
    for line in ['if v.op == "add":', "if v.op in ('even', 'odd'):", 'x = "acc" == v.op', "if op == 'mul':",
                 'elif v.op not in ["load", "const"]:', "if op in {'exp'}:"]:
        assert OP_STRING_TEST.search(line), line
    for line in ["if P.family(v.op) is P.Family.REDUCE:", "if v.op != self.op:", 'if op == "*":']:
        assert not OP_STRING_TEST.search(line), line


def test_language_doc_holds_the_records_table():
    from epic.ir import catalog
    doc = (ROOT / "docs" / "LANGUAGE.md").read_text()
    assert catalog.markdown() in doc, "docs/LANGUAGE.md's primitives table differs from `epic ops --markdown`"


def test_language_doc_lists_every_diagnostic_code():
    from epic import diagnostics
    doc = (ROOT / "docs" / "LANGUAGE.md").read_text()
    missing = [c for c, text in diagnostics.CODES.items() if f"| {c} | {text} |" not in doc]
    assert not missing, f"docs/LANGUAGE.md's diagnostics table lacks {missing}"


def test_every_subpackage_ships():
    """A package directory missing from pyproject's list is left out of the installed package (the
    source tree imports fine, the installed `epic` command does not)."""
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "epic").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
