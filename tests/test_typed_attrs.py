"""Op attributes are declared on the records and checked by the typed constructor (ir.core.make) and
the IR verifier: an unknown, missing or mistyped attribute is an internal error (E599), not a
KeyError somewhere later."""
import re
from fractions import Fraction

import pytest

from epic import pipeline
from epic.dtypes import BF16, F32
from epic.ir import primitives as P
from epic.ir.core import Value, const, make
from epic.ir.verify import problems
from epic.shapes import TILE, Dim

from .conftest import ROOT, SAMPLES

X = make("load", (), {"tensor": "x", "dtype": BF16, "shape": TILE})


@pytest.mark.parametrize("op, args, attrs, why", [
    ("reduce", (X,), {"axis": "row"}, "needs the attribute 'fn'"),
    ("reduce", (X,), {"axis": "diagonal", "fn": "sum"}, "'axis' must be one of row, col"),
    ("reduce", (X,), {"axis": "row", "fn": "median"}, "'fn' must be a reduction function"),
    ("reduce", (X,), {"axis": "row", "fn": "sum", "block": 32}, "reduce has no attribute 'block'"),
    ("block_reduce", (X,), {"fn": "max", "block": 0}, "'block' must be a positive integer"),
    ("powi", (X,), {"exp": 2.5}, "'exp' must be an integer from -64 to 64"),
    ("powi", (X,), {"exp": True}, "'exp' must be an integer"),
    ("cast", (X,), {"to": "bf16"}, "'to' must be a DType"),
    ("exp", (X,), {"fn": "sum"}, "exp has no attribute 'fn'"),
    ("load", (), {"tensor": "x", "dtype": BF16}, "needs the attribute 'shape'"),
    ("dim", (), {"dim": "D"}, "'dim' must be a Dim"),
])
def test_bad_attributes_are_refused_where_the_value_is_made(op, args, attrs, why):
    with pytest.raises(P.TypeRuleError) as e:
        make(op, args, attrs)
    assert e.value.code == "E599" and why in e.value.message


def test_good_attributes_pass():
    make("reduce", (X,), {"axis": "col", "fn": "lse"})
    make("block_reduce", (X,), {"fn": "amax", "block": 64})
    make("load", (), {"tensor": "g", "dtype": BF16, "shape": TILE, "period": Dim.of("Dh")})
    make("combine", (), {"axis": "row", "fn": "sum", "buffer": "b", "width": Dim.of("N"), "of_width": Fraction(1, 2)})
    const(2.5, F32)


def test_the_verifier_reports_a_value_built_around_the_constructor():
    program = pipeline.analyze(str(SAMPLES[0])).program
    k = program.kernels[0]
    bad = Value("reduce", (k.values[0],), {"axis": "row", "fun": "sum"}, F32, k.values[0].shape)
    k.values.append(bad)
    assert any("no attribute 'fun'" in p for p in problems(program))


def test_every_record_declares_what_its_values_carry():
    """Every attribute any sample's values carry after every pass is declared on its record."""
    for path in SAMPLES:
        for stage in pipeline.analyze(str(path)).stages:
            for k in stage.program.kernels:
                for v in k.values:
                    assert P.attribute_problem(v.op, v.attrs) is None, (path, stage.name, v)


# a read of an attribute by name: v.attrs["fn"], attrs.get('block', ...), "period" in v.attrs
ATTR_READ = re.compile(r"""attrs(?:\[|\.get\(|\.pop\(|\.setdefault\()\s*["'](\w+)["']|["'](\w+)["']\s+(?:not\s+)?in\s+[\w.]*attrs\b""")


def _attribute_reads(text: str) -> list[str]:
    return [m.group(1) or m.group(2) for m in ATTR_READ.finditer(text)]


def test_every_attribute_the_code_reads_by_name_is_declared_on_a_record():
    """A misspelled attribute name in a read (attrs["axes"]) would be a KeyError or a silent default
    at run time; here it fails at once."""
    declared = {k.rstrip(P.OPTIONAL) for p in P.PRIMITIVES.values() for k in p.attrs}
    found = []
    for path in sorted((ROOT / "epic").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{i}: '{a}'" for a in _attribute_reads(line) if a not in declared]
    assert not found, "attributes no record declares:\n" + "\n".join(found)


def test_the_attribute_read_detector_sees_each_form():
    assert _attribute_reads('r = P.reduction(v.attrs["fn"])') == ["fn"]
    assert _attribute_reads("b = w.attrs.get('block', 1)") == ["block"]
    assert _attribute_reads('if "period" in v.attrs:') == ["period"]
    assert _attribute_reads('if "axes" not in x.attrs and y') == ["axes"]
    assert _attribute_reads("v.attrs[P.prim(v.op).reads]") == []
