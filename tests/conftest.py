import pathlib

import pytest

from epic import pipeline
from epic.diagnostics import EpicError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "samples").glob("*.epi"))


def analyze(text: str, **kw):
    return pipeline.analyze(text, name="t.epi", **kw)


def diagnose(text: str, **kw) -> EpicError:
    """The EpicError a program raises (fails the test if it compiles)."""
    with pytest.raises(EpicError) as info:
        analyze(text, **kw)
    return info.value
