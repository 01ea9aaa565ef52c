"""torch, imported on first use. Importing torch takes seconds; the front end (`epic check`, `ir`,
`plan`, `ops`, `compile`) never runs tensor code, so modules it loads write
`from ..lazy import torch` instead of `import torch`. Nothing is cached here: every attribute is
read from the real module, so a test that patches torch is seen."""
from __future__ import annotations

import importlib


class LazyModule:
    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


torch = LazyModule("torch")
